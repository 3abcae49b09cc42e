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
    slurmd drains the node. In the background the job is recorded refused with the
    reason (its waiting tasks fail at once) and jobns asks scontrol to drain the node
    itself; here the node name is not one Slurm knows, so the log says it was not."""
    alice = users[0]
    sandbox.write_config('[lifecycle]\npre_run = "/bin/false"\n')
    r = sandbox.run(
        ["setup", "--background", "--job-id", "403", "--user", alice.name],
        env={"SLURMD_NODENAME": "not a node"},
    )
    assert r.returncode == 125, r.stderr
    assert "not drained" in r.stderr, r.stderr
    t = sandbox.run(["run", "--job-id", "403", "--", "true"], user=alice)
    assert t.returncode == 125
    assert "this node failed to set the job up" in t.stderr and "pre-run" in t.stderr, t.stderr
    assert sandbox.run(["teardown", "--job-id", "403"]).returncode == 0
    assert_clean(sandbox)


def test_a_requeued_job_is_set_up_anew_before_its_last_teardown_began(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """The epilog's marker (<id>.ending) is still there when the same job id's prolog
    runs: setup ends the last run itself and hands the late teardown nothing to do."""
    alice = users[0]
    assert sandbox.run(["setup", "--job-id", "404", "--user", alice.name]).returncode == 0
    task(sandbox, "404", alice, "echo first-run > /tmp/old")
    (sandbox.state / "jobs" / "404.ending").touch()  # what the epilog leaves
    r = sandbox.run(["setup", "--job-id", "404", "--user", alice.name])
    assert r.returncode == 0, r.stderr
    assert task(sandbox, "404", alice, "ls /tmp/old 2>&1; true") != "/tmp/old\n"  # a fresh run
    assert (sandbox.state / "jobs" / "404.ended").exists()
    assert not (sandbox.state / "jobs" / "404.ending").exists()
    late = sandbox.run(["teardown", "--background", "--job-id", "404"])
    assert late.returncode == 0, late.stderr
    assert task(sandbox, "404", alice, "echo still > /tmp/y; cat /tmp/y") == "still\n"
    assert not (sandbox.state / "jobs" / "404.ended").exists()
    done = sandbox.run(["teardown", "--background", "--job-id", "404"])
    assert done.returncode == 0, done.stderr
    assert_clean(sandbox)


def test_an_epilog_that_ran_before_the_setup_began_leaves_nothing_set_up(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A job cancelled at once: its epilog ran (marker left) before its background setup
    had recorded anything. That setup sets nothing up."""
    alice = users[0]
    (sandbox.state / "jobs").mkdir(mode=0o755, exist_ok=True)
    (sandbox.state / "jobs" / "405.ending").touch()
    r = sandbox.run(["setup", "--background", "--job-id", "405", "--user", alice.name])
    assert r.returncode == 0 and "ended before its setup began" in r.stderr, r.stderr
    assert not (sandbox.state / "jobs" / "405").exists()
    late = sandbox.run(["teardown", "--background", "--job-id", "405"])
    assert late.returncode == 0, late.stderr
    assert_clean(sandbox)


def test_a_teardown_by_hand_drops_a_stale_epilog_marker(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """An epilog whose own teardown never ran left <id>.ending; the administrator's
    `jobns teardown` ends the job, and the next setup of that id (a requeue) is a whole
    setup, not 'the job ended before its setup began'."""
    alice = users[0]
    assert sandbox.run(["setup", "--job-id", "407", "--user", alice.name]).returncode == 0
    (sandbox.state / "jobs" / "407.ending").touch()
    assert sandbox.run(["teardown", "--job-id", "407"]).returncode == 0
    assert not (sandbox.state / "jobs" / "407.ending").exists()
    r = sandbox.run(["setup", "--job-id", "407", "--user", alice.name])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "closed=" not in run_env(sandbox, "407")
    assert sandbox.run(["teardown", "--job-id", "407"]).returncode == 0
    assert_clean(sandbox)
