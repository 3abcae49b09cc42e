"""The prolog's environment (security issue 20, finding 2; SECURITY.md rule 2).

slurmd runs a Prolog with only SLURM_* variables: no PATH. The old code ran mkfs.ext4
and mkfs.xfs by name, and Python's PATH-less search (/bin:/usr/bin) never finds
/usr/sbin: "run mkfs.ext4: No such file or directory", exit 125, and the node drained
(`drained: Prolog error` under real Slurm). So any ordinary user, asking for what the
site offers in her job comment (`sbatch --comment 'jobns: tmp capacity=256MiB'`), or
running any job on a node with a [[dirs]] disk entry, took the node from everyone.
"""

from __future__ import annotations

import pytest

from tests.conftest import OsUser, Sandbox
from tests.integration.test_disk_capacity import assert_nothing_left, disk_config
from tests.integration.test_extra_dirs import Dirs
from tests.integration.test_prolog_env import STATFS, fs_of, task
from tests.slurmd import as_slurmd

pytestmark = pytest.mark.root


@pytest.mark.parametrize("request_", ["ext4 capacity", "xfs capacity", "[[dirs]] disk"])
def test_her_job_on_a_disk_backed_node_never_fails_the_prolog(
    sandbox: Sandbox, users: list[OsUser], request_: str
) -> None:
    """Attack: alice's job comment asks for a disk capacity (or the site's [[dirs]] has a
    disk entry), and slurmd runs the prolog without PATH. Defence: root finds mkfs in
    its fixed list of system directories (launcher.system.sysprog); the prolog exits 0 and her
    job gets its file system."""
    alice = users[0]
    comment = None
    if request_ == "[[dirs]] disk":
        dirs = Dirs(sandbox)
    else:
        fstype = request_.split()[0]
        base = disk_config(sandbox, f'fs_type = "{fstype}"\n')
        comment = "jobns: tmp capacity=300MiB"
    r = as_slurmd(sandbox, "setup", "e1", alice, comment)
    assert r.returncode == 0, f"the prolog failed (the node would drain): {r.stderr}"
    assert r.stderr == "", r.stderr
    out = task(sandbox, "e1", alice, f"{STATFS}; cat /proc/self/mountinfo")
    if request_ == "[[dirs]] disk":
        assert f" {dirs.targets[2]} " in out and " - ext4 /dev/loop" in out, out
    else:
        assert fs_of(out, "/tmp")[0] == ("xfs" if fstype == "xfs" else "ext2/ext3")
    r = as_slurmd(sandbox, "teardown", "e1", alice)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    if request_ == "[[dirs]] disk":
        assert dirs.left() == []
    else:
        assert_nothing_left(sandbox, base)
