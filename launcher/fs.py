"""Safe creation, verification, locking and removal of a job's directories.

Root runs this code on paths a user can influence (/tmp is world-writable; the
job user owns what is inside its tree), so (see CVE-2023-41914, CVE-2018-6954):
- every walk is fd-relative (dir_fd=), every open is O_NOFOLLOW|O_DIRECTORY;
- a tree is built under a temporary name, owned by root until complete, then
  chowned leaf-first and renamed into place with RENAME_NOREPLACE, so nothing
  half-made is ever visible and nothing pre-existing is ever replaced;
- a pre-existing tree is used only if it is exactly what jobns makes (real
  directories, owned by the job user, exact modes); anything else is refused;
- removal never crosses a file-system boundary and never follows a link.

Concurrent tasks of one job share a tree: each holds a shared flock on the
tree root while it runs; the last one to leave wins the exclusive lock and
removes the tree.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from launcher import libc
from launcher.errors import JobnsError
from launcher.plan import SCRATCH_MODE, TOP_MODE

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 48  # deeper directories are moved up to the tree root, so fds stay bounded

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.plan import Tree


def open_base(path: str, what: str) -> int:
    """A configured base directory (trusted: it comes from the site config)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(f"open {what} {path}: {e.strerror}; create it or set {what} in "
                         "the config") from None


def open_dir(dir_fd: int, name: str, path: str) -> int:
    """Open a directory entry without following a symlink; clear errors otherwise."""
    try:
        return os.open(name, O_DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise JobnsError(f"refuse {path}: it is a symbolic link, not a directory jobns "
                             "made; remove it or use another job id") from None
        if e.errno == errno.ENOTDIR:
            # O_DIRECTORY reports a symlink as ENOTDIR before O_NOFOLLOW can say ELOOP.
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise JobnsError(f"refuse {path}: it is a symbolic link, not a directory "
                                 "jobns made; remove it or use another job id") from None
            raise JobnsError(f"refuse {path}: it exists and is not a directory; remove it "
                             "or use another job id") from None
        if e.errno != errno.ENOENT:  # ENOENT is the caller's to handle (create it)
            raise JobnsError(f"open {path}: {e.strerror} (jobns needs root's usual "
                             "privileges, or the job user's own directory)") from None
        raise


def _check(fd: int, path: str, uid: int, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != uid or stat.S_IMODE(st.st_mode) != mode:
        raise JobnsError(
            f"refuse {path}: it exists with owner uid {st.st_uid} and mode "
            f"{stat.S_IMODE(st.st_mode):04o}, not what jobns makes (uid {uid}, mode {mode:04o}); "
            "remove it or use another job id")


def _owner_fix(fd: int, uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)


class TreeHandle:
    """An open, verified, share-locked job tree."""

    __slots__ = ("created", "fd", "parent_fds", "tree")

    def __init__(self, tree: Tree, parent_fds: list[int], fd: int, created: bool) -> None:
        self.tree = tree
        self.parent_fds = parent_fds  # base first; the last one holds the tree root
        self.fd = fd
        self.created = created        # made by this call (not found in place)

    def child_path(self, child: str) -> str:
        return f"{self.tree.path}/{child}" if child else self.tree.path

    def close(self) -> None:
        for fd in (self.fd, *self.parent_fds):
            os.close(fd)
        self.fd = -1
        self.parent_fds = []


def identity(handle: TreeHandle, child: str) -> tuple[int, int]:
    """(st_dev, st_ino) of the tree root or one of its children."""
    if not child:
        st = os.fstat(handle.fd)
    else:
        st = os.stat(child, dir_fd=handle.fd, follow_symlinks=False)
    return st.st_dev, st.st_ino


def reopen(handle: TreeHandle, child: str, expected: tuple[int, int]) -> tuple[int, str]:
    """Open a tree directory again by path (e.g. in a new mount namespace) and make
    sure it is the one verified before; returns (fd, path)."""
    tree = handle.tree
    path = handle.child_path(child)
    fd = open_base(tree.base, f"{tree.role} base")
    try:
        for part in (*tree.rel.split("/"), *([child] if child else [])):
            nxt = open_dir(fd, part, path)
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if (st.st_dev, st.st_ino) != expected:
        os.close(fd)
        raise JobnsError(f"refuse {path}: it was replaced while the job was being set up")
    return fd, path


def ensure_plain_dir(parent_fd: int, name: str, path: str, uid: int, gid: int) -> int:
    """Make-or-verify one directory (mode TOP_MODE, owned by uid) and open it.

    Made like a tree: complete (mode, owner) under a temporary name, then renamed into
    place, because several nodes make the per-node layout's shared job-ID/ at once and
    must never see one another's half-made (still root-owned) directory.
    """
    for _attempt in range(5):
        try:
            fd = open_dir(parent_fd, name, path)
        except FileNotFoundError:
            pass
        else:
            try:
                _check(fd, path, uid, TOP_MODE)
            except BaseException:
                os.close(fd)
                raise
            return fd
        tmp = f".{name}.jobns-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(tmp, 0o700, dir_fd=parent_fd)
            tfd = open_dir(parent_fd, tmp, path)
            try:
                os.fchmod(tfd, TOP_MODE)  # the umask may have narrowed it
                _owner_fix(tfd, uid, gid)
            finally:
                os.close(tfd)
            libc.rename_noreplace(parent_fd, tmp, name)
        except OSError as e:
            remove_entry(parent_fd, tmp, f"{path} (temporary)")
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise JobnsError(_create_failed(path, e)) from None
        # made by us or by another node meanwhile: open and verify it either way
    raise JobnsError(f"create {path}: it kept disappearing while being set up; try again")


def _create_failed(path: str, e: OSError) -> str:
    hint = "check the base directory's owner and mode, or pick another base in the config"
    return f"create {path}: {e.strerror}; {hint}"


def _build_temp(parent_fd: int, tree: Tree, uid: int, gid: int) -> str:
    """Make the whole tree under a temporary name; return that name."""
    tmp = f".{tree.name}.jobns-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.mkdir(tmp, 0o700, dir_fd=parent_fd)
    except OSError as e:
        raise JobnsError(_create_failed(tree.path, e)) from None
    try:
        fd = os.open(tmp, O_DIR, dir_fd=parent_fd)
        try:
            for child in tree.children:
                os.mkdir(child, 0o700, dir_fd=fd)
                cfd = os.open(child, O_DIR, dir_fd=fd)
                try:
                    os.fchmod(cfd, SCRATCH_MODE)
                    _owner_fix(cfd, uid, gid)
                finally:
                    os.close(cfd)
            os.fchmod(fd, TOP_MODE)
            _owner_fix(fd, uid, gid)  # the root last: until now the user could not enter
        finally:
            os.close(fd)
    except BaseException as e:
        remove_entry(parent_fd, tmp, f"{tree.path} (temporary)")
        if isinstance(e, OSError):
            raise JobnsError(_create_failed(tree.path, e)) from None
        raise
    return tmp


def _verify_tree(fd: int, tree: Tree, uid: int) -> None:
    """The tree open at fd is exactly what jobns makes, or JobnsError."""
    _check(fd, tree.path, uid, TOP_MODE)
    for child in tree.children:
        cpath = f"{tree.path}/{child}"
        try:
            cfd = open_dir(fd, child, cpath)
        except FileNotFoundError:
            raise JobnsError(f"refuse {tree.path}: it exists but has no {child}/, so jobns "
                             "did not make it; remove it or use another job id") from None
        try:
            _check(cfd, cpath, uid, SCRATCH_MODE)
        finally:
            os.close(cfd)


def _still_linked(parent_fd: int, name: str, fd: int) -> bool:
    try:
        now = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def acquire_tree(tree: Tree, uid: int, gid: int, *, create: bool = True,
                 lock: bool = True) -> TreeHandle:
    """Create or verify a tree, open it and (with lock) hold a shared flock on it.

    Raises JobnsError for anything jobns must not use; nothing is left behind.
    """
    base_fd = open_base(tree.base, f"{tree.role} base")
    fds = [base_fd]
    try:
        for i, part in enumerate(tree.parents):
            sub = f"{tree.base.rstrip('/')}/{'/'.join(tree.parents[:i + 1])}"
            fds.append(ensure_plain_dir(fds[-1], part, sub, uid, gid))
        parent = fds[-1]
        created = False
        for _attempt in range(20):
            try:
                fd = open_dir(parent, tree.name, tree.path)
            except FileNotFoundError:
                if not create:
                    raise JobnsError(f"open {tree.path}: no such directory; was the job set "
                                     "up on this node (jobns setup)?") from None
                tmp = _build_temp(parent, tree, uid, gid)
                try:
                    libc.rename_noreplace(parent, tmp, tree.name)
                    created = True
                except OSError as e:
                    remove_entry(parent, tmp, f"{tree.path} (temporary)")
                    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise JobnsError(_create_failed(tree.path, e)) from None
                continue  # made by us or by a concurrent task: verify it either way
            try:
                if lock:
                    # Lock before looking inside: the job's last task removes a tree while
                    # holding it exclusively, so we never judge one half removed.
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    if not _still_linked(parent, tree.name, fd):
                        os.close(fd)  # removed while we waited: start over
                        continue
                _verify_tree(fd, tree, uid)
            except BaseException:
                os.close(fd)
                raise
            return TreeHandle(tree, fds, fd, created)
        raise JobnsError(f"create {tree.path}: it kept disappearing while being set up "
                         "(another task of the job removing it?); try again")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def release_tree(handle: TreeHandle, adopted: Callable[[], bool] | None = None) -> list[str]:
    """Drop our hold; remove the tree if we were its last user and it is removable.

    adopted() is asked while we hold the tree exclusively: True means a prolog has
    since set the job up and owns the tree now (its epilog removes it), so we keep it.

    Returns error messages (removal goes on past failures, so one bad file does
    not keep the rest of the job's files on the node).
    """
    tree, fd = handle.tree, handle.fd
    errors: list[str] = []
    try:
        if not tree.remove:
            return errors
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return errors  # another task of this job still runs here
        parent = handle.parent_fds[-1]
        if not _still_linked(parent, tree.name, fd) or (adopted is not None and adopted()):
            return errors
        errors += remove_tree(handle)
        return errors
    finally:
        handle.close()


def remove_tree(handle: TreeHandle) -> list[str]:
    """Remove a tree we hold (no refcount: setup's rollback and teardown own it)."""
    tree = handle.tree
    errors = remove_entry(handle.parent_fds[-1], tree.name, tree.path)
    return errors + _prune_parents(tree, handle.parent_fds)


def remove_recorded(tree: Tree) -> list[str]:
    """Remove a tree by its recorded place, whatever the job left there (even a symlink
    in place of the tree is only unlinked, never followed)."""
    fds: list[int] = []
    try:
        fds.append(open_base(tree.base, f"{tree.role} base"))
        for i, part in enumerate(tree.parents):
            fds.append(open_dir(fds[-1], part,
                                f"{tree.base.rstrip('/')}/{'/'.join(tree.parents[:i + 1])}"))
    except FileNotFoundError:
        for fd in fds:
            os.close(fd)
        return []  # already gone
    except (OSError, JobnsError) as e:
        for fd in fds:
            os.close(fd)
        return [f"open {tree.path}: {e}"]
    try:
        return remove_entry(fds[-1], tree.name, tree.path) + _prune_parents(tree, fds)
    finally:
        for fd in fds:
            os.close(fd)


def _prune_parents(tree: Tree, parent_fds: list[int]) -> list[str]:
    # Per-node layout: job-ID/ goes once the last node's directory is gone.
    errors: list[str] = []
    for depth in range(len(tree.parents), 0, -1):
        try:
            os.rmdir(tree.parents[depth - 1], dir_fd=parent_fds[depth - 1])
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                errors.append(f"remove {tree.base}/{'/'.join(tree.parents[:depth])}: "
                              f"{e.strerror}")
            break
    return errors


def _open_for_clearing(parent_fd: int, name: str) -> int:
    """Open a subdirectory to empty it; an unprivileged owner first grants itself rwx."""
    try:
        fd = os.open(name, O_DIR, dir_fd=parent_fd)
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
        fd = os.open(name, O_DIR, dir_fd=parent_fd)
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


def _clear(root_fd: int, fd: int, path: str, dev: int, depth: int, deep: list[str],
           errors: list[str], fan: bool = True) -> None:
    try:
        entries = list(os.scandir(fd))
    except OSError as e:
        errors.append(f"list {path}: {e.strerror}")
        return
    subdirs: list[str] = []
    for entry in entries:
        name = entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            try:
                os.unlink(name, dir_fd=fd)
                continue
            except FileNotFoundError:
                continue
            except IsADirectoryError:
                pass  # raced into a directory: treat it as one below
            except OSError as e:
                errors.append(f"remove {path}/{name}: {e.strerror}")
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


def _fan_out(root_fd: int, fd: int, path: str, dev: int, depth: int, deep: list[str],
             errors: list[str], subdirs: list[str]) -> None:
    import threading

    todo = list(reversed(subdirs))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
            _remove_subdir(root_fd, fd, name, f"{path}/{name}", dev, depth + 1, deep, errors,
                           fan=False)

    threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _remove_subdir(root_fd: int | None, parent_fd: int, name: str, path: str, dev: int,
                   depth: int, deep: list[str], errors: list[str], fan: bool = True) -> None:
    """Empty and remove one directory. root_fd None: it is a removal's own top, so
    subtrees too deep are moved up into it (clear_dir) rather than into an ancestor."""
    try:
        sub = _open_for_clearing(parent_fd, name)
    except FileNotFoundError:
        return
    except OSError as e:
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
        errors.append(f"remove {path}: {e.strerror}")


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
        if e.errno != errno.EPERM:  # Linux says EISDIR, POSIX allows EPERM for directories
            return [f"remove {path}: {e.strerror}"]
    errors: list[str] = []
    _remove_subdir(None, parent_fd, name, path, os.fstat(parent_fd).st_dev, 0, [], errors)
    return errors
