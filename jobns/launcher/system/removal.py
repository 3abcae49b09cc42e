"""Removing a directory tree that a user controls, from an fd, as root.

Every step is relative to a directory fd opened with O_NOFOLLOW, so a symlink swapped
in anywhere is unlinked, never followed; removal never enters another file system
mounted in the tree: a mount it meets (a user's FUSE mount, made from the host, even
during the removal) is detached through an O_PATH fd of its mount point, which sends
nothing to its server, and the removal goes on; directories deeper than MAX_DEPTH are
moved up so the number of open fds stays bounded; and it goes on past a failure, so one
bad file does not keep the rest of a job's files on the node.
"""

from __future__ import annotations

import errno
import os
import stat

from jobns.launcher.system import libc

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_LOOK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # sends nothing to any file system
MAX_DEPTH = 48  # deeper directories are moved up to the tree root, so fds stay bounded
MAX_STACK = 4096  # mounts on one point we detach before giving up (> fuse.conf mount_max)

# What was detached (one line each, for the epilog's log): teardown takes them.
detached: list[str] = []


_OPENAT2 = [True]  # until the kernel says ENOSYS


def open_here(parent_fd: int, name: str, flags: int = O_DIR) -> int:
    """Open parent/name without following a symlink and without crossing into a file
    system mounted there: EXDEV, before anything of that file system is touched (a
    stalled FUSE server a user mounted in her tree must not hang root)."""
    if _OPENAT2[0]:
        try:
            return libc.openat2(
                parent_fd, name, flags, libc.RESOLVE_NO_XDEV | libc.RESOLVE_NO_SYMLINKS
            )
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
            _OPENAT2[0] = False
    # Before Linux 5.6: one component at a time, look (O_PATH asks the file system
    # nothing) and compare mount ids, then open "." of what we looked at, which never
    # crosses a mount made on it since.
    from jobns.launcher.system.mountinfo import mount_id

    here = os.dup(parent_fd)
    try:
        for part in name.split("/"):
            fd = os.open(part, O_LOOK, dir_fd=here)
            os.close(here)
            here = fd
            if mount_id(fd) != mount_id(parent_fd):
                raise OSError(errno.EXDEV, f"open {name}: a file system is mounted there")
        if flags & os.O_PATH:
            return os.dup(here)
        return os.open(".", flags & ~os.O_NOFOLLOW, dir_fd=here)
    finally:
        os.close(here)


def open_dir_here(parent_fd: int, name: str) -> int:
    """A subdirectory, opened with open_here (EXDEV if something is mounted on it)."""
    return open_here(parent_fd, name, O_DIR)


def stat_here(parent_fd: int, name: str) -> os.stat_result:
    """lstat of parent/name that asks no file system mounted on it (EXDEV instead)."""
    fd = open_here(parent_fd, name, O_LOOK)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def detach_at(parent_fd: int, name: str, path: str = "") -> bool:
    """Detach the topmost mount on parent/name, through an O_PATH fd of it (its server is
    never asked anything), never by a path; False if nothing is mounted there or it could
    not be detached (an ordinary user cannot). path: where it was, for the epilog's log
    (a note in `detached`; without it, none: a caller detaching its own mount)."""
    try:
        fd = os.open(name, O_LOOK, dir_fd=parent_fd)
    except OSError:
        return False
    try:
        from jobns.launcher.system.mountinfo import by_id, mount_id

        mid = mount_id(fd)
        if mid == mount_id(parent_fd):
            return False  # a plain entry of the parent's file system
        m = by_id(mid)
        libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
    except OSError:
        return False
    finally:
        os.close(fd)
    if path:
        what = f"{m.fstype} {m.source!r}" if m is not None else "a file system"
        detached.append(f"detached {what} from {path} (not jobns's)")
    return True


def detaching(opener: Callable[[int, str], int], parent_fd: int, name: str, path: str = "") -> int:
    """opener(parent_fd, name), an open that fails with EXDEV rather than enter a mount;
    whatever is mounted there is detached (detach_at) and the open tried again."""
    for _ in range(MAX_STACK):
        try:
            return opener(parent_fd, name)
        except OSError as e:
            if e.errno != errno.EXDEV or not detach_at(parent_fd, name, path):
                raise
    raise OSError(errno.EXDEV, f"{path or name}: still a mount point after {MAX_STACK} detaches")


def take_detached() -> list[str]:
    """The notes of what was detached since the last call."""
    out = detached[:]
    del detached[: len(out)]
    return out


def _open_for_clearing(parent_fd: int, name: str) -> int:
    """Open a subdirectory to empty it; an unprivileged owner first grants itself rwx."""
    try:
        fd = open_dir_here(parent_fd, name)
    except PermissionError:
        # Mode 000 (or similar) directory of our own: chmod it through an O_PATH fd,
        # which pins the very inode we checked and cannot be redirected by a symlink.
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                raise
            os.chmod(f"/proc/self/fd/{pfd}", 0o700)
        finally:
            os.close(pfd)
        fd = open_dir_here(parent_fd, name)
    if os.geteuid() != 0:
        st = os.fstat(fd)
        if st.st_mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
    return fd


def clear_dir(fd: int, path: str) -> list[str]:
    """Remove everything inside the directory open at fd; return what could not be removed."""
    errors: list[str] = []
    dev = os.fstat(fd).st_dev
    deep: list[str] = []
    _clear(fd, fd, path, dev, 0, deep, errors)
    # Subtrees deeper than MAX_DEPTH were renamed into this directory: clear those now.
    while deep:
        name = deep.pop()
        _remove_subdir(fd, fd, name, f"{path}/{name}", dev, 0, deep, errors)
    return errors


def _clear(
    root_fd: int,
    fd: int,
    path: str,
    dev: int,
    depth: int,
    deep: list[str],
    errors: list[str],
    fan: bool = True,
) -> None:
    try:
        # Names only, and unlink tried first: a directory answers EISDIR (one wasted
        # call per directory, against a DirEntry and a type check per file); ~18% less
        # time per tree than scandir here. unlink never follows a link it removes.
        names = os.listdir(fd)
    except OSError as e:
        errors.append(f"list {path}: {e.strerror}")
        return
    subdirs: list[str] = []
    unlink = os.unlink
    for name in names:
        try:
            unlink(name, dir_fd=fd)
            continue
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            pass
        except OSError as e:
            error = _unlink_mounted(fd, name, f"{path}/{name}", e)
            if error:
                errors.append(error)
            continue
        if depth >= MAX_DEPTH:
            moved = f".jobns-deep-{os.urandom(6).hex()}"
            try:
                os.rename(name, moved, src_dir_fd=fd, dst_dir_fd=root_fd)
                deep.append(moved)
            except OSError as e:
                errors.append(f"move up {path}/{name}: {e.strerror}")
            continue
        subdirs.append(name)
    if fan and len(subdirs) >= FAN_OUT_MIN and (os.cpu_count() or 1) > 1:
        _fan_out(root_fd, fd, path, dev, depth, deep, errors, subdirs)
        return
    for name in subdirs:
        _remove_subdir(root_fd, fd, name, f"{path}/{name}", dev, depth + 1, deep, errors, fan)


# Removing a big tree is unlink-bound, and unlink drops the GIL: the first directory
# with several subdirectories is shared out among one thread per CPU (once: workers do
# not fan out again), which makes removal faster than `rm -rf` on a multi-core node.
FAN_OUT_MIN = 4


def _fan_out(
    root_fd: int,
    fd: int,
    path: str,
    dev: int,
    depth: int,
    deep: list[str],
    errors: list[str],
    subdirs: list[str],
) -> None:
    import threading

    todo = list(reversed(subdirs))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
            _remove_subdir(
                root_fd, fd, name, f"{path}/{name}", dev, depth + 1, deep, errors, fan=False
            )

    threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _remove_subdir(
    root_fd: int | None,
    parent_fd: int,
    name: str,
    path: str,
    dev: int,
    depth: int,
    deep: list[str],
    errors: list[str],
    fan: bool = True,
) -> None:
    """Empty and remove one directory. root_fd None: it is a removal's own top, so
    subtrees too deep are moved up into it (clear_dir) rather than into an ancestor."""
    try:
        # A user's mount on it (FUSE, from the host, even made during this removal) is
        # detached, never entered.
        sub = detaching(_open_for_clearing, parent_fd, name, path)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno == errno.EXDEV:
            errors.append(f"remove {path}: a file system is mounted there; unmount it first")
        else:
            errors.append(f"open {path}: {e.strerror}")
        return
    try:
        if os.fstat(sub).st_dev != dev:
            # Never delete the contents of some other file system mounted in the tree.
            errors.append(f"remove {path}: a file system is mounted there; unmount it first")
            return
        if root_fd is None:
            errors += clear_dir(sub, path)
        else:
            _clear(root_fd, sub, path, dev, depth, deep, errors, fan)
    finally:
        os.close(sub)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        # EBUSY: mounted on since we emptied it (from a cwd inside): detach, try once more.
        if e.errno != errno.EBUSY or not detach_at(parent_fd, name, path):
            errors.append(f"remove {path}: {e.strerror}")
        else:
            try:
                os.rmdir(name, dir_fd=parent_fd)
            except OSError as again:
                errors.append(f"remove {path}: {again.strerror}")


def _unlink_mounted(fd: int, name: str, path: str, e: OSError) -> str:
    """After unlink failed with e: a file a user mounted something on (EBUSY) is detached
    and unlinked again; returns the error that remains ("" if none)."""
    for _ in range(MAX_STACK):
        if e.errno != errno.EBUSY or not detach_at(fd, name, path):
            return f"remove {path}: {e.strerror}"
        try:
            os.unlink(name, dir_fd=fd)
            return ""
        except FileNotFoundError:
            return ""
        except OSError as again:
            e = again
    return f"remove {path}: still a mount point after {MAX_STACK} detaches"


def remove_entry(parent_fd: int, name: str, path: str) -> list[str]:
    """Remove one entry (a file, or a directory and all below it) safely; return errors."""
    try:
        os.unlink(name, dir_fd=parent_fd)
        return []
    except FileNotFoundError:
        return []
    except IsADirectoryError:
        pass
    except OSError as e:
        if e.errno == errno.EBUSY:
            error = _unlink_mounted(parent_fd, name, path, e)
            return [error] if error else []
        if e.errno != errno.EPERM:  # Linux says EISDIR, POSIX allows EPERM for directories
            return [f"remove {path}: {e.strerror}"]
    errors: list[str] = []
    _remove_subdir(None, parent_fd, name, path, os.fstat(parent_fd).st_dev, 0, [], errors)
    return errors
