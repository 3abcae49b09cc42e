"""Every feature a user can ask for, with jobns run exactly as slurmd runs it: the
project's own Prolog and Epilog (jobns/slurm/scripts/prolog, epilog), and gc and recover, started
with only the variables slurmd passes (tests/slurmd.py): no PATH.

Security issue 20, finding 2: without PATH, Python searches /bin:/usr/bin only, and
mkfs.ext4 / mkfs.xfs (in /usr/sbin) were "No such file or directory": every disk
capacity failed its prolog (exit 125) and the node drained. Root now finds each program
in a fixed list of system directories and runs it with a fixed environment
(launcher.system.sysprog); the disk-capacity cases here fail on the code before that.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from jobns.launcher.system.sysprog import PATH as ROOTS_PATH
from tests.conftest import OsUser, Sandbox, job_mounts, own_mounts, require
from tests.integration.test_disk_capacity import (
    assert_nothing_left,
    disk_config,
    killed_at,
    loop_mounts,
)
from tests.integration.test_extra_dirs import Dirs, mount_line
from tests.integration.test_staging import INPUTS, Arc, sums, tree_sums
from tests.slurmd import as_slurmd

pytestmark = pytest.mark.root

MI = 1024**2


def prolog(
    box: Sandbox,
    job: str,
    user: OsUser,
    comment: str | None = None,
    env: dict[str, str] | None = None,
) -> None:
    r = as_slurmd(box, "setup", job, user, comment, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def epilog(box: Sandbox, job: str, user: OsUser, env: dict[str, str] | None = None) -> None:
    r = as_slurmd(box, "teardown", job, user, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def task(box: Sandbox, job: str, user: OsUser | None, cmd: str) -> str:
    """A task of the job, as slurmstepd starts it (its environment is the job's, not
    the prolog's; None: root, as with the SPANK plugin)."""
    r = box.run(["run", "--job-id", job, "--", "sh", "-c", cmd], user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout


def fs_of(out: str, target: str) -> tuple[str, int]:
    """(type, size in bytes) of the file system at target, from a task's `stat -f`."""
    m = re.search(rf"^{re.escape(target)} (\S+) (\d+) (\d+)$", out, re.M)
    assert m, out
    return m[1], int(m[2]) * int(m[3])


STATFS = 'for d in /tmp /var/tmp /dev/shm; do stat -f -c "$d %T %b %S" $d; done'


def test_a_plain_job(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    prolog(sandbox, "p1", alice)
    out = task(sandbox, "p1", alice, "echo x > /tmp/f; echo y > /dev/shm/g; cat /tmp/f /dev/shm/g")
    assert out.split() == ["x", "y"]
    assert (sandbox.local / "job-p1" / "tmp" / "f").stat().st_uid == alice.uid
    epilog(sandbox, "p1", alice)
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


def test_tmpfs_capacities_from_the_job_comment(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    prolog(sandbox, "p2", alice, "jobns: tmp capacity=64MiB; shm capacity=32MiB")
    out = task(sandbox, "p2", alice, STATFS)
    assert fs_of(out, "/tmp") == ("tmpfs", 64 * MI)
    assert fs_of(out, "/dev/shm") == ("tmpfs", 32 * MI)
    epilog(sandbox, "p2", alice)
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


@pytest.mark.parametrize(
    ("fstype", "shown", "size"), [("ext4", "ext2/ext3", 256), ("xfs", "xfs", 300)]
)
def test_a_disk_capacity_from_the_job_comment(
    sandbox: Sandbox, users: list[OsUser], fstype: str, shown: str, size: int
) -> None:
    """The finding: mkfs.<type> is in /usr/sbin, which a PATH-less search never sees."""
    alice = users[0]
    base = disk_config(sandbox, f'fs_type = "{fstype}"\n')
    prolog(sandbox, "p3", alice, f"jobns: tmp capacity={size}MiB")
    out = task(sandbox, "p3", alice, STATFS)
    kind, total = fs_of(out, "/tmp")
    assert kind == shown and size * MI * 0.6 < total <= size * MI, out
    assert fs_of(out, "/var/tmp")[0] == shown  # tmp and var_tmp share the image
    (line,) = loop_mounts(sandbox)
    assert "nosuid" in line and "nodev" in line
    epilog(sandbox, "p3", alice)
    assert_nothing_left(sandbox, base)


def test_extra_directories_of_every_backing(sandbox: Sandbox, users: list[OsUser]) -> None:
    """[[dirs]]: a plain directory, a tmpfs and a disk image (mkfs again)."""
    alice = users[0]
    dirs = Dirs(sandbox)
    prolog(sandbox, "p4", alice)
    out = task(sandbox, "p4", alice, "cat /proc/self/mountinfo")
    plain, fast, data = dirs.targets
    assert mount_line(out, plain)[8] != "tmpfs"  # a bind of the plain tree
    assert mount_line(out, fast)[7:9] == ["tmpfs", "jobns-dir-p4"]
    assert mount_line(out, data)[7] == "ext4" and mount_line(out, data)[8].startswith("/dev/loop")
    epilog(sandbox, "p4", alice)
    assert dirs.left() == []


@pytest.mark.parametrize("layout", ["shared", "per-node"])
def test_shared_layouts_from_the_job_comment(
    sandbox: Sandbox, users: list[OsUser], layout: str
) -> None:
    alice = users[0]
    host = os.uname().nodename.split(".")[0]
    value = "" if layout == "shared" else "=per-node"
    prolog(sandbox, "p5", alice, f"jobns: shared_tmpdir{value}; no_rm_tmpdir")
    task(sandbox, "p5", alice, "echo kept > /tmp/result")
    epilog(sandbox, "p5", alice)
    tree = sandbox.shared / "job-p5" / (host if layout == "per-node" else "")
    assert (tree / "tmp" / "result").read_text() == "kept\n"
    assert job_mounts(sandbox) == []


def test_stage_in_and_out_from_the_job_comment(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    stage = sandbox.root / "stage"
    home = stage / alice.name
    home.mkdir(parents=True)
    os.chown(home, alice.uid, alice.gid)
    (home / "in.dat").write_bytes(b"input\n")
    os.chown(home / "in.dat", alice.uid, alice.gid)
    sandbox.write_config(f'[staging]\nstage_roots = ["{stage}"]\n')
    comment = (
        f"jobns: stage_in source={stage}/%u/in.dat destination=/tmp/in.dat; "
        f"stage_out source=/tmp/out.dat destination={stage}/%u/out-%j"
    )
    prolog(sandbox, "p6", alice, comment)
    assert task(sandbox, "p6", alice, "cat /tmp/in.dat; echo output > /tmp/out.dat") == "input\n"
    epilog(sandbox, "p6", alice)
    assert (home / "out-p6").read_bytes() == b"output\n"
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


def test_an_arc_session_moved_by_a_movetool_named_without_a_path(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """[arc] movetool = "cp -a": found by root's fixed list, not by a PATH (the job user
    runs it); the session comes from SLURM_JOB_WORK_DIR, as slurmd passes it."""
    require(shutil.which("cp") is not None, "cp is missing")
    arc = Arc(sandbox, users[0])
    try:
        arc.separate("scratch")  # another file system: the movetool copies
        arc.configure(movetool="cp -a", extra='session_dir = "%d"\n')
        session = arc.session("ARCenv", INPUTS)
        env = {"SLURM_JOB_WORK_DIR": str(session)}
        prolog(sandbox, "p7", arc.user, env=env)
        scratch = arc.scratch / "ARCenv"
        assert tree_sums(scratch)["in/a.dat"] == sums(INPUTS)["in/a.dat"]
        task(sandbox, "p7", arc.user, f"echo out > {scratch}/result")
        epilog(sandbox, "p7", arc.user, env=env)
        assert (session / "result").read_text() == "out\n"
        assert not scratch.exists()
    finally:
        arc.close()


def test_a_refused_job_fails_only_itself(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    r = as_slurmd(sandbox, "setup", "p8", alice, "jobns: tmp capacity=lots")
    assert r.returncode == 0 and "refused" in r.stderr and "lots" in r.stderr, r.stderr
    t = sandbox.run(["run", "--job-id", "p8", "--", "true"], user=alice)
    assert t.returncode == 125 and "refused" in t.stderr, t.stderr
    epilog(sandbox, "p8", alice)
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


def test_tmp_size_from_slurm_through_scontrol(sandbox: Sandbox, users: list[OsUser]) -> None:
    """tmp_from_slurm = "scontrol": the real controller is asked about a real (held) job
    submitted with --tmp, by root's own Slurm command (no PATH to find it by: a stand-in
    earlier on PATH is never run); a directive in the comment still wins."""
    alice = users[0]
    require(
        shutil.which("sbatch") is not None
        and subprocess.run(["scontrol", "ping"], capture_output=True, check=False).returncode == 0,
        "no Slurm controller answers (ci/start-slurm)",
    )
    sub = subprocess.run(
        ["su", alice.name, "-c", "sbatch --parsable --hold --tmp=80M -o /dev/null --wrap true"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    job = sub.stdout.strip().split(";")[0]
    try:
        base = disk_config(sandbox, 'tmp_from_slurm = "scontrol"\n')
        prolog(sandbox, job, alice)
        assert (base / f"jobns-local-{job}.img").stat().st_size == 80 * MI
        epilog(sandbox, job, alice)
        # Stand-ins first on the caller's PATH (as an admin's shell might have): unused.
        fake = sandbox.root / "bin"
        fake.mkdir()
        for name in ("scontrol", "squeue"):
            (fake / name).write_text(
                f"#!/bin/sh\necho JobId={job} {job} {job} 999M MinTmpDiskNode=999M\n"
            )
            (fake / name).chmod(0o755)
        r = sandbox.run(
            ["setup", "--job-id", job, "--user", alice.name], env={"PATH": f"{fake}:/usr/bin:/bin"}
        )
        assert r.returncode == 0, r.stderr
        assert (base / f"jobns-local-{job}.img").stat().st_size == 80 * MI
        epilog(sandbox, job, alice)
        prolog(sandbox, job, alice, "jobns: tmp capacity=64MiB")
        assert (base / f"jobns-local-{job}.img").stat().st_size == 64 * MI
        epilog(sandbox, job, alice)
        assert_nothing_left(sandbox, base)
    finally:
        subprocess.run(["scancel", job], check=False)


def test_an_enforced_job_with_a_disk_capacity(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    base = disk_config(sandbox, "[slurm]\nenforce = true\n")
    prolog(sandbox, "p9", alice, "jobns: tmp capacity=64MiB")
    out = task(sandbox, "p9", None, f"id -u; {STATFS}")  # root joins, then becomes alice
    assert out.split()[0] == str(alice.uid)
    assert fs_of(out, "/tmp")[0] == "ext2/ext3"
    epilog(sandbox, "p9", alice)
    assert_nothing_left(sandbox, base)


def test_pre_and_post_run_programs_get_roots_fixed_environment(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    seen = sandbox.root / "seen"
    seen.mkdir()
    program = f"/bin/sh -c 'env > {seen}/$JOBNS_STATE'"
    sandbox.write_config(f'[lifecycle]\npre_run = "{program}"\npost_run = "{program}"\n')
    prolog(sandbox, "p10", alice)
    epilog(sandbox, "p10", alice)
    for phase in ("pre-run", "post-run"):
        env = dict(ln.split("=", 1) for ln in (seen / phase).read_text().splitlines() if "=" in ln)
        assert env["PATH"] == ROOTS_PATH, env
        assert env["SLURM_JOB_ID"] == "p10" and env["JOBNS_USER"] == alice.name
        assert "HOME" not in env and "LC_ALL" not in env
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


def test_recover_with_no_environment_remakes_a_disk_capacity(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A setup killed once its image existed: recover (from a boot unit or by hand,
    without PATH) makes the file system again."""
    alice = users[0]
    base = disk_config(sandbox)
    args = ["setup", "--job-id", "p11", "--user", alice.name, "--directives", "tmp capacity=64MiB"]
    killed_at(sandbox, args, "image-made")
    r = as_slurmd(sandbox, "recover")
    assert r.returncode == 0 and "set up again: running" in r.stdout, (r.stdout, r.stderr)
    assert fs_of(task(sandbox, "p11", alice, STATFS), "/tmp")[0] == "ext2/ext3"
    epilog(sandbox, "p11", alice)
    assert_nothing_left(sandbox, base)


def test_gc_with_no_environment_removes_a_dead_jobs_disk_capacity(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """gc asks Slurm (squeue, found without PATH) or, without it, the record: a setup
    killed once its image was mounted is dead either way."""
    alice = users[0]
    base = disk_config(sandbox)
    args = ["setup", "--job-id", "970012", "--user", alice.name]
    killed_at(sandbox, [*args, "--directives", "tmp capacity=64MiB"], "mounted")
    assert len(loop_mounts(sandbox)) == 1
    r = as_slurmd(sandbox, "gc")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert_nothing_left(sandbox, base)
