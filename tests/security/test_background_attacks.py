"""Attacks on the prolog and epilog that return at once (docs/admin.md "What the prolog
and epilog wait for"), by a second ordinary user, bob, against alice's job.

What would hurt: a mark that makes alice's setup set nothing up (<id>.setup taken or
<id>.ending planted, launcher.protocol.state "marks"), one
that makes a voluntary node's prolog return before setup is done (tasks-wait), or a
lock held on alice's job that keeps her tasks waiting in the SPANK plugin. Each is a file
in a directory of root's, which bob can neither create nor open.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import OsUser, Sandbox

pytestmark = pytest.mark.root

TRY = """
import fcntl, os, sys
for path, flags in [
    (sys.argv[1] + "/jobs/601.ending", os.O_WRONLY | os.O_CREAT),
    (sys.argv[1] + "/jobs/601.setup", os.O_WRONLY | os.O_CREAT),
    (sys.argv[1] + "/tasks-wait", os.O_WRONLY | os.O_CREAT),
    (sys.argv[1] + "/jobs/601.lock", os.O_RDONLY),
]:
    try:
        fd = os.open(path, flags, 0o644)
    except PermissionError:
        print("denied", path)
        continue
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    print("HELD", path)
"""


def test_bob_can_neither_mark_alices_job_ended_nor_hold_her_tasks(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice, bob = users[0], users[1]
    # Once alice's job is set up, bob tries all four.
    r = sandbox.run(["setup", "--job-id", "601", "--user", alice.name])
    assert r.returncode == 0, r.stderr
    out = subprocess.run(
        ["/usr/bin/python3", "-c", TRY, str(sandbox.state)],
        capture_output=True,
        text=True,
        timeout=30,
        **sandbox.creds(bob),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("denied") == 4 and "HELD" not in out.stdout, out.stdout
    # Her job is untouched: set up, open to her tasks, torn down as usual.
    t = sandbox.run(["run", "--job-id", "601", "--", "sh", "-c", "echo ok"], user=alice)
    assert t.returncode == 0 and t.stdout == "ok\n", t.stderr
    assert not (sandbox.state / "jobs" / "601.ending").exists()
    assert sandbox.run(["teardown", "--background", "--job-id", "601"]).returncode == 0
    assert sandbox.leftovers() == []
