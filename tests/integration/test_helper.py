"""The resident helper (`jobns helper`, docs/admin.md "The resident helper"), for real:
the packaged prolog and epilog run as slurmd runs them (tests/slurmd.py) hand it their
jobs, fall back to starting jobns themselves when it does not run, and it takes what
was left while it was away."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, own_mounts
from tests.slurmd import as_slurmd, slurmd_env

pytestmark = pytest.mark.root


def wait_until(what: str, done: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def set_up(box: Sandbox, job: str) -> bool:
    """run.env is final: the job is open to its tasks."""
    try:
        text = (box.state / "jobs" / job / "run.env").read_text()
    except FileNotFoundError:
        return False
    return "closed=" not in text


def gone(box: Sandbox, job: str) -> bool:
    jobs = box.state / "jobs"
    return not (jobs / job).exists() and not (jobs / f"{job}.lock").exists()


def start_helper(box: Sandbox) -> subprocess.Popen[str]:
    proc = box.popen(["helper"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pid_file = box.state / "helper" / "pid"
    wait_until(
        "the helper's pid file",
        lambda: pid_file.exists() and pid_file.read_text().strip() == str(proc.pid),
    )
    return proc


@pytest.fixture
def helper(sandbox: Sandbox) -> Iterator[subprocess.Popen[str]]:
    (sandbox.state / "tasks-wait").touch()  # an enforced node: the prolog returns at once
    proc = start_helper(sandbox)
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


def test_the_prolog_and_epilog_hand_their_jobs_to_the_helper(
    sandbox: Sandbox, users: list[OsUser], helper: subprocess.Popen[str]
) -> None:
    """With the helper stopped, the prolog's request waits in its directory and nothing
    is set up: the prolog handed the job over (it started no jobns). Let go, the helper
    sets the job up; the epilog's request tears it down."""
    alice = users[0]
    requests = sandbox.state / "helper" / "requests"
    helper.send_signal(signal.SIGSTOP)
    r = as_slurmd(sandbox, "setup", "701", alice, comment="jobns: shm capacity=8MiB")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    time.sleep(0.3)
    assert sorted(p.name for p in requests.iterdir()) == ["701.setup"]
    assert not set_up(sandbox, "701")
    helper.send_signal(signal.SIGCONT)
    wait_until("the helper's setup", lambda: set_up(sandbox, "701"))
    assert list(requests.iterdir()) == []
    t = sandbox.run(
        ["run", "--job-id", "701", "--", "sh", "-c", "df -B1 --output=size /dev/shm | tail -1"],
        user=alice,
    )
    assert t.returncode == 0 and t.stdout.strip() == str(8 << 20), t.stderr  # the comment's
    r = as_slurmd(sandbox, "teardown", "701", alice)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    wait_until("the helper's teardown", lambda: gone(sandbox, "701"))
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []
    assert helper.poll() is None  # still serving


def test_without_the_helper_the_scripts_start_jobns_and_it_takes_what_was_left(
    sandbox: Sandbox, users: list[OsUser], helper: subprocess.Popen[str]
) -> None:
    """SIGTERM: the helper removes its pid file, and the scripts start jobns themselves.
    A request written while it was away (a script that found it alive an instant before
    it stopped) is taken when it starts again."""
    alice = users[0]
    helper.terminate()
    assert helper.wait(timeout=10) == 0
    assert not (sandbox.state / "helper" / "pid").exists()
    assert as_slurmd(sandbox, "setup", "702", alice).returncode == 0
    wait_until("setup without the helper", lambda: set_up(sandbox, "702"))
    assert as_slurmd(sandbox, "teardown", "702", alice).returncode == 0
    wait_until("teardown without the helper", lambda: gone(sandbox, "702"))

    env = slurmd_env("703", alice)
    body = b"".join(f"{k}={v}\0".encode() for k, v in env.items()) + b"JOBNS_END=1\0"
    left = sandbox.state / "helper" / "requests" / "703.setup"
    left.write_bytes(body)
    (sandbox.state / "jobs" / "703.setup").write_text("0\n")  # the prolog's mark, first
    (sandbox.state / "helper" / "requests" / "704.setup").write_bytes(b"SLURM_JOB_ID=9\0")
    (sandbox.state / "helper" / "requests" / "junk").write_bytes(b"x")
    again = start_helper(sandbox)
    try:
        wait_until("the left request", lambda: set_up(sandbox, "703"))
        wait_until("junk removed", lambda: not (left.parent / "junk").exists())
        # 704 is unfinished (no JOBNS_END): it waits for the rest and its doorbell
        assert (left.parent / "704.setup").exists() and again.poll() is None
        (left.parent / "704.setup").unlink()
        assert as_slurmd(sandbox, "teardown", "703", alice).returncode == 0
        wait_until("teardown of the left job", lambda: gone(sandbox, "703"))
    finally:
        again.terminate()
        again.wait(timeout=10)
    assert sandbox.leftovers() == [] and own_mounts(sandbox) == []


def test_a_user_can_neither_hand_the_helper_a_job_nor_ring_it(
    sandbox: Sandbox, users: list[OsUser], helper: subprocess.Popen[str]
) -> None:
    """bob, a second user: the helper's directory is root's, 0700."""
    bob = users[1]
    top = sandbox.state / "helper"
    assert (top.stat().st_mode & 0o777) == 0o700 and top.stat().st_uid == 0
    for target in (top / "requests" / "1.setup", top / "doorbell"):
        r = subprocess.run(
            ["/bin/sh", "-c", f"printf x >> {target}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            **sandbox.creds(bob),
        )
        assert r.returncode != 0 and "Permission denied" in r.stderr, (target, r.stderr)
    assert not Path(top / "requests" / "1.setup").exists()
    assert helper.poll() is None and os.path.exists(top / "pid")


def test_a_setup_and_its_epilogs_teardown_in_one_scan_leave_nothing_set_up(
    sandbox: Sandbox, users: list[OsUser], helper: subprocess.Popen[str]
) -> None:
    """Issue 30, finding 1 with the helper busy: each job's prolog and epilog hand their
    requests over while the helper is stopped, so it takes both in one scan and forks
    them together. The job's lock and the prolog's mark order them, not the forks: no
    job is left set up after its epilog (before: 3 of 5 were)."""
    alice = users[0]
    helper.send_signal(signal.SIGSTOP)
    jobs = [str(n) for n in range(720, 725)]
    for job in jobs:
        for verb in ("setup", "teardown"):
            r = as_slurmd(sandbox, verb, job, alice, comment="jobns: shm capacity=1MiB")
            assert r.returncode == 0 and r.stderr == "", r.stderr
    requests = sandbox.state / "helper" / "requests"
    assert len(list(requests.iterdir())) == 2 * len(jobs)
    helper.send_signal(signal.SIGCONT)
    wait_until("every request taken", lambda: not any(requests.iterdir()))
    wait_until("every job gone", lambda: all(gone(sandbox, job) for job in jobs))
    time.sleep(0.5)  # a late setup would have set a job up again by now
    assert [j for j in jobs if (sandbox.state / "jobs" / j).exists()] == []
    assert own_mounts(sandbox) == []
    assert sorted(os.listdir(sandbox.state / "jobs")) == []


def test_a_request_whose_fork_fails_stays_for_the_next_scan(
    sandbox: Sandbox, users: list[OsUser], helper: subprocess.Popen[str]
) -> None:
    """The helper takes a request only once the job's child exists. A real fork failure:
    the helper alone in a pids cgroup whose limit it already reaches (EAGAIN); the
    request stays, and once the limit is lifted the next scan sets the job up."""
    alice = users[0]
    group = Path(f"/sys/fs/cgroup/pids/jobns-test-{os.getpid()}")
    if not Path("/sys/fs/cgroup/pids").is_dir():
        pytest.skip("no pids cgroup controller (cgroup v1 pids) on this machine")
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(helper.pid))
        (group / "pids.max").write_text("1")
        r = as_slurmd(sandbox, "setup", "730", alice)
        assert r.returncode == 0, r.stderr
        request = sandbox.state / "helper" / "requests" / "730.setup"
        time.sleep(0.5)
        assert request.exists() and not set_up(sandbox, "730")
        (group / "pids.max").write_text("max")
        wait_until("the next scan's setup", lambda: set_up(sandbox, "730"), timeout=20)
        assert not request.exists()
    finally:
        (Path("/sys/fs/cgroup/pids") / "cgroup.procs").write_text(str(helper.pid))
        group.rmdir()
    assert as_slurmd(sandbox, "teardown", "730", alice).returncode == 0
    wait_until("teardown", lambda: gone(sandbox, "730"))
