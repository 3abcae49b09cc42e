"""The prolog and epilog that return at once (docs/admin.md "What the prolog and epilog
wait for"): the packaged scripts run as slurmd runs them (tests/slurmd.py), `jobns setup
--background` and `jobns teardown --background`, the requeue markers, and what a failure
of the node's does when nobody reads the exit status."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import OsUser, Sandbox, own_mounts
from tests.slurmd import as_slurmd, background, script, slurmd_env

pytestmark = pytest.mark.root


def task(box: Sandbox, job: str, user: OsUser, cmd: str) -> str:
    r = box.run(["run", "--job-id", job, "--", "sh", "-c", cmd], user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout


def run_env(box: Sandbox, job: str) -> str:
    return (box.state / "jobs" / job / "run.env").read_text()


def assert_clean(box: Sandbox) -> None:
    assert box.leftovers() == [] and own_mounts(box) == []
    assert sorted(os.listdir(box.state / "jobs")) == []


def test_the_epilog_returns_before_its_teardown_ends(sandbox: Sandbox, users: list[OsUser]) -> None:
    """The epilog leaves `jobns teardown --background` running and returns: a job
    process that ignores SIGTERM keeps that teardown busy for kill_wait (2 s here)."""
    alice = users[0]
    assert as_slurmd(sandbox, "setup", "401", alice).returncode == 0
    stubborn = sandbox.popen(
        ["run", "--job-id", "401", "--", "sh", "-c", "trap '' TERM; echo up; sleep 60"],
        user=alice,
        stdout=-1,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline() == "up\n"
    began = time.monotonic()
    r = subprocess.run(
        [str(script(sandbox, "teardown"))],
        env=slurmd_env("401", alice, "epilog_slurmd"),
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    took = time.monotonic() - began
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert took < 1.5, f"the epilog waited {took:.2f} s for its teardown"
    deadline = time.monotonic() + 30
    while background(sandbox, "teardown", "401"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert stubborn.wait(timeout=10) != 0  # ended by the teardown (SIGKILL after kill_wait)
    assert_clean(sandbox)


def test_an_enforced_nodes_prolog_returns_and_setup_finishes_on_its_own(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Where slurmd has the plugin loaded (<state_dir>/tasks-wait), the prolog runs
    setup in the background; the job is whole once run.env is final."""
    alice = users[0]
    (sandbox.state / "tasks-wait").touch()
    try:
        r = as_slurmd(sandbox, "setup", "402", alice)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "closed=" not in run_env(sandbox, "402")  # open to tasks: set up
        assert task(sandbox, "402", alice, "echo hi > /tmp/x; cat /tmp/x") == "hi\n"
        assert as_slurmd(sandbox, "teardown", "402", alice).returncode == 0
        assert_clean(sandbox)
    finally:
        (sandbox.state / "tasks-wait").unlink()


def test_a_background_setup_the_node_fails_refuses_the_job_at_once(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A failing pre-run program is the site's: in the foreground the prolog fails and
    slurmd drains the node. In the background the job is recorded refused with a reason
    that says the node is at fault (its waiting tasks fail at once), and jobns asks
    scontrol to drain the node and requeue the job itself; here the node name is not
    one Slurm knows, so the log says it was not."""
    alice = users[0]
    sandbox.write_config('[lifecycle]\npre_run = "/bin/false"\n')
    mark(sandbox, "403", ".setup", "0")
    r = sandbox.run(
        ["setup", "--background", "--job-id", "403", "--user", alice.name],
        env={"SLURMD_NODENAME": "not a node", "SLURM_JOB_RESTART_COUNT": "0"},
    )
    assert r.returncode == 125, r.stderr
    assert "not drained" in r.stderr and "not requeued" in r.stderr, r.stderr
    t = sandbox.run(["run", "--job-id", "403", "--", "true"], user=alice)
    assert t.returncode == 125
    assert "the node failed to set the job up" in t.stderr and "pre-run" in t.stderr, t.stderr
    assert "not a problem of the job's" in t.stderr, t.stderr
    assert sandbox.run(["teardown", "--job-id", "403"]).returncode == 0
    assert_clean(sandbox)


def mark(box: Sandbox, job: str, suffix: str, run: str, age: float = 0.0) -> None:
    """The mark a packaged script leaves (<id>.setup: the prolog's; <id>.ending: the
    epilog's) naming the run; `age` seconds in the past."""
    (box.state / "jobs").mkdir(mode=0o755, parents=True, exist_ok=True)
    path = box.state / "jobs" / f"{job}{suffix}"
    path.write_text(f"{run}\n")
    if age:
        when = time.time() - age
        os.utime(path, (when, when))


def runs(run: str) -> dict[str, str]:
    return {"SLURM_JOB_RESTART_COUNT": run}


def test_a_requeued_job_is_set_up_anew_before_its_last_teardown_began(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Run 0's epilog has run, its teardown not yet, when run 1's prolog (a requeue)
    sets the job up: setup ends run 0 itself; run 0's late teardown then finds the record
    of a run whose prolog came after its epilog and leaves it alone (CI found a teardown
    that went by the epilog's restart count, which is already the next run's, ending the
    new run)."""
    alice = users[0]
    r = sandbox.run(["setup", "--job-id", "404", "--user", alice.name], env=runs("0"))
    assert r.returncode == 0, r.stderr
    task(sandbox, "404", alice, "echo first-run > /tmp/old")
    # Run 0's epilog (Slurm gives it run 1's count already: it counts the requeue up
    # before it ends the run), then, once the job may start again, run 1's prolog.
    epilog_at = time.time() - 5
    mark(sandbox, "404", ".ending", "1", age=5)
    mark(sandbox, "404", ".setup", "1")
    r = sandbox.run(
        ["setup", "--background", "--job-id", "404", "--user", alice.name], env=runs("1")
    )
    assert r.returncode == 0, r.stderr
    assert task(sandbox, "404", alice, "ls /tmp/old 2>&1; true") != "/tmp/old\n"  # a fresh run
    assert not (sandbox.state / "jobs" / "404.setup").exists()
    late = sandbox.run(
        ["teardown", "--background", "--job-id", "404"],
        env={**runs("1"), "JOBNS_EPILOG_AT": repr(epilog_at)},
    )
    assert late.returncode == 0, late.stderr
    assert not (sandbox.state / "jobs" / "404.ending").exists()
    assert task(sandbox, "404", alice, "echo still > /tmp/y; cat /tmp/y") == "still\n"
    done = sandbox.run(
        ["teardown", "--background", "--job-id", "404"],
        env={**runs("1"), "JOBNS_EPILOG_AT": repr(time.time())},
    )
    assert done.returncode == 0, done.stderr
    assert_clean(sandbox)


def test_an_epilog_whose_teardown_came_first_leaves_nothing_set_up(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A job that ended at once (issue 30, finding 1): its prolog returned, its epilog
    ran, and the teardown got the job's lock before the setup. It takes the prolog's
    mark, so the late setup of that run sets nothing up (before: the setup came
    second, found no record and set the job up after Slurm had ended it)."""
    alice = users[0]
    mark(sandbox, "405", ".setup", "0")
    mark(sandbox, "405", ".ending", "0")
    first = sandbox.run(
        ["teardown", "--background", "--job-id", "405"],
        env={**runs("0"), "JOBNS_EPILOG_AT": repr(time.time())},
    )
    assert first.returncode == 0, first.stderr
    r = sandbox.run(
        ["setup", "--background", "--job-id", "405", "--user", alice.name], env=runs("0")
    )
    assert r.returncode == 0 and "the job's epilog came first" in r.stderr, r.stderr
    assert not (sandbox.state / "jobs" / "405").exists()
    assert_clean(sandbox)


def test_a_setup_and_a_teardown_of_one_run_started_together_leave_nothing(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Issue 30, finding 1, as slurmd causes it: ten jobs whose launch fails at once, so
    slurmd runs each epilog right after its prolog returned (an enforced node: the
    prolog leaves setup running). Whichever of the two gets the job's lock first, no
    job stays set up after its epilog (before: 1 to 5 of 10 did)."""
    alice = users[0]
    (sandbox.state / "tasks-wait").parent.mkdir(parents=True, exist_ok=True)
    (sandbox.state / "tasks-wait").touch()
    jobs = [str(n) for n in range(410, 420)]
    try:
        for job in jobs:
            for verb, context in (("setup", "prolog_slurmd"), ("teardown", "epilog_slurmd")):
                subprocess.run(
                    [str(script(sandbox, verb))],
                    env=slurmd_env(job, alice, context, "jobns: shm capacity=1MiB"),
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                    check=True,
                )
        deadline = time.monotonic() + 60
        while any(background(sandbox, v, j) for v in ("setup", "teardown") for j in jobs):
            assert time.monotonic() < deadline, "a background setup or teardown still runs"
            time.sleep(0.02)
    finally:
        (sandbox.state / "tasks-wait").unlink()
    assert_clean(sandbox)


def test_a_stale_epilog_mark_of_an_earlier_job_of_the_same_id_is_ignored(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Issue 30, finding 4: Slurm's state was wiped and job ids started again; an old
    <id>.ending (its teardown never ran, or failed) is older than the new job's prolog
    mark: the job is set up as any other (before: it set nothing up, and the job failed
    after a minute), and the old mark is gone."""
    alice = users[0]
    mark(sandbox, "406", ".ending", "0", age=3600)
    (sandbox.state / "tasks-wait").touch()
    try:
        r = as_slurmd(sandbox, "setup", "406", alice)
    finally:
        (sandbox.state / "tasks-wait").unlink()
    assert r.returncode == 0, r.stderr
    assert "closed=" not in run_env(sandbox, "406")
    assert not (sandbox.state / "jobs" / "406.ending").exists()
    assert task(sandbox, "406", alice, "echo ok") == "ok\n"
    assert as_slurmd(sandbox, "teardown", "406", alice).returncode == 0
    assert_clean(sandbox)


def test_a_failed_teardown_still_drops_its_runs_epilog_mark(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Issue 30, finding 4: the epilog's mark goes even when the teardown it was for
    fails (here a record it cannot read), so it cannot outlive its job."""
    alice = users[0]
    assert as_slurmd(sandbox, "setup", "408", alice).returncode == 0
    record = sandbox.state / "jobs" / "408" / "state.json"
    good = record.read_bytes()
    record.write_text("{broken")
    # A node whose name Slurm does not know: the failure must not drain this host's node.
    r = as_slurmd(sandbox, "teardown", "408", alice, env={"SLURMD_NODENAME": "not a node"})
    assert r.returncode == 0
    assert not (sandbox.state / "jobs" / "408.ending").exists()
    record.write_bytes(good)
    assert sandbox.run(["teardown", "--job-id", "408"]).returncode == 0
    assert_clean(sandbox)


def test_a_broken_config_tells_the_waiting_tasks_the_node_is_at_fault(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Issue 30, finding 6: with jobns.toml broken, a background setup cannot read its
    state_dir. It records the failure in the one the prolog named (JOBNS_STATE_DIR), so
    the job's tasks fail at once with a reason that says the node is at fault (before:
    they waited a minute and failed with "see the prolog's log"), and it asks for a drain
    and a requeue. Once the config is fixed, the teardown leaves nothing."""
    alice = users[0]
    good = sandbox.config.read_text()
    (sandbox.state / "tasks-wait").touch()
    try:
        sandbox.config.write_text(good + "\n[[broken\n")
        r = as_slurmd(sandbox, "setup", "409", alice, env={"SLURMD_NODENAME": "not a node"})
        assert r.returncode == 0, r.stderr
    finally:
        (sandbox.state / "tasks-wait").unlink()
    env = run_env(sandbox, "409")
    assert "closed=refused" in env and "the node failed to set the job up" in env, env
    assert "not a problem of the job's" in env and "config" in env, env
    sandbox.config.write_text(good)
    assert as_slurmd(sandbox, "teardown", "409", alice).returncode == 0
    assert_clean(sandbox)
