"""Container holds on a standalone job's directories: hold files and holder processes.

  <state_dir>/holds/                        root 0700
  <state_dir>/holds/<job-id>/               root 0700 (made and removed under the JobLock)
  <state_dir>/holds/<job-id>/<container>    root 0600, KEY=VALUE lines (no JSON on the hook
                                            path), flock(LOCK_EX)'ed by the holder

A standalone `jobns run` task holds LOCK_SH on each tree root while it runs and
removes the trees if it wins LOCK_EX|LOCK_NB when it ends (launcher.backing.fs). A hook
cannot hold a lock after it exits, so createRuntime forks a *holder*: a small
detached process that inherits the hook's share-locked tree fds and waits (on a
pidfd) for the container's init to exit. Then it does exactly what a finishing
`jobns run` does (fs.release_tree: remove the trees if nobody else holds them),
unlinks its hold file and exits. So containers and bare `jobns run` tasks of one
job share the trees and the last one out removes them, with no change to the
launcher, and `jobns gc` sees a container's trees as in use.

The holder keeps an exclusive flock on its hold file for its whole life. The
poststop hook finds the hold by container id and bundle, waits for that lock (the
holder is finishing: the container is gone), and if the file is still there (the
holder was killed, or removal failed) releases the trees itself and removes the
file. A job set up by a prolog (`jobns setup`) has no holds: its trees belong to
its record and the epilog removes them.
"""

from __future__ import annotations

import errno
import fcntl
import os

from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import Job
    from jobns.launcher.system.files import Temporary

VERSION = "1"
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
WAIT = 120.0  # seconds poststop waits for a holder (it may be removing a large tree)


def holds_dir(state_dir: str) -> str:
    # Imported here: poststop may finish without the rest of the state protocol.
    from jobns.launcher.protocol.state import HOLDS

    return f"{state_dir}/{HOLDS}"


def _ensure_dir(parent_fd: int, name: str, path: str) -> int:
    """mkdir-or-open a root-only directory (state_dir itself was checked by the launcher)."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    except OSError as e:
        from jobns.launcher.protocol import state

        raise state.state_error("create", path, e) from None
    fd = os.open(name, O_DIR, dir_fd=parent_fd)
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o077:
        os.close(fd)
        raise JobnsError(f"refuse {path}: not a root-only directory; remove it")
    return fd


def _read_info(fd: int) -> dict[str, str]:
    data = os.pread(fd, 65536, 0).decode(errors="replace")
    return dict(line.split("=", 1) for line in data.splitlines() if "=" in line)


def _errors_in(fd: int) -> list[str]:
    data = os.pread(fd, 1 << 20, 0).decode(errors="replace")
    return [line[6:] for line in data.splitlines() if line.startswith("error=")]


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def wait_lock(fd: int, timeout: float) -> bool:
    """Take the hold file's lock, waiting up to timeout for its holder to exit."""
    import time

    deadline = time.monotonic() + timeout
    pause = 0.001
    while not _try_lock(fd):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


class Pending:
    """A hold file written and locked under a temporary name, not yet in place."""

    __slots__ = ("dir_fd", "fd", "job_id", "path", "state_dir", "temp")

    def __init__(
        self, state_dir: str, job_id: str, dir_fd: int, temp: Temporary, path: str
    ) -> None:
        self.state_dir = state_dir
        self.job_id = job_id
        self.dir_fd = dir_fd
        self.temp = temp
        self.fd = temp.fd
        self.path = path

    def abort(self) -> None:
        self.temp.discard()
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            self.temp.close()
            os.close(self.dir_fd)
            self.fd = self.dir_fd = -1

    def commit(self, handles: list[TreeHandle], pidfd: int) -> None:
        """Put the hold in place and fork the holder, which inherits the hold's lock and
        the trees' share locks; the caller then closes its own copies."""
        try:
            self.temp.commit()
        except OSError as e:
            from jobns.launcher.protocol import state

            raise state.state_error("create hold", self.path, e) from None
        from jobns.launcher.system.fork import spawn

        # launcher.system.fork: the holder keeps only the container's pidfd, the hold's lock and
        # the trees' share locks; above all not the JobLock the hook holds while it forks.
        keep = (pidfd, self.fd, *(fd for h in handles for fd in (h.fd, *h.parent_fds)))
        # Named before the fork, so the holder is "jobns-holder" (what `ps -e` and the
        # tests look for) from its first instant.
        mine = _set_comm(b"jobns-holder")
        try:
            child = spawn(
                lambda: _holder(pidfd, self.fd, self.path, self.state_dir, self.job_id, handles),
                keep=keep,
            )
        except OSError as e:
            os.unlink(self.temp.name, dir_fd=self.dir_fd)
            raise JobnsError(f"start the holder of {self.path}: {e.strerror}") from None
        finally:
            _set_comm(mine)
        os.close(child.report_fd)  # detached: it outlives this hook; poststop reads the hold
        self.close()


def _set_comm(name: bytes) -> bytes:
    """Set this process's name (/proc/self/comm); returns the old one."""
    try:
        with open("/proc/self/comm", "r+b", buffering=0) as f:
            old = f.read().rstrip(b"\n")
            f.seek(0)
            f.write(name)
        return old
    except OSError:
        return name


def _open_hold(state_dir: str, job_id: str, cid: str) -> int:
    """A hold file opened for reading, never through a link (OSError as it comes)."""
    return os.open(
        f"{holds_dir(state_dir)}/{job_id}/{cid}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    )


def live(state_dir: str, job_id: str, cid: str) -> dict[str, str] | None:
    """The hold of this container if its holder still runs (None: no hold, or a stale one
    the next hold replaces)."""
    try:
        fd = _open_hold(state_dir, job_id, cid)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    try:
        if _try_lock(fd):
            return None
        return _read_info(fd)
    finally:
        os.close(fd)


def wait_gone(state_dir: str, job_id: str, cid: str) -> None:
    """Wait for the holder of an earlier container with this id (it is finishing)."""
    try:
        fd = _open_hold(state_dir, job_id, cid)
    except FileNotFoundError:
        return
    try:
        if not wait_lock(fd, WAIT):
            raise JobnsError(
                f"container {cid}: an earlier container with this id still holds "
                f"job {job_id} after {WAIT:.0f} s; use another container id"
            )
    finally:
        os.close(fd)


def prepare(state_dir: str, job: Job, cid: str, pid: int, bundle: str) -> Pending:
    if "\n" in bundle:
        raise JobnsError(f"container {cid}: its bundle path has a newline; rename it")
    info = {
        "version": VERSION,
        "job_id": job.job_id,
        "container": cid,
        "bundle": bundle,
        "pid": str(pid),
        "uid": str(job.user.uid),
        "gid": str(job.user.gid),
        "layout": job.layout,
        "no_rm": "1" if job.no_rm else "",
    }
    body = "".join(f"{k}={v}\n" for k, v in info.items()).encode()
    from jobns.launcher.protocol import state
    from jobns.launcher.system import files

    state_fd = os.open(state_dir, O_DIR)
    try:
        top = _ensure_dir(state_fd, state.HOLDS, holds_dir(state_dir))
    finally:
        os.close(state_fd)
    try:
        dir_fd = _ensure_dir(top, job.job_id, f"{holds_dir(state_dir)}/{job.job_id}")
    finally:
        os.close(top)
    path = f"{holds_dir(state_dir)}/{job.job_id}/{cid}"
    try:
        temp = files.Temporary(dir_fd, cid, 0o600, os.O_RDWR)
    except OSError as e:
        os.close(dir_fd)
        raise state.state_error("create hold", path, e) from None
    pending = Pending(state_dir, job.job_id, dir_fd, temp, path)
    try:
        fcntl.flock(temp.fd, fcntl.LOCK_EX)  # nobody else knows the name yet: never blocks
        files.write_all(temp.fd, body)
    except OSError as e:
        pending.abort()  # no half-written hold file is left behind
        raise state.state_error("create hold", path, e) from None
    return pending


def _holder(
    pidfd: int, hold_fd: int, path: str, state_dir: str, job_id: str, handles: list[TreeHandle]
) -> None:
    """The holder: a detached process standing for the container as a task of the job."""
    import select

    from jobns.launcher.backing import fs

    os.setsid()  # out of the runtime's session: its terminal's signals are not for us
    # stdin/out/err are /dev/null already (launcher.system.fork): runc waits for EOF on the
    # hook's stdout, so the holder must never hold it.
    os.chdir("/")
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    while not poll.poll():
        pass  # readable once the container's init has exited
    errors: list[str] = []
    for h in handles:
        errors += fs.release_tree(h, adopted(state_dir, job_id))
    if errors:
        # Left for poststop to report (its output reaches the runtime's log) and retry.
        os.lseek(hold_fd, 0, os.SEEK_END)
        os.write(hold_fd, "".join(f"error={e}\n" for e in errors).encode(errors="replace"))
        return
    retire(state_dir, job_id, path, hold_fd)


def find(state_dir: str, cid: str, bundle: str) -> list[str]:
    """Jobs holding a hold of container cid with this bundle (normally one)."""
    try:
        jobs = os.listdir(holds_dir(state_dir))
    except OSError:
        return []
    found = []
    for job_id in jobs:
        try:
            fd = _open_hold(state_dir, job_id, cid)
        except OSError:
            continue
        try:
            if _read_info(fd).get("bundle") == bundle:
                found.append(job_id)
        finally:
            os.close(fd)
    return found


def release(state_dir: str, job_id: str, cid: str, config: Config) -> list[str]:
    """poststop: wait for the container's holder, finish its work if it could not, and
    remove the hold. Returns error messages."""
    path = f"{holds_dir(state_dir)}/{job_id}/{cid}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [f"open hold {path}: {e.strerror}"]
    try:
        if not wait_lock(fd, WAIT):
            return [
                f"hold {path}: its holder still runs after {WAIT:.0f} s (removing a large "
                "tree?); it removes the job's directories itself when done"
            ]
        if os.fstat(fd).st_nlink == 0:
            return []  # the holder finished and retired the hold
        # The holder was killed, or could not remove everything: do it (again) here.
        errors = _release_trees(state_dir, _read_info(fd), config)
        retire(state_dir, job_id, path, fd)
        return errors
    finally:
        os.close(fd)


def retire(state_dir: str, job_id: str, path: str, fd: int) -> None:
    """Remove a finished hold (fd: the hold file, locked), the job's hold directory if it
    was the last, and the job's lock file if nothing else of the job is left here."""
    from jobns.launcher.protocol import state

    with state.JobLock(state_dir, job_id) as lock:
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
        except FileNotFoundError:
            pass
        if unused(state_dir, job_id) and not os.path.exists(
            f"{state.job_dir(state_dir, job_id)}/{state.STATE}"
        ):
            lock.release_and_remove()


def _release_trees(state_dir: str, info: dict[str, str], config: Config) -> list[str]:
    from jobns.launcher.backing import fs
    from jobns.launcher.model.job import Job, User, hostname
    from jobns.launcher.model.plan import build

    try:
        uid, gid = int(info["uid"]), int(info["gid"])
        user = User(str(uid), uid, gid, (gid,), "/")
        job = Job(info["job_id"], user, hostname(), info["layout"], bool(info["no_rm"]))
        plan = build(config, job)
    except (KeyError, ValueError, JobnsError) as e:
        return [f"read hold of container {info.get('container')}: {e}; remove it by hand"]
    errors: list[str] = []
    for tree in plan.trees:
        try:
            handle = fs.acquire_tree(tree, uid, gid, create=False, lock=True)
        except JobnsError:
            continue  # gone already, or not what jobns made: not ours to remove
        errors += fs.release_tree(handle, adopted(state_dir, info["job_id"]))
    return errors


def adopted(state_dir: str, job_id: str) -> Callable[[], bool]:
    """For fs.release_tree: has a prolog (jobns setup) set the job up since, and so taken
    over its trees (its epilog removes them)?"""
    from jobns.launcher.protocol.state import is_set_up

    return lambda: is_set_up(state_dir, job_id)


def unused(state_dir: str, job_id: str) -> bool:
    """No container holds the job (its hold directory is empty or absent); tidies it."""
    try:
        os.rmdir(f"{holds_dir(state_dir)}/{job_id}")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def sweep(state_dir: str, config: Config) -> list[str]:
    """For `jobns gc`: finish the holds whose holder is gone and whose poststop never ran
    (holder killed, runtime crashed): their trees are released like a finishing task's.
    Returns error messages."""
    errors: list[str] = []
    try:
        jobs = sorted(os.listdir(holds_dir(state_dir)))
    except FileNotFoundError:
        return errors
    for job_id in jobs:
        try:
            names = sorted(os.listdir(f"{holds_dir(state_dir)}/{job_id}"))
        except OSError:
            continue
        for cid in names:
            if cid.startswith("."):
                continue  # a hold being written (or left by a hook killed while writing it)
            if live(state_dir, job_id, cid) is None:
                errors += release(state_dir, job_id, cid, config)
    return errors
