"""One job of a user reading another job of hers through /proc (SECURITY.md "not defended"
in the enforced mode without a PID namespace).

Both jobs are alice's, so file permissions and ptrace rules let a task of job A open
/proc/PID/root of a task of job B: that is B's root directory in B's mount namespace,
where B's /tmp is B's own. The mount covers (launcher.mountns.namespace.cover_bases) hide B's
trees from A's mount namespace, but not B's processes. With `[namespace] pid = true`,
A's /proc is the procfs of A's own PID namespace: no pid of B can be named there."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.security.conftest import World

pytestmark = pytest.mark.root

SECRET = "secret-of-job-2412"

# As alice, inside job A: every /proc/PID she can name, and what each one's root, cwd and
# fds show of another job's /tmp.
PEEK = (
    "for p in /proc/[0-9]*; do "
    "cat $p/root/tmp/secret $p/cwd/secret 2>/dev/null; "
    "for f in $p/fd/*; do case $(readlink $f 2>/dev/null) in */secret) cat $f;; esac; done; "
    "done; echo done"
)


def two_jobs(world: World, pid: bool) -> None:
    """Jobs 2411 (the attacker's task runs here) and 2412 (a task of it holds a secret in
    its /tmp, its cwd, and an open fd), both alice's, enforced, with or without pid."""
    extra = "[namespace]\npid = true\n" if pid else ""
    world.box.write_config("[slurm]\nenforce = true\n" + extra)
    for job in ("2411", "2412"):
        r = world.setup(job)
        assert r.returncode == 0, r.stderr
    script = f"cd /tmp && echo {SECRET} > secret && exec sleep 300 < secret"
    world.start_jobns(["run", "--job-id", "2412", "--", "sh", "-c", script])
    world.wait_file(world.box.local / "job-2412" / "tmp" / "secret")


def peek(world: World) -> str:
    r = world.run("2411", PEEK)  # root starts the task, which runs as alice
    assert r.returncode == 0 and r.stdout.endswith("done\n"), r.stderr
    return r.stdout


def finish(world: World) -> None:
    for job in ("2411", "2412"):
        assert world.teardown(job).returncode == 0
    world.assert_clean()


def test_a_job_cannot_read_another_job_of_its_user_through_proc(world: World) -> None:
    """[namespace] pid = true: job A's /proc lists only A's processes."""
    two_jobs(world, pid=True)
    assert SECRET not in peek(world)
    finish(world)


def test_without_a_pid_namespace_a_job_reads_another_job_of_its_user(world: World) -> None:
    """The documented gap of pid = false (the default): the same attack works; this test
    keeps the documentation (SECURITY.md, docs/admin.md) honest."""
    two_jobs(world, pid=False)
    assert SECRET in peek(world)
    finish(world)


def _sleepers(seconds: str) -> list[int]:
    """Host pids of live `sleep SECONDS` processes (the marker of one test)."""
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + seconds.encode() + b"\0":
                    os.readlink(f"/proc/{name}/ns/mnt")  # not a zombie
                    out.append(int(name))
        except (OSError, ValueError):
            continue
    return out


@pytest.mark.parametrize("pid", [True, False])
def test_a_task_in_namespaces_of_its_own_is_ended_at_teardown(world: World, pid: bool) -> None:
    """SECURITY.md "not defended": in the enforced mode a process that makes a user and
    mount namespace of its own (`unshare -Urm`) leaves the job's mount namespace, and
    teardown, which finds the job's processes by it, misses it (with pid = false it
    survives: under Slurm the step's cgroup ends it). It cannot leave the job's PID
    namespace: with pid = true teardown ends it too."""
    extra = "[namespace]\npid = true\n" if pid else ""
    world.box.write_config("[slurm]\nenforce = true\n" + extra)
    assert world.setup("2413").returncode == 0
    marker = "3013" if pid else "3014"
    # Started by jobns run, whose supervisor would end it with the task: the wrapper
    # dies first (as a task the plugin joined has none), and the escapee is orphaned.
    task = world.start_jobns(
        ["run", "--job-id", "2413", "--", "sh", "-c", f"unshare -Urm sleep {marker} & wait"]
    )
    deadline = time.monotonic() + 20
    while not _sleepers(marker):
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.05)
    (escaped,) = _sleepers(marker)
    world.track(escaped)  # a host pid: cleanup kills it if it is left
    task.kill()
    task.wait(timeout=20)
    assert _sleepers(marker) == [escaped]
    assert world.teardown("2413").returncode == 0
    left = _sleepers(marker)
    assert left == ([] if pid else [escaped])
    for p in left:
        os.kill(p, signal.SIGKILL)
    world.assert_clean()
