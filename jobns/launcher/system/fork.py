"""The one way jobns forks a child: every child follows the same four rules.

1. It holds only the fds it was given. Root's job lock, a tree's share lock or a
   state file must never live in a process the job user can ptrace or that runs her
   program (DESIGN.md rule 4): the child closes everything else before it does
   anything, in particular before it changes identity.
2. It never unwinds into the parent's code: whatever happens, it ends in os._exit.
3. It reports once, through its own close-on-exec pipe: nothing at all means success
   (work returned, or exec'd: the pipe closed on exec), otherwise "<exit code> <kind>
   <message>", kind U for a launcher.system.errors.UserError (the job user's doing: the parent
   raises it as such, so it fails her job and not the node), E for anything else.
4. A JobnsError keeps its exit code; anything else is reported as an internal error
   with exit 125, never a traceback from a forked copy of jobns.

The task child of `jobns run` passes inherit=True: a task inherits what its caller
meant it to (stdin/out/err, slurmstepd's PMI fds: every fd without FD_CLOEXEC); all of
jobns's own fds are close-on-exec and are closed here, before the task is prepared.
"""

from __future__ import annotations

import fcntl
import os

from jobns.launcher.system.errors import EXIT_JOBNS_FAILED, JobnsError, UserError

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class Child:
    """A forked child: its pid and the read end of its report pipe."""

    __slots__ = ("pid", "report_fd", "user_error")

    def __init__(self, pid: int, report_fd: int) -> None:
        self.pid = pid
        self.report_fd = report_fd
        self.user_error = False  # the failure report() returned was a UserError

    def report(self) -> tuple[int, str] | None:
        """Block until the child exec'd, exited or reported: None for success, else its
        (exit code, message). Closes the pipe."""
        data = b""
        try:
            while chunk := os.read(self.report_fd, 65536):
                data += chunk
        finally:
            os.close(self.report_fd)
            self.report_fd = -1
        if not data:
            return None
        code, _, rest = data.decode(errors="replace").partition(" ")
        kind, _, msg = rest.partition(" ")
        self.user_error = kind == "U"
        try:
            return int(code), msg
        except ValueError:
            return EXIT_JOBNS_FAILED, data.decode(errors="replace")

    def wait(self) -> int:
        """The child's wait status."""
        while True:
            try:
                return os.waitpid(self.pid, 0)[1]
            except ChildProcessError:
                return 0
            except InterruptedError:
                continue

    def finish(self, what: str) -> None:
        """report() then wait(); JobnsError with the child's message if it failed."""
        failure = self.report()
        status = self.wait()
        if failure is not None:
            if self.user_error:
                raise UserError(failure[1], failure[0])
            raise JobnsError(failure[1], failure[0])
        if status != 0:
            raise JobnsError(f"{what}: the helper process died (wait status {status:#x})")


def close_fds(keep: Iterable[int], inherit: bool, ours: list[int] | None = None) -> None:
    """Close every fd but `keep`; with inherit, only the close-on-exec ones (ours: as
    own_fds listed them, if the caller already did)."""
    keep = set(keep)
    if not inherit:
        # stdin/out/err not given become /dev/null: a stray write must not fail, nor
        # reach root's log (or, for runc, hold the hook's stdout open).
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            if fd not in keep:
                os.dup2(null, fd)
                keep.add(fd)
        if null not in keep:
            os.close(null)
        low = 0
        for fd in sorted(keep):
            if fd > low:
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 20)
        return
    for fd in own_fds(keep) if ours is None else ours:
        try:
            os.close(fd)
        except OSError:
            pass


def own_fds(keep: Iterable[int]) -> list[int]:
    """jobns's own fds (close-on-exec ones), but keep."""
    keep = set(keep)
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            if fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                out.append(fd)
        except OSError:
            pass  # the listing's own directory fd, closed meanwhile
    return out


def spawn(
    work: Callable[[], None],
    keep: Iterable[int] = (),
    *,
    inherit: bool = False,
    before: Callable[[], None] | None = None,
) -> Child:
    """Fork a child that closes all fds but `keep` (and its report pipe), runs work()
    and exits 0; `before` runs first, before the fds are closed (e.g. setpgid)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    keep = [*keep, write_fd]
    # Listed here, not in the child: after the fork, every page the child writes is
    # copied first, which makes the listing ~4x slower there (a task launch waits on it).
    ours = own_fds([*keep, read_fd]) if inherit else None
    pid = os.fork()
    if pid == 0:
        code, kind, msg = EXIT_JOBNS_FAILED, "E", "internal error"
        try:
            os.close(read_fd)
            if before is not None:
                before()
            close_fds(keep, inherit, ours)
            work()
            os._exit(0)
        except JobnsError as e:
            code, msg = e.code, str(e)
            kind = "U" if isinstance(e, UserError) else "E"
        except OSError as e:
            msg = f"internal error: {e}"
        except BaseException as e:  # report anything rather than a traceback from a fork
            msg = f"internal error: {type(e).__name__}: {e}"
        try:
            os.write(write_fd, f"{code} {kind} {msg}".encode(errors="replace"))
        finally:
            os._exit(code)
    os.close(write_fd)
    return Child(pid, read_fd)
