"""Fork/exec a task, forward signals, escalate SIGTERM to SIGKILL, reap everything.

Like slurmstepd and unlike tini/dumb-init: jobns is a child
subreaper, so a daemon the task double-forks or setsid()s is re-parented to
jobns and cannot outlive the job; termination sends SIGCONT+SIGTERM to every
descendant, waits kill_wait seconds, SIGKILLs whatever is left and waits for
all of it before the job's directories are torn down.

Parent/child protocol (launcher.system.fork, BenchExec style): the child reports a setup
failure as "<exit code> <message>" on a close-on-exec pipe and _exits; a successful
exec closes the pipe with nothing written, so EOF means "the command is running".
"""

from __future__ import annotations

import errno
import os

from jobns.launcher.system.errors import (
    EXIT_JOBNS_FAILED,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_SIGNAL_BASE,
    JobnsError,
)
from jobns.launcher.system.fastimport import signal
from jobns.launcher.system.fork import spawn
from jobns.launcher.system.libc import set_child_subreaper, set_pdeathsig

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

FORWARDED = (
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGQUIT,
    signal.SIGWINCH,
)
HANDLED = (*FORWARDED, signal.SIGTERM, signal.SIGCHLD)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
HIDDEN = ("/tmp/", "/var/tmp/", "/dev/shm/")
DOUBLE_INTERRUPT = 1.0  # seconds: a second SIGINT this soon terminates the task (as srun)


def _now() -> float:
    # `time` only when a deadline is needed (a signal, a termination): most tasks never do.
    import time

    return time.monotonic()


def descendants(root: int) -> list[int]:
    """Every live process below root, from /proc (parents before children)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields start after the last ')'.
        fields = data[data.rindex(b")") + 2 :].split(b" ", 2)
        children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def find_executable(cmd: str, env: dict[str, str]) -> list[str]:
    if "/" in cmd:
        return [cmd]
    return [f"{d or '.'}/{cmd}" for d in env.get("PATH", DEFAULT_PATH).split(":")]


def exec_command(argv: list[str], env: dict[str, str]) -> None:
    """execve with a PATH search of our own (os.execvpe imports `warnings`)."""
    first: OSError | None = None
    denied: OSError | None = None
    for path in find_executable(argv[0], env):
        try:
            os.execve(path, argv, env)  # noqa: S606 -- exec without a shell is the point
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                first = first or e
                continue
            if e.errno == errno.EACCES:
                denied = denied or e
                continue
            raise
    raise denied or first or FileNotFoundError(errno.ENOENT, "not found")


def exec_failure(cmd: str, err: OSError) -> tuple[int, str]:
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        msg = f"run {cmd}: command not found"
        if cmd.startswith(HIDDEN):
            msg += (
                " inside the job (its /tmp, /var/tmp and /dev/shm are private, so programs"
                " stored there on the host are hidden; install it elsewhere)"
            )
        return EXIT_NOT_FOUND, msg
    return EXIT_NOT_EXECUTABLE, f"run {cmd}: {err.strerror} (not executable)"


def _task(prepare: Callable[[], None], argv: list[str], env: dict[str, str]) -> None:
    """In the forked child (launcher.system.fork): set up, then exec. Returns only by raising."""
    prepare()
    # Python ignores SIGPIPE and SIGXFSZ; exec keeps ignored signals ignored.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, *HANDLED):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        exec_command(argv, env)
    except OSError as e:
        code, msg = exec_failure(argv[0], e)
        raise JobnsError(msg, code) from None


def arm_child_death_signal(parent: int) -> None:
    """The task dies with jobns. Call after any uid change: setuid clears it."""
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # jobns already died before we armed it
        os._exit(EXIT_JOBNS_FAILED)


class Supervisor:
    """Runs one command and everything it starts, to the end."""

    def __init__(self, kill_wait: float) -> None:
        self.kill_wait = kill_wait
        self.me = os.getpid()
        self.main_pid = 0
        self.main_status: int | None = None
        self.deadline: float | None = None  # when to SIGKILL the remaining tree
        self.terminating = False
        self.last_interrupt = 0.0
        self.tty_fd: int | None = None

    def start(self, prepare: Callable[[], None], argv: list[str], env: dict[str, str]) -> None:
        """Fork the task; raise JobnsError (with its exit code) if it never ran."""
        set_child_subreaper(True)
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        tty = self._foreground_tty()
        child = spawn(
            lambda: _task(prepare, argv, env), inherit=True, before=lambda: os.setpgid(0, 0)
        )
        pid = child.pid
        self.main_pid = pid
        try:
            # Also set here: whichever of parent and child runs first wins the race.
            os.setpgid(pid, pid)
        except OSError:
            pass
        if tty is not None:
            self._give_tty(tty, pid)
        failure = child.report()
        if failure is not None:
            self._reap_all_blocking()
            raise JobnsError(failure[1], failure[0])

    def _foreground_tty(self) -> int | None:
        # Interactive use: hand the terminal to the task's process group so that
        # Ctrl-C reaches the task once, not twice (directly and forwarded).
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                return 0
        except OSError:
            pass
        return None

    def _give_tty(self, fd: int, pgrp: int) -> None:
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgrp)
            self.tty_fd = fd
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, old)

    def _take_tty_back(self) -> None:
        if self.tty_fd is not None:
            old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(self.tty_fd, os.getpgrp())
            except OSError:
                pass
            finally:
                signal.signal(signal.SIGTTOU, old)
            self.tty_fd = None

    def _reap_all_blocking(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return
            if pid == self.main_pid:
                self.main_status = status

    def _reap(self) -> bool:
        """Reap what has exited; True when no child at all is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.main_pid:
                self.main_status = status
                self._take_tty_back()

    def terminate(self) -> None:
        """As slurmstepd ends a step: SIGCONT and SIGTERM to every task process; SIGKILL after
        kill_wait."""
        if self.terminating:
            self.kill()
            return
        self.terminating = True
        tree = descendants(self.me)
        signal_all(tree, signal.SIGCONT)
        signal_all(tree, signal.SIGTERM)
        self.deadline = _now() + self.kill_wait

    def kill(self) -> None:
        signal_all(descendants(self.me), signal.SIGKILL)
        # Keep killing once a second: something may have forked meanwhile.
        self.deadline = _now() + 1.0

    def forward(self, sig: int) -> None:
        if sig == signal.SIGINT:
            now = _now()
            if now - self.last_interrupt < DOUBLE_INTERRUPT:
                self.terminate()
                return
            self.last_interrupt = now
        if self.main_status is None:
            try:
                os.killpg(self.main_pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGCONT:
            signal_all(descendants(self.me), sig)

    def wait(self) -> int:
        """Supervise until every descendant is gone; the command's exit status."""
        wanted = set(HANDLED)
        while True:
            if self._reap():
                break
            if self.main_status is not None and not self.terminating:
                # The command is done: whatever it left running goes the same way.
                self.terminate()
            timeout = None if self.deadline is None else max(0.0, self.deadline - _now())
            if timeout is None:
                info = signal.sigwaitinfo(wanted)
                sig: int | None = info.si_signo
            else:
                got = signal.sigtimedwait(wanted, timeout)
                sig = None if got is None else got.si_signo
            if sig is None:
                self.kill()
            elif sig == signal.SIGTERM:
                self.terminate()
            elif sig != signal.SIGCHLD:
                self.forward(sig)
        self._take_tty_back()
        return exit_code(self.main_status)


def exit_code(status: int | None) -> int:
    if status is None:
        return EXIT_JOBNS_FAILED
    if os.WIFSIGNALED(status):
        return EXIT_SIGNAL_BASE + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
