"""jobns on a real Slurm 22.05 cluster (ci/start-slurm --jobns): Prolog=jobns setup,
Epilog=jobns teardown, tasks wrapped as `srun jobns run -- ...`, jobs submitted by an
ordinary user exactly as users do."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import OsUser, require, require_root

pytestmark = pytest.mark.slurm

CONFIG = Path("/etc/jobns/jobns.toml")
WORK = Path("/var/lib/jobns-e2e")
STATE = Path("/run/jobns/jobs")
JOBNS = "/opt/jobns/venv/bin/jobns"


def slurm_with_jobns() -> bool:
    r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False)
    return r.returncode == 0 and "/etc/jobns/slurm/prolog" in r.stdout


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    require_root()
    require(
        shutil.which("sbatch") is not None and slurm_with_jobns(),
        "Slurm with the jobns prolog/epilog is not running (ci/start-slurm --jobns)",
    )
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "shared").mkdir(parents=True)
    (WORK / "work").mkdir()
    (WORK / "work").chmod(0o1777)
    try:
        with site_config(f'shared_base = "{WORK}/shared"\nkill_wait = 2\n'):
            yield WORK / "work"
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


@contextmanager
def site_config(text: str) -> Iterator[None]:
    """The cluster's jobns.toml is text while this lasts, then what it was."""
    saved = CONFIG.read_bytes() if CONFIG.exists() else None
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(text)
    try:
        yield
    finally:
        if saved is None:
            CONFIG.unlink()
        else:
            CONFIG.write_bytes(saved)


def sbatch(user: OsUser, work: Path, script: str, *opts: str, wait: bool = True) -> str:
    """Submit as the user (su, like a login shell would); returns the job id."""
    path = work / f"job-{time.monotonic_ns()}.sh"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    args = [
        "sbatch",
        "--parsable",
        f"--chdir={work}",
        f"--output={work}/slurm-%j.out",
        *opts,
        *(["--wait"] if wait else []),
        str(path),
    ]
    r = subprocess.run(
        ["su", user.name, "-c", " ".join(f"'{a}'" for a in args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.stdout.strip(), r.stderr
    job_id = r.stdout.strip().splitlines()[0].split(";")[0]
    if wait:
        assert r.returncode == 0, (r.stderr, output(work, job_id))
    return job_id


def output(work: Path, job_id: str) -> str:
    p = work / f"slurm-{job_id}.out"
    return p.read_text() if p.exists() else ""


def wait_gone(job_id: str, timeout: float = 60) -> None:
    """Until Slurm forgot the job and the epilog's teardown (it goes on after the epilog
    returns) removed every trace of it, its lock last."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-j", job_id], capture_output=True, text=True, check=False
        )
        if (
            not q.stdout.strip()
            and not (STATE / job_id).exists()
            and not (STATE / f"{job_id}.lock").exists()
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still present after {timeout}s")


def assert_no_trace(job_id: str) -> None:
    wait_gone(job_id)
    assert not Path(f"/tmp/job-{job_id}").exists()
    assert not Path(f"/dev/shm/job-{job_id}").exists()
    assert not (STATE / job_id).exists() and not (STATE / f"{job_id}.lock").exists()
    with open("/proc/self/mountinfo") as f:
        assert f"/jobs/{job_id}/" not in f.read()


def test_two_steps_share_tmp_and_dev_shm(cluster: Path, users: list[OsUser]) -> None:
    alice = users[0]
    script = (
        f"srun {JOBNS} run -- sh -c 'echo from-step-0 > /tmp/f; echo seg > /dev/shm/s; "
        "id -u; readlink /proc/self/ns/mnt'\n"
        f"srun {JOBNS} run -- sh -c 'cat /tmp/f /dev/shm/s; readlink /proc/self/ns/mnt; "
        "echo $TMPDIR $PMIX_SERVER_TMPDIR $(stat -c %u:%a $PMIX_SERVER_TMPDIR)'\n"
    )
    job_id = sbatch(alice, cluster, script)
    out = output(cluster, job_id).split()
    assert out[0] == str(alice.uid)  # slurmstepd ran the task as the job user
    assert out[2:4] == ["from-step-0", "seg"]
    assert out[1] == out[4]  # both steps in one mount namespace
    assert out[5:8] == ["/tmp", "/tmp/pmix", f"{alice.uid}:700"]
    assert_no_trace(job_id)


def test_concurrent_jobs_do_not_see_each_other(cluster: Path, users: list[OsUser]) -> None:
    alice, bob = users
    gate = cluster / "gate"
    first = sbatch(
        alice,
        cluster,
        f"srun {JOBNS} run -- sh -c 'touch /tmp/alices; touch {cluster}/a.ready; "
        f"while [ ! -e {gate} ]; do sleep 0.1; done; ls /tmp'\n",
        wait=False,
    )
    deadline = time.monotonic() + 120
    while not (cluster / "a.ready").exists():
        assert time.monotonic() < deadline, output(cluster, first)
        time.sleep(0.1)
    second = sbatch(bob, cluster, f"srun {JOBNS} run -- ls -A /tmp\n")
    assert output(cluster, second).split() == ["pmix"]
    gate.touch()
    wait_gone(first)
    assert "alices" in output(cluster, first).split()
    assert_no_trace(first)
    assert_no_trace(second)


def test_per_node_shared_tmpdir_through_the_job_comment(cluster: Path, users: list[OsUser]) -> None:
    alice = users[0]
    host = os.uname().nodename.split(".")[0]
    job_id = sbatch(
        alice,
        cluster,
        f"srun {JOBNS} run -- sh -c 'echo kept > /tmp/result'\n",
        "--comment=jobns: shared_tmpdir=per-node; no_rm_tmpdir",
    )
    wait_gone(job_id)
    kept = WORK / "shared" / f"job-{job_id}" / host / "tmp" / "result"
    assert kept.read_text() == "kept\n"
    assert kept.stat().st_uid == alice.uid
    assert_no_trace(job_id)


def test_scancel_cleans_up_a_task_ignoring_sigterm(cluster: Path, users: list[OsUser]) -> None:
    alice = users[0]
    pidfile = cluster / "pids"
    script = (
        f"srun {JOBNS} run -- sh -c \"trap '' TERM; setsid sh -c 'trap \\\"\\\" TERM; "
        f"echo \\$\\$ >> {pidfile}; exec sleep 600' & echo \\$\\$ >> {pidfile}; "
        'while :; do sleep 0.2; done"\n'
    )
    job_id = sbatch(alice, cluster, script, wait=False)
    deadline = time.monotonic() + 120
    while not pidfile.exists() or len(pidfile.read_text().split()) < 2:
        assert time.monotonic() < deadline, output(cluster, job_id)
        time.sleep(0.1)
    pids = [int(p) for p in pidfile.read_text().split()]
    subprocess.run(["scancel", job_id], check=True)
    assert_no_trace(job_id)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in pids):
        assert time.monotonic() < deadline, f"task processes survived scancel: {pids}"
        time.sleep(0.1)
