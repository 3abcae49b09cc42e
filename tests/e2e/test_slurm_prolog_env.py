"""A disk capacity under the real Slurm 22.05 (ci/start-slurm --jobns --job-container
none; its Prolog and Epilog are jobns/slurm/scripts/prolog and epilog): security issue
20, finding 2.

slurmd runs the Prolog with only SLURM_* variables, no PATH. jobns ran mkfs.ext4 by name,
Python looked in /bin:/usr/bin only, the prolog failed ("run mkfs.ext4: No such file or
directory", exit 125) and slurmd drained the node: `drained: Prolog error`, for a job an
ordinary user submitted with `--comment 'jobns: tmp capacity=256MiB'`. Here that job runs
in its own file system, and the node stays up. Should it drain anyway (the old code),
the test resumes the node before failing, so the rest of the suite keeps a node."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, require, require_root
from tests.e2e.test_slurm import (
    JOBNS,
    output,
    sbatch,
    site_config,
    slurm_with_jobns,
    wait_gone,
)

pytestmark = pytest.mark.slurm

WORK = Path("/var/lib/jobns-e2e-disk")
MI = 1024**2
DOWN = ("drain", "drng", "drained", "down", "fail", "failg")


def node() -> str:
    r = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def node_state() -> tuple[str, str]:
    """(short state, reason) of this node, as sinfo prints them."""
    r = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node(), "-o", "%t|%E"],
        capture_output=True,
        text=True,
        check=False,
    )
    state, _, reason = r.stdout.strip().partition("|")
    return state.rstrip("*~#!%$@^-"), reason


@pytest.fixture
def disk_cluster() -> Iterator[Path]:
    """The cluster's jobns.toml with disk-backed tmp capacities (restored afterwards)."""
    require_root()
    require(
        shutil.which("sbatch") is not None and slurm_with_jobns(),
        "Slurm with the jobns prolog/epilog is not running (ci/start-slurm --jobns)",
    )
    require(node_state()[0] not in DOWN, f"the node is {node_state()} before the test")
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "work").mkdir(parents=True)
    (WORK / "work").chmod(0o1777)
    text = f'kill_wait = 2\n[capacity]\ntmp_backing = "disk"\nscratch_base = "{WORK}/scratch"\n'
    try:
        with site_config(text):
            yield WORK / "work"
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def run_to_the_end(job_id: str, timeout: float = 120) -> str:
    """Wait until the job left the queue; '' then, or the node's state and reason as
    soon as it is drained or down (the job is cancelled and the node resumed)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            state, reason = node_state()
            if state in DOWN:
                return f"{state}: {reason}"
            q = subprocess.run(
                ["squeue", "-h", "-j", job_id, "-o", "%T"],
                capture_output=True,
                text=True,
                check=False,
            )
            if not q.stdout.strip():
                return ""
            time.sleep(0.2)
        return f"job {job_id} still queued after {timeout} s"
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
        if node_state()[0] in DOWN:
            subprocess.run(
                ["scontrol", "update", f"nodename={node()}", "state=resume"],
                check=False,
                capture_output=True,
            )


def test_a_users_disk_capacity_job_runs_and_the_node_stays_up(
    disk_cluster: Path, users: list[OsUser]
) -> None:
    alice = users[0]
    script = f"srun {JOBNS} run -- sh -c 'id -u; stat -f -c \"%T %b %S\" /tmp /var/tmp'\n"
    job_id = sbatch(alice, disk_cluster, script, "--comment=jobns: tmp capacity=256MiB", wait=False)
    problem = run_to_the_end(job_id)
    assert problem == "", f"the node went {problem} (the prolog failed)"
    out = output(disk_cluster, job_id).split()
    assert out[0] == str(alice.uid), out
    assert out[1] == out[4] == "ext2/ext3", out  # /tmp and /var/tmp: the job's image
    assert 0.6 * 256 * MI < int(out[2]) * int(out[3]) <= 256 * MI, out
    wait_gone(job_id)
    assert node_state()[0] not in DOWN, node_state()
    scratch = WORK / "scratch"
    assert not scratch.exists() or list(scratch.iterdir()) == []  # the image is gone
