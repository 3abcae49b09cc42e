"""[namespace] pid: an enforced job's PID namespace (launcher.mountns.pins start_init,
launcher.commands.run run_joined).

Real namespaces: root sets the job up (the prolog) and starts its tasks with `jobns run`
(as slurmstepd would, with the SPANK plugin's join done by jobns run as root); each task
runs as jobnsalice. A task's `$$` is its pid inside the job's namespace, so the tests
find the job's processes from the host by the pinned namespace's identity."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox
from tests.integration.test_run import alive, wait_for
from tests.integration.test_setup import assert_clean, setup, teardown

pytestmark = pytest.mark.root

ENFORCED_PID = "[slurm]\nenforce = true\n[namespace]\npid = true\n"


def pid_pin(box: Sandbox, job: str) -> Path:
    return box.state / "jobs" / job / "ns" / "pid"


def members(ino: int) -> list[int]:
    """Host pids of every live process in the PID namespace with this inode (a zombie,
    dead but not yet reaped by its parent on the host, has no mount namespace left)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                os.readlink(f"/proc/{name}/ns/mnt")
                if os.readlink(f"/proc/{name}/ns/pid") == f"pid:[{ino}]":
                    out.append(int(name))
            except OSError:
                pass
    return out


def run(box: Sandbox, job: str, script: str) -> subprocess.CompletedProcess[str]:
    return box.run(["run", "--job-id", job, "--", "sh", "-c", script])


@pytest.fixture
def job(sandbox: Sandbox, users: list[OsUser]) -> str:
    sandbox.write_config(ENFORCED_PID)
    setup(sandbox, "2401", "--user", users[0].name)
    return "2401"


def test_ps_and_proc_show_only_the_jobs_processes_and_pid_1_is_its_init(
    sandbox: Sandbox, job: str, users: list[OsUser]
) -> None:
    r = run(sandbox, job, "id -u; echo $$; ps -e -o pid=,user=,args=; ls -d /proc/[0-9]*")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(users[0].uid)
    ps = [ln.split(None, 2) for ln in lines[2:] if not ln.startswith("/proc/")]
    assert ps[0] == ["1", "root", "jobns-init infinity"], ps
    # the init, the task's shell and ps: nothing of the node, no other job
    assert [p[0] for p in ps] == ["1", lines[1], ps[-1][0]] and "ps -e" in ps[-1][2], ps
    procs = sorted(int(ln.rsplit("/", 1)[1]) for ln in lines if ln.startswith("/proc/"))
    assert procs == [1, int(lines[1])], procs  # the init, and sh (which execs ls last)
    assert (sandbox.local / "job-2401").is_dir()
    teardown(sandbox, job)
    assert_clean(sandbox)


def test_two_tasks_of_the_job_see_each_other(sandbox: Sandbox, job: str) -> None:
    flag = sandbox.local / "job-2401" / "tmp" / "first"
    first = sandbox.popen(
        ["run", "--job-id", job, "--", "sh", "-c", "echo $$ > /tmp/first; exec sleep 60"]
    )
    try:
        wait_for(flag)
        time.sleep(0.1)
        pid = flag.read_text().strip()
        r = run(sandbox, job, f"kill -0 {pid} && tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert r.returncode == 0 and r.stdout.strip() == "sleep 60", (r.stdout, r.stderr)
        r = run(sandbox, job, f"kill {pid}")
        assert r.returncode == 0, r.stderr
        assert first.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        first.kill()
        first.wait()
    teardown(sandbox, job)
    assert_clean(sandbox)


def test_teardown_ends_a_task_that_ignores_sigterm_and_a_double_forked_daemon(
    sandbox: Sandbox, job: str
) -> None:
    ino = os.stat(pid_pin(sandbox, job)).st_ino
    marks = sandbox.local / "job-2401" / "tmp"
    stubborn = sandbox.popen(
        ["run", "--job-id", job, "--", "sh", "-c", "trap '' TERM; touch /tmp/s; sleep 300"]
    )
    # The daemon leaves its task: its jobns run returns at once, the daemon lives on.
    daemon = "setsid sh -c 'trap \"\" TERM; touch /tmp/d; sleep 300' >/dev/null 2>&1 &"
    r = run(sandbox, job, f"{daemon} sleep 0.1")
    assert r.returncode == 0, r.stderr
    try:
        wait_for(marks / "s")
        wait_for(marks / "d")
        before = members(ino)
        assert len(before) == 5, before  # the init, 2 shells, 2 sleeps
        start = time.monotonic()
        teardown(sandbox, job)
        took = time.monotonic() - start
        assert members(ino) == [] and not any(alive(p) for p in before)
        assert 2 <= took < 15, took  # kill_wait = 2: the stubborn tasks waited it out
        assert stubborn.wait(timeout=20) == 128 + signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()
    assert_clean(sandbox)


def test_teardown_of_a_quiet_job_does_not_wait_for_the_init(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """The init ignores SIGTERM: once it is the only process left, the grace ends."""
    sandbox.write_config(ENFORCED_PID)
    setup(sandbox, "2404", "--user", users[0].name, "--kill-wait", "30")
    ino = os.stat(pid_pin(sandbox, "2404")).st_ino
    assert len(members(ino)) == 1
    start = time.monotonic()
    teardown(sandbox, "2404")
    assert time.monotonic() - start < 10 and members(ino) == []
    assert_clean(sandbox)


def test_signals_and_exit_codes_are_unchanged(sandbox: Sandbox, job: str) -> None:
    assert run(sandbox, job, "exit 7").returncode == 7
    assert run(sandbox, job, "kill -TERM $$").returncode == 128 + signal.SIGTERM
    flag = sandbox.local / "job-2401" / "tmp" / "ready"
    script = "trap 'exit 42' USR1; touch /tmp/ready; while :; do sleep 0.1; done"
    p = sandbox.popen(["run", "--job-id", job, "--", "sh", "-c", script])
    wait_for(flag)
    p.send_signal(signal.SIGUSR1)  # forwarded to the task
    assert p.wait(timeout=20) == 42
    flag.unlink()
    p = sandbox.popen(["run", "--job-id", job, "--", "sh", "-c", "touch /tmp/ready; sleep 60"])
    wait_for(flag)
    p.send_signal(signal.SIGTERM)  # as slurmstepd ends a step
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    teardown(sandbox, job)
    assert_clean(sandbox)


def test_without_pid_the_job_sees_the_nodes_processes(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """pid = false (the default) behaves as before: no PID namespace, the node's /proc."""
    sandbox.write_config("[slurm]\nenforce = true\n")
    setup(sandbox, "2402", "--user", users[0].name)
    assert not pid_pin(sandbox, "2402").exists()
    assert "pid_pin" not in (sandbox.state / "jobs" / "2402" / "run.env").read_text()
    r = run(sandbox, "2402", "readlink /proc/self/ns/pid; echo $PPID")
    assert r.returncode == 0, r.stderr
    ns, ppid = r.stdout.split()
    assert ns == os.readlink("/proc/self/ns/pid") and int(ppid) > 1
    teardown(sandbox, "2402")
    assert_clean(sandbox)


def test_without_enforce_pid_is_ignored_with_a_warning(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """The voluntary mode: the job's namespaces are its user's; the setting is reported."""
    sandbox.write_config("[namespace]\npid = true\n")
    r = sandbox.run(["setup", "--job-id", "2403", "--user", users[0].name])
    assert r.returncode == 0 and "[namespace] pid = true is ignored" in r.stderr, r.stderr
    assert not pid_pin(sandbox, "2403").exists()
    r = sandbox.run(["run", "--job-id", "2403", "--", "readlink", "/proc/self/ns/pid"])
    assert r.returncode == 0 and r.stdout.strip() == os.readlink("/proc/self/ns/pid")
    r = sandbox.run(["doctor"])
    assert "problem: [namespace] pid = true is ignored" in r.stdout, r.stdout
    teardown(sandbox, "2403")
    assert_clean(sandbox)


def test_a_task_after_the_init_ended_is_refused(sandbox: Sandbox, job: str) -> None:
    """A PID namespace without its init takes no process (fork: ENOMEM): say why."""
    ino = os.stat(pid_pin(sandbox, job)).st_ino
    (init,) = members(ino)
    os.kill(init, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while members(ino) and time.monotonic() < deadline:
        time.sleep(0.02)
    r = run(sandbox, job, "true")
    assert r.returncode == 125 and "its init has ended" in r.stderr, r.stderr
    teardown(sandbox, job)
    assert_clean(sandbox)
