"""launcher.system.supervise: the exit-status helpers, the PATH search, the process-tree walk and
the Supervisor end to end (no root).

The Supervisor makes its process a child subreaper and blocks the signals it handles,
so every Supervisor here runs in a forked copy of the test process, which reports its
result as its exit status and never returns into pytest.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.supervise import (
    DEFAULT_PATH,
    Supervisor,
    descendants,
    exec_failure,
    exit_code,
    find_executable,
)

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}
TIMEOUT = 10.0  # no test here takes more than a second or two unless something is wrong


# ------------------------------------------------------------------------- exit_code


def real_status(code: int | None = None, sig: int | None = None) -> int:
    """The wait status of a real child that exited with code or died of sig."""
    pid = os.fork()
    if pid == 0:
        try:
            if sig is not None:
                if sig != signal.SIGKILL:
                    signal.signal(sig, signal.SIG_DFL)  # Python's own SIGINT handler raises
                os.kill(os.getpid(), sig)
        finally:
            os._exit(code or 0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.parametrize("code", [0, 1, 3, 42, 125, 255])
def test_exit_code_of_a_normal_exit_is_the_exit_status(code: int) -> None:
    assert exit_code(real_status(code=code)) == code
    assert exit_code(code << 8) == code


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_exit_code_of_a_signal_is_128_plus_its_number(sig: signal.Signals) -> None:
    assert exit_code(real_status(sig=sig)) == 128 + sig
    assert exit_code(int(sig)) == 128 + sig
    assert exit_code(int(sig) | 0x80) == 128 + sig  # core dumped


def test_exit_code_without_a_status_means_jobns_failed() -> None:
    assert exit_code(None) == 125


# ------------------------------------------------------------------------- find_executable


def test_find_executable_searches_path_in_order() -> None:
    assert find_executable("prog", {"PATH": "/a:/b/c"}) == ["/a/prog", "/b/c/prog"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a::/b", ["/a/prog", "./prog", "/b/prog"]),
        (":/b", ["./prog", "/b/prog"]),
        ("/a:", ["/a/prog", "./prog"]),
        ("", ["./prog"]),
    ],
)
def test_an_empty_path_entry_means_the_current_directory(path: str, expected: list[str]) -> None:
    assert find_executable("prog", {"PATH": path}) == expected


@pytest.mark.parametrize("cmd", ["./prog", "/usr/bin/prog", "dir/prog", "/tmp/x/prog"])
def test_a_name_with_a_slash_is_not_searched(cmd: str) -> None:
    assert find_executable(cmd, {"PATH": "/a:/b"}) == [cmd]


def test_find_executable_without_path_uses_the_default() -> None:
    assert find_executable("prog", {}) == [f"{d}/prog" for d in DEFAULT_PATH.split(":")]
    assert "/usr/bin/prog" in find_executable("prog", {})


# ------------------------------------------------------------------------- exec_failure


@pytest.mark.parametrize("cmd", ["/tmp/prog", "/var/tmp/a/b", "/dev/shm/prog"])
def test_a_command_not_found_under_private_scratch_says_why(cmd: str) -> None:
    for err in (errno.ENOENT, errno.ENOTDIR):
        code, msg = exec_failure(cmd, OSError(err, os.strerror(err)))
        assert code == 127
        assert msg.startswith(f"run {cmd}: command not found inside the job")
        assert "private" in msg and "install it elsewhere" in msg


@pytest.mark.parametrize("cmd", ["prog", "/usr/bin/nope", "/tmpfoo/prog", "./tmp/prog"])
def test_a_command_not_found_elsewhere_gets_no_hint(cmd: str) -> None:
    code, msg = exec_failure(cmd, FileNotFoundError(errno.ENOENT, "No such file or directory"))
    assert (code, msg) == (127, f"run {cmd}: command not found")


def test_a_command_that_cannot_be_executed_is_126() -> None:
    err: OSError = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    assert exec_failure("/opt/x", err) == (126, "run /opt/x: Permission denied (not executable)")
    err = OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC))
    assert exec_failure("/opt/x", err) == (126, "run /opt/x: Exec format error (not executable)")


# ------------------------------------------------------------------------- descendants


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def poll(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def shell_with_two_sleeps() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    yield proc
    for pid in descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


def test_descendants_finds_the_processes_below_a_process(
    shell_with_two_sleeps: subprocess.Popen[bytes],
) -> None:
    sh = shell_with_two_sleeps.pid

    def two_sleeps() -> bool:
        below = descendants(sh)
        return len(below) == 2 and all(cmdline(p) == ["sleep", "30"] for p in below)

    poll(two_sleeps, "the two sleeps")
    sleeps = descendants(sh)
    # From higher up: the shell first, then its children.
    mine = descendants(os.getpid())
    assert sh in mine and set(sleeps) <= set(mine)
    assert all(mine.index(sh) < mine.index(p) for p in sleeps)
    for pid in sleeps:
        os.kill(pid, signal.SIGKILL)
    assert shell_with_two_sleeps.wait(TIMEOUT) == 0  # `wait` returns 0 once both are gone
    assert descendants(sh) == []


def test_descendants_of_a_process_without_children_is_empty() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert descendants(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------- Supervisor

# Exit statuses of the forked copy that are not a result of the test body.
CRASHED = 254


class Forked:
    """A forked copy of the test process that runs body() and _exits with its result;
    a traceback (or a failed assertion) in the copy comes back to the test."""

    def __init__(self, body: Callable[[], int]) -> None:
        self.read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = CRASHED
            try:
                os.close(self.read_fd)
                # No terminal: the Supervisor would hand it to the task's process group.
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                code = body()
            except BaseException:
                os.write(write_fd, traceback.format_exc().encode())
            finally:
                os._exit(code)
        os.close(write_fd)
        self.started = time.monotonic()

    def result(self, timeout: float = TIMEOUT) -> int:
        """The body's result (its exit status); fails the test on a crash or a hang."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                os.close(self.read_fd)
                pytest.fail(f"the supervising process took longer than {timeout} s")
            time.sleep(0.01)
        self.elapsed = time.monotonic() - self.started
        with os.fdopen(self.read_fd, "rb") as f:
            crash = f.read().decode(errors="replace")
        assert os.WIFEXITED(status), f"the supervising process died: status {status:#x}"
        code = os.WEXITSTATUS(status)
        assert not crash, crash
        assert code != CRASHED
        return code


def supervise(
    argv: list[str], env: dict[str, str] | None = None, kill_wait: float = 0.5
) -> Callable[[], int]:
    def body() -> int:
        sup = Supervisor(kill_wait=kill_wait)
        sup.start(lambda: None, argv, env or ENV)
        return sup.wait()

    return body


def alive(pid: int) -> bool:
    """pid is a live (not zombie) process; /proc is read, the process is not signalled."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :][:1] != b"Z"


def test_supervisor_passes_on_the_exit_status() -> None:
    assert Forked(supervise(["sh", "-c", "exit 3"])).result() == 3
    assert Forked(supervise(["true"])).result() == 0


def test_supervisor_passes_on_death_by_a_signal() -> None:
    assert Forked(supervise(["sh", "-c", "kill -USR2 $$"])).result() == 128 + signal.SIGUSR2


def test_supervisor_runs_prepare_in_the_child_before_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "prepared"

    def prepare() -> None:
        marker.write_text(str(os.getpid()))

    def body() -> int:
        sup = Supervisor(kill_wait=0.5)
        sup.start(
            prepare,
            ["sh", "-c", 'echo $$ > "$M"'],
            {**ENV, "M": str(tmp_path / "ran")},
        )
        return sup.wait()

    assert Forked(body).result() == 0
    # prepare() ran in the very process that then exec'd the command.
    assert marker.read_text() == (tmp_path / "ran").read_text().strip()


def test_what_the_command_leaves_running_is_terminated(tmp_path: Path) -> None:
    """A daemon double-forked and setsid()ed by the command is re-parented to the
    supervisor (a child subreaper) and terminated when the command exits."""
    pidfile = tmp_path / "daemon.pid"
    script = (
        '( setsid sh -c \'echo $$ > "$P.tmp" && mv "$P.tmp" "$P" && exec sleep 60\' & );'
        ' while [ ! -e "$P" ]; do sleep 0.01; done; exit 0'
    )
    run = Forked(supervise(["sh", "-c", script], {**ENV, "P": str(pidfile)}, kill_wait=5))
    code = run.result()
    daemon = int(pidfile.read_text())
    try:
        assert code == 0
        assert not alive(daemon), f"the daemon {daemon} survived: {cmdline(daemon)}"
        assert run.elapsed < 5  # it died of SIGTERM at once: no wait for kill_wait
    finally:
        if alive(daemon) and cmdline(daemon) == ["sleep", "60"]:
            os.kill(daemon, signal.SIGKILL)


def test_sigterm_escalates_to_sigkill_after_kill_wait(tmp_path: Path) -> None:
    """A command that ignores SIGTERM (and its sleep, which inherits that) is SIGKILLed
    kill_wait seconds after the supervisor got SIGTERM: 128+9."""
    ready = tmp_path / "ready"
    run = Forked(
        supervise(
            ["sh", "-c", "trap '' TERM; : > \"$R\"; sleep 60"],
            {**ENV, "R": str(ready)},
            kill_wait=0.5,
        )
    )
    poll(ready.exists, "the command to ignore SIGTERM")
    sent = time.monotonic()
    os.kill(run.pid, signal.SIGTERM)
    assert run.result() == 128 + signal.SIGKILL
    assert 0.5 <= time.monotonic() - sent < 5


def test_sigterm_ends_a_cooperative_command_at_once(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    run = Forked(
        supervise(["sh", "-c", ': > "$R"; sleep 60'], {**ENV, "R": str(ready)}, kill_wait=30)
    )
    poll(ready.exists, "the command to start")
    os.kill(run.pid, signal.SIGTERM)
    assert run.result() == 128 + signal.SIGTERM
    assert run.elapsed < 10  # well before kill_wait


def test_a_second_sigterm_kills_at_once(tmp_path: Path) -> None:
    """The first SIGTERM reaches the command (its trap writes a file); a second one during
    the kill_wait of 30 s SIGKILLs everything at once."""
    ready, termed = tmp_path / "ready", tmp_path / "termed"
    script = 'trap \': > "$T"\' TERM; : > "$R"; while :; do sleep 60 & wait; done'
    run = Forked(
        supervise(["sh", "-c", script], {**ENV, "R": str(ready), "T": str(termed)}, kill_wait=30)
    )
    poll(ready.exists, "the command to set its trap")
    os.kill(run.pid, signal.SIGTERM)
    poll(termed.exists, "the command to get the first SIGTERM")
    os.kill(run.pid, signal.SIGTERM)
    assert run.result() == 128 + signal.SIGKILL
    assert run.elapsed < 10


def test_forwarded_signals_reach_the_command(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = "trap 'exit 42' USR1; : > \"$R\"; while :; do sleep 0.05; done"
    run = Forked(supervise(["sh", "-c", script], {**ENV, "R": str(ready)}, kill_wait=5))
    poll(ready.exists, "the command to set its trap")
    os.kill(run.pid, signal.SIGUSR1)
    assert run.result() == 42


def start_failure(
    argv: list[str], env: dict[str, str], prepare: Callable[[], None] = lambda: None
) -> Callable[[], int]:
    """start() must raise JobnsError: the body's result is its code (0: it did not)."""

    def body() -> int:
        sup = Supervisor(kill_wait=0.5)
        try:
            sup.start(prepare, argv, env)
        except JobnsError as e:
            assert e.code in (126, 127, 7), e
            assert str(e).startswith(f"run {argv[0]}: ") or e.code == 7, e
            assert descendants(os.getpid()) == []  # the failed child was reaped
            return e.code
        return 0

    return body


def test_a_missing_command_is_127(tmp_path: Path) -> None:
    assert Forked(start_failure(["jobns-no-such-command"], {"PATH": str(tmp_path)})).result() == 127
    assert Forked(start_failure([str(tmp_path / "missing")], ENV)).result() == 127
    assert Forked(start_failure(["jobns-no-such-command"], {**ENV, "PATH": ""})).result() == 127


def test_a_command_that_is_not_executable_is_126(tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o644)
    assert Forked(start_failure([str(prog)], ENV)).result() == 126
    # Found but not executable in one PATH entry, missing in the others: 126, not 127.
    env = {"PATH": f"/nonexistent:{tmp_path}:/also/missing"}
    assert Forked(start_failure(["prog"], env)).result() == 126


def test_the_path_search_goes_on_past_a_file_that_is_not_executable(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "prog").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "b" / "prog").write_text("#!/bin/sh\nexit 5\n")
    (tmp_path / "b" / "prog").chmod(0o755)
    env = {"PATH": f"{tmp_path}/a:{tmp_path}/b:/usr/bin:/bin"}
    assert Forked(supervise(["prog"], env)).result() == 5


def test_a_failing_prepare_keeps_its_exit_code() -> None:
    def prepare() -> None:
        raise JobnsError("prepare failed", 7)

    assert Forked(start_failure(["true"], ENV, prepare)).result() == 7
