"""Attacks through what jobns reads from Slurm (issue 20): the job's --tmp size with
`[capacity] tmp_from_slurm = "scontrol"`, asked of the real controller (Slurm 22.05 on
this host, ci/start-slurm) about a job bob really submitted with sbatch.

`scontrol show job -o` prints JobName= (text bob chose) before MinTmpDiskNode= on the
same line: a name holding `MinTmpDiskNode=inf` crashed the prolog (exit 125, which
drains a Slurm node), `MinTmpDiskNode=900G` replaced his real request with any size.
The job is submitted held, so it never runs: the prolog is `jobns setup` of this test,
run as root against the real job id exactly as slurmd runs it (the installed prolog
of the host runs /opt/jobns/venv, not the copy under test)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import OsUser, require
from tests.security.conftest import MIB, World, no_crash

pytestmark = [pytest.mark.root, pytest.mark.slurm]


def slurm_up() -> bool:
    if shutil.which("sbatch") is None:
        return False
    r = subprocess.run(["squeue", "-h"], capture_output=True, text=True, check=False, timeout=30)
    return r.returncode == 0


@pytest.fixture
def slurm_jobs(world: World) -> Iterator[list[str]]:
    """The ids of the jobs a test submits, cancelled when it ends."""
    require(slurm_up(), "Slurm's controller is not running (ci/start-slurm --jobns)")
    jobs: list[str] = []
    try:
        yield jobs
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], capture_output=True, check=False, timeout=30)


def sbatch_held(world: World, user: OsUser, jobs: list[str], *opts: str) -> str:
    """user submits a held job (it never runs) as users do; its id."""
    args = ["sbatch", "--parsable", "--hold", "--chdir=/", "--output=/dev/null", *opts]
    r = world.as_user(user, [*args, "--wrap", "true"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    job = r.stdout.strip().split(";")[0]
    jobs.append(job)
    return job


def tmp_capacity(world: World, job: str) -> int | None:
    """The size of the capacity tmpfs on the job's local tree, or None without one."""
    tree = world.box.local / f"job-{job}"
    if not os.path.ismount(tree):
        return None
    st = os.statvfs(tree)
    return st.f_blocks * st.f_frsize


@pytest.mark.parametrize(
    ("name", "tmp", "expected"),
    [
        ("x MinTmpDiskNode=inf", "1M", 1 * MIB),
        ("x MinTmpDiskNode=nan", "3", 3 * MIB),
        ("x MinTmpDiskNode=900G", "2M", 2 * MIB),
        ("x MinTmpDiskNode=900G MinTmpDiskNode=-1", None, None),
        ("MinTmpDiskNode=1e30 JobId=1 MinTmpDiskNode=9P", "1536", 1536 * MIB),
    ],
)
def test_job_name_cannot_shadow_the_tmp_request(
    world: World, slurm_jobs: list[str], name: str, tmp: str | None, expected: int | None
) -> None:
    """Attack: bob names his job (sbatch -J) with a forged `MinTmpDiskNode=` word, and
    puts another in his job comment. Defence: setup exits 0 without a crash and his job
    gets exactly the --tmp he asked for (none without --tmp), read from a squeue answer
    that holds no text of his; teardown leaves nothing."""
    world.box.write_config('[capacity]\ntmp_from_slurm = "scontrol"\n')
    opts = ["-J", name, "--comment", "MinTmpDiskNode=900G", *([f"--tmp={tmp}"] if tmp else [])]
    job = sbatch_held(world, world.bob, slurm_jobs, *opts)
    r = world.setup(job, user=world.bob)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr  # the real answer was read, not guessed
    assert tmp_capacity(world, job) == expected
    assert world.run(job, "df -k /tmp >/dev/null", user=world.bob).returncode == 0
    assert world.teardown(job).returncode == 0
    world.assert_clean()


def test_a_job_squeue_does_not_know_gets_no_size_and_a_warning(
    world: World, slurm_jobs: list[str]
) -> None:
    """A job id the controller does not know (a prolog run by hand, a job already gone):
    setup warns once and uses the site default, never fails."""
    world.box.write_config('[capacity]\ntmp_from_slurm = "scontrol"\ntmp_default = "4MiB"\n')
    r = world.setup("987654321", user=world.bob)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and "warning" in r.stderr and "no --tmp size" in r.stderr
    assert tmp_capacity(world, "987654321") == 4 * MIB
    assert world.teardown("987654321").returncode == 0
    world.assert_clean()
