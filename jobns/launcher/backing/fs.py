"""Safe creation, verification, locking and removal of a job's directories.

Root runs this code on paths a user can influence (/tmp is world-writable; the
job user owns what is inside its tree), so (see CVE-2023-41914, CVE-2018-6954):
- every walk is fd-relative (dir_fd=), every open is O_NOFOLLOW|O_DIRECTORY;
- a tree is built under a temporary name, owned by root until complete, then
  chowned leaf-first and renamed into place with RENAME_NOREPLACE, so nothing
  half-made is ever visible and nothing pre-existing is ever replaced;
- a pre-existing tree is used only if it is exactly what jobns makes (real
  directories, owned by the job user, exact modes); anything else is refused;
- removal (launcher.system.removal) never crosses a file-system boundary and never follows
  a link; teardown first seals a tree (root-owned, so nobody enters it any more) and
  detaches whatever was mounted inside it;
- jobns's own mounts on a tree root (a capacity) are known by the identity the kernel
  gave them when jobns mounted them (launcher.system.mountinfo.Identity, in the job record),
  never by their source or mount point, which a user's FUSE mount can copy; anything
  else mounted on a tree root is looked at only through O_PATH fds and their mount ids
  (which ask its file system nothing) and detached through that very fd.

Concurrent tasks of one job share a tree: each holds a shared flock on the
tree root while it runs; the last one to leave wins the exclusive lock and
removes the tree.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from jobns.launcher.model.plan import SCRATCH_MODE, TOP_MODE
from jobns.launcher.system import libc
from jobns.launcher.system.errors import JobnsError, UserError
from jobns.launcher.system.locking import flock_within
from jobns.launcher.system.removal import (
    MAX_STACK,
    O_DIR,
    O_LOOK,
    clear_dir,
    detach_at,
    detached,
    detaching,
    open_dir_here,
    remove_entry,
    stat_here,
)

__all__ = ["O_DIR", "clear_dir", "detach_at", "remove_entry"]

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from jobns.launcher.model.plan import Tree
    from jobns.launcher.system.mountinfo import Mount


def open_base(path: str, what: str) -> int:
    """A configured base directory (trusted: it comes from the site config)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(
            f"open {what} {path}: {e.strerror}; create it or set {what} in the config"
        ) from None


def open_dir(dir_fd: int, name: str, path: str) -> int:
    """Open a directory entry without following a symlink; clear errors otherwise."""
    try:
        return os.open(name, O_DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise JobnsError(
                f"refuse {path}: it is a symbolic link, not a directory jobns "
                "made; remove it or use another job id"
            ) from None
        if e.errno == errno.ENOTDIR:
            # O_DIRECTORY reports a symlink as ENOTDIR before O_NOFOLLOW can say ELOOP.
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise JobnsError(
                    f"refuse {path}: it is a symbolic link, not a directory "
                    "jobns made; remove it or use another job id"
                ) from None
            raise JobnsError(
                f"refuse {path}: it exists and is not a directory; remove it or use another job id"
            ) from None
        if e.errno != errno.ENOENT:  # ENOENT is the caller's to handle (create it)
            raise JobnsError(
                f"open {path}: {e.strerror} (jobns needs root's usual "
                "privileges, or the job user's own directory)"
            ) from None
        raise


def _check(fd: int, path: str, uid: int, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != uid or stat.S_IMODE(st.st_mode) != mode:
        raise JobnsError(
            f"refuse {path}: it exists with owner uid {st.st_uid} and mode "
            f"{stat.S_IMODE(st.st_mode):04o}, not what jobns makes (uid {uid}, mode {mode:04o}); "
            "remove it or use another job id"
        )


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
        self.created = created  # made by this call (not found in place)

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
    except FileNotFoundError:
        os.close(fd)
        raise UserError(f"refuse {path}: it was removed while the job was being set up") from None
    except JobnsError as e:
        os.close(fd)
        raise UserError(str(e)) from None
    except BaseException:
        os.close(fd)
        raise
    if (st.st_dev, st.st_ino) != expected:
        os.close(fd)
        raise UserError(f"refuse {path}: it was replaced while the job was being set up")
    return fd, path


MOVED = "~moved-"  # a squatter's entry, moved aside: <name>~moved-<hex>
RETIRED = "~removing-"  # a tree teardown could not empty (a writer outside the job)


def move_aside(
    parent_fd: int, name: str, path: str, aside: list[str], as_name: str | None = None
) -> None:
    """Rename an entry jobns did not make out of the way, in the same directory, keeping
    its owner, mode and content: a squatter never blocks, receives or loses anything.
    '~' is never part of a job id, so the new name is nobody's job directory. as_name:
    the job tree's name when the entry sits under another (a temporary) name."""
    new = f"{as_name or name}{MOVED}{os.urandom(4).hex()}"
    for _attempt in range(8):
        try:
            libc.rename_noreplace(parent_fd, name, new)  # the entry, never a link target
            break
        except FileNotFoundError:
            return  # gone meanwhile: nothing to move
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise JobnsError(
                    f"move {path} aside (it is not what jobns makes for this job): {e.strerror}"
                ) from None
            # A mount point (her FUSE mount on a future job's directory): detach it first,
            # through an fd that never touches her file system.
            detach_at(parent_fd, name)
    else:
        raise JobnsError(f"move {path} aside: it is still a mount point after detaching")
    try:
        st = os.stat(new, dir_fd=parent_fd, follow_symlinks=False)
        who = f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"
    except OSError:
        who = "owner unknown"
    aside.append(
        f"moved {path} aside to {new}: it was not made by jobns for this job "
        f"({who}); its owner finds it there"
    )


def _mounted_at_or_below(path: str) -> bool:
    from jobns.launcher.system import mountinfo  # teardown and setup only, not a task

    return bool(mountinfo.under(path))


def ensure_plain_dir(
    parent_fd: int, name: str, path: str, uid: int, gid: int, aside: list[str] | None = None
) -> int:
    """Make-or-verify one directory (mode TOP_MODE, owned by uid) and open it. With
    `aside` (root's setup), anything else found there is moved aside, not refused.

    Made like a tree: complete (mode, owner) under a temporary name, then renamed into
    place, because several nodes make the per-node layout's shared job-ID/ at once and
    must never see one another's half-made (still root-owned) directory.
    """
    for _attempt in range(5):
        bad = False
        try:
            fd = open_dir(parent_fd, name, path)
        except FileNotFoundError:
            pass
        except JobnsError:
            if aside is None:
                raise
            bad = True
        else:
            try:
                _check(fd, path, uid, TOP_MODE)
            except JobnsError:
                os.close(fd)
                if aside is None:
                    raise
                bad = True
            except BaseException:
                os.close(fd)
                raise
            else:
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
            if bad:
                raise FileExistsError(errno.EEXIST, "not ours")  # swap it out below
            libc.rename_noreplace(parent_fd, tmp, name)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and aside is not None:
                _swap_in_dir(parent_fd, tmp, name, path, uid, aside)
                continue
            remove_entry(parent_fd, tmp, f"{path} (temporary)")
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise JobnsError(_create_failed(path, e)) from None
        # made by us or by another node meanwhile: open and verify it either way
    raise JobnsError(f"create {path}: it kept disappearing while being set up; try again")


def _swap_in_dir(
    parent_fd: int, tmp: str, name: str, path: str, uid: int, aside: list[str]
) -> None:
    """ensure_plain_dir's _swap_in: ours in place of what appeared at `name`, which is
    moved aside, unless it is another node's good job-ID/ (then it stays, ours goes)."""
    try:
        libc.rename_exchange(parent_fd, tmp, name)
    except OSError as e:
        remove_entry(parent_fd, tmp, f"{path} (temporary)")
        if e.errno == errno.EBUSY:
            move_aside(parent_fd, name, path, aside)
        elif e.errno != errno.ENOENT:
            raise JobnsError(_create_failed(path, e)) from None
        return
    try:
        fd = open_dir(parent_fd, tmp, path)
        try:
            _check(fd, path, uid, TOP_MODE)
            good = True
        finally:
            os.close(fd)
    except (OSError, JobnsError):
        good = False
    if good:
        libc.rename_exchange(parent_fd, tmp, name)
        remove_entry(parent_fd, tmp, f"{path} (temporary)")
    else:
        move_aside(parent_fd, tmp, path, aside, as_name=name)


def _create_failed(path: str, e: OSError) -> str:
    hint = "check the base directory's owner and mode, or pick another base in the config"
    return f"create {path}: {e.strerror}; {hint}"


def _build_temp(parent_fd: int, tree: Tree, uid: int, gid: int, root_owned: bool = False) -> str:
    """Make the whole tree under a temporary name; return that name. root_owned: the
    tree root stays root's (a capacity file system is mounted on it next, and a root
    entry in a sticky base cannot be renamed away by the user meanwhile)."""
    tmp = f".{tree.name}.jobns-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.mkdir(tmp, 0o700, dir_fd=parent_fd)
    except OSError as e:
        raise JobnsError(_create_failed(tree.path, e)) from None
    try:
        fd = os.open(tmp, O_DIR, dir_fd=parent_fd)
        try:
            make_children(fd, tree, uid, gid)
            os.fchmod(fd, TOP_MODE)
            if not root_owned:
                _owner_fix(fd, uid, gid)  # the root last: until now the user could not enter
        finally:
            os.close(fd)
    except BaseException as e:
        remove_entry(parent_fd, tmp, f"{tree.path} (temporary)")
        if isinstance(e, OSError):
            raise JobnsError(_create_failed(tree.path, e)) from None
        raise
    return tmp


def make_children(fd: int, tree: Tree, uid: int, gid: int) -> None:
    """Make the tree's children (tmp/, var_tmp/) in the directory open at fd: mode
    SCRATCH_MODE, owned by the job user (when root makes them)."""
    for child in tree.children:
        os.mkdir(child, 0o700, dir_fd=fd)
        cfd = os.open(child, O_DIR, dir_fd=fd)
        try:
            os.fchmod(cfd, SCRATCH_MODE)  # the umask may have narrowed it
            _owner_fix(cfd, uid, gid)
        finally:
            os.close(cfd)


def _verify_tree(fd: int, tree: Tree, uid: int) -> None:
    """The tree open at fd is exactly what jobns makes, or JobnsError."""
    _check(fd, tree.path, uid, TOP_MODE)
    for child in tree.children:
        cpath = f"{tree.path}/{child}"
        try:
            cfd = open_dir(fd, child, cpath)
        except FileNotFoundError:
            raise JobnsError(
                f"refuse {tree.path}: it exists but has no {child}/, so jobns "
                "did not make it; remove it or use another job id"
            ) from None
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


def acquire_tree(
    tree: Tree,
    uid: int,
    gid: int,
    *,
    create: bool = True,
    lock: bool = True,
    aside: list[str] | None = None,
    fresh: bool = False,
) -> TreeHandle:
    """Create or verify a tree, open it and (with lock) hold a shared flock on it.

    aside (root's setup): an entry at the tree's place (or a parent's) that is not
    exactly what jobns makes for this user is moved aside (move_aside), never refused,
    used or deleted; the messages are appended. fresh: also move aside a matching tree
    (a capacity needs one made now), which is then left root-owned for the mount.
    Raises JobnsError for anything jobns must not use; nothing is left behind.
    """
    base_fd = open_base(tree.base, f"{tree.role} base")
    fds = [base_fd]
    try:
        for i, part in enumerate(tree.parents):
            sub = f"{tree.base.rstrip('/')}/{'/'.join(tree.parents[: i + 1])}"
            fds.append(ensure_plain_dir(fds[-1], part, sub, uid, gid, aside))
        parent = fds[-1]
        created = False
        for _attempt in range(20):
            if aside is not None and _mounted_at_or_below(tree.path):
                # Her FUSE mount on (or in) a future job's directory: never opened (a
                # stalled server would hang the prolog), moved aside with what is in it.
                move_aside(parent, tree.name, tree.path, aside)
                continue
            try:
                fd = open_dir(parent, tree.name, tree.path)
            except FileNotFoundError:
                if not create:
                    raise JobnsError(
                        f"open {tree.path}: no such directory; was the job set "
                        "up on this node (jobns setup)?"
                    ) from None
                tmp = _build_temp(parent, tree, uid, gid, root_owned=fresh)
                try:
                    libc.rename_noreplace(parent, tmp, tree.name)
                    created = True
                except OSError as e:
                    if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and aside is not None:
                        # Someone made it between our look and our rename (a squatter in
                        # a loop): swap ours in atomically, then move theirs aside.
                        created = _swap_in(parent, tmp, tree, uid, aside)
                        continue
                    remove_entry(parent, tmp, f"{tree.path} (temporary)")
                    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise JobnsError(_create_failed(tree.path, e)) from None
                continue  # made by us or by a concurrent task: verify it either way
            except JobnsError:
                if aside is None:
                    raise
                # Not ours (a symlink, a file, someone else's directory): ours goes in its
                # place in one atomic swap, so a squatter in a loop cannot win the race.
                created = _swap_in(
                    parent, _build_temp(parent, tree, uid, gid, fresh), tree, uid, aside
                )
                continue
            if fresh and created:
                return TreeHandle(tree, fds, fd, created)  # root-owned until its mount
            try:
                if lock:
                    # Lock before looking inside: the job's last task removes a tree while
                    # holding it exclusively, so we never judge one half removed. Root
                    # (setup, recover, the hook, gc) waits a bounded time: the tree root is
                    # hers, so her flock on it (pre-made, or her capacity once it is
                    # mounted and handed to her) must not hang a root program.
                    _share_lock(fd, tree.path, bounded=aside is not None or os.geteuid() == 0)
                    if not _still_linked(parent, tree.name, fd):
                        os.close(fd)  # removed while we waited: start over
                        continue
                _verify_tree(fd, tree, uid)
                if fresh and not created:
                    raise JobnsError(f"refuse {tree.path}: a capacity needs a tree made now")
            except JobnsError:
                os.close(fd)
                if aside is None:
                    raise
                created = _swap_in(
                    parent,
                    _build_temp(parent, tree, uid, gid, fresh),
                    tree,
                    uid,
                    aside,
                    keep_legit=False,
                )
                continue
            except BaseException:
                os.close(fd)
                raise
            return TreeHandle(tree, fds, fd, created)
        raise JobnsError(
            f"create {tree.path}: it kept disappearing while being set up "
            "(another task of the job removing it?); try again"
        )
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


LOCK_WAIT = 5.0  # seconds root's setup waits for a tree another process holds exclusively


def _share_lock(fd: int, path: str, bounded: bool) -> None:
    if not bounded:
        fcntl.flock(fd, fcntl.LOCK_SH)
    elif not flock_within(fd, fcntl.LOCK_SH, LOCK_WAIT, 0.05):
        # Only its owner (the job's user) or root can open it to lock it.
        raise UserError(
            f"refuse {path}: its owner holds it locked (flock) for more than "
            f"{LOCK_WAIT:.0f} s; release the lock and submit the job again"
        )


def _swap_in(
    parent: int, tmp: str, tree: Tree, uid: int, aside: list[str], keep_legit: bool = True
) -> bool:
    """Put our complete tree (at tmp) in place of whatever is at its name, and move that
    aside; unless (keep_legit) it is a tree jobns made for this user meanwhile (a
    concurrent task of the job), which is put back and used. True if ours is in place."""
    try:
        libc.rename_exchange(parent, tmp, tree.name)
    except OSError as e:
        remove_entry(parent, tmp, f"{tree.path} (temporary)")
        if e.errno == errno.ENOENT:
            return False  # gone meanwhile: the next round makes ours
        if e.errno == errno.EBUSY:  # a mount point: move_aside detaches it first
            move_aside(parent, tree.name, tree.path, aside)
            return False
        raise JobnsError(_create_failed(tree.path, e)) from None
    try:
        fd = open_dir(parent, tmp, tree.path) if keep_legit else -1
    except (OSError, JobnsError):
        fd = -1
    if fd >= 0:
        try:
            _verify_tree(fd, tree, uid)
            legit = True
        except JobnsError:
            legit = False
        finally:
            os.close(fd)
        if legit:
            libc.rename_exchange(parent, tmp, tree.name)
            remove_entry(parent, tmp, f"{tree.path} (temporary)")
            return False
    move_aside(parent, tmp, tree.path, aside, as_name=tree.name)
    return True


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


PLAIN, OURS, FOREIGN = "plain", "ours", "foreign"  # what is on top of a tree root


def nothing_ours(_m: Mount) -> bool:
    """The owner test of a tree jobns mounted nothing on."""
    return False


def _walk_parents(tree: Tree, detach: bool = False) -> list[int]:
    """fds of the base and of each parent of the tree, each opened in the mount of the one
    before, never through a symlink; a file system mounted on a parent (her FUSE mount on
    the per-node layout's job-ID/) is never entered: with detach it is detached, else
    OSError(EXDEV). The list stops short where a parent is gone, or is a link or a file
    in place of the directory: the job's user replaced her own directory (the per-node
    layout's job-ID/); what she moved away is hers, nothing of root's is reached through
    a link (rule 1), and failing the epilog for it would drain the node (rule 2)."""
    fds = [open_base(tree.base, f"{tree.role} base")]
    try:
        for i, part in enumerate(tree.parents):
            path = f"{tree.base.rstrip('/')}/{'/'.join(tree.parents[: i + 1])}"
            fds.append(
                detaching(open_dir_here, fds[-1], part, path)
                if detach
                else open_dir_here(fds[-1], part)
            )
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            for fd in fds:
                os.close(fd)
            raise
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _top_at(
    parent_fd: int, tree: Tree, ours: Callable[[Mount], bool], detach: bool
) -> tuple[int, str] | None:
    """What is on top of parent/<tree.name> now: (an O_PATH fd of it, PLAIN | OURS |
    FOREIGN), None if nothing is there. Only the kernel's mount ids are compared (fdinfo:
    no request reaches any FUSE server); with detach, every FOREIGN mount on top is
    detached through the very fd that was looked at (never by a path: not hers, stacked
    since, nor ours, should she unmount hers meanwhile), until a PLAIN or OURS is there."""
    from jobns.launcher.system import mountinfo  # teardown, status and gc only, not a task

    below = mountinfo.mount_id(parent_fd)
    for _ in range(MAX_STACK):
        try:
            fd = os.open(tree.name, O_LOOK, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        mid = mountinfo.mount_id(fd)
        m = None if mid == below else mountinfo.by_id(mid)
        kind = PLAIN if mid == below else OURS if m is not None and ours(m) else FOREIGN
        if kind != FOREIGN or not detach:
            return fd, kind
        try:
            libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
            what = f"{m.fstype} {m.source!r}" if m is not None else "a file system"
            detached.append(f"detached {what} from {tree.path} (not jobns's)")
        except OSError:
            pass  # gone meanwhile (she unmounted it): look again
        finally:
            os.close(fd)
    raise JobnsError(
        f"detach what is mounted on {tree.path}: still not jobns's after {MAX_STACK} "
        "detaches; unmount it by hand (umount -l) and run jobns teardown again"
    )


def root_top(
    tree: Tree, ours: Callable[[Mount], bool], detach: bool = False
) -> tuple[int, str] | None:
    """What is on top of the tree root now (see _top_at); None if the tree or a parent is
    gone, or (without detach) a parent cannot be reached without entering a mount."""
    try:
        fds = _walk_parents(tree, detach)
    except OSError:
        return None
    try:
        if len(fds) != len(tree.parents) + 1:
            return None
        return _top_at(fds[-1], tree, ours, detach)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def open_root(
    tree: Tree, ours: Callable[[Mount], bool], detach: bool = False
) -> tuple[int, str] | None:
    """The tree root opened for reading, and whether it is OURS (a mount of jobns's) or
    PLAIN (a directory of its parent's file system): through "." of the O_PATH fd
    root_top looked at, which never crosses into a mount made on it since. None if it is
    gone, not a directory, or (without detach) someone else's mount."""
    top = root_top(tree, ours, detach)
    if top is None:
        return None
    look, kind = top
    try:
        if kind == FOREIGN:
            return None
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=look), kind
    except OSError:
        return None
    finally:
        os.close(look)


def new_mount(handle: TreeHandle, fstype: str) -> tuple[int, Mount]:
    """The file system just mounted (through handle.fd) on the tree root: an fd of its
    root and its mount table entry, whose identity (launcher.system.mountinfo.Identity) the job
    record keeps. Taken only if the mount on top of the tree root is a `fstype` mounted
    right on the directory handle holds: a user's mount stacked on it meanwhile is never
    taken for it, nor entered (UserError: the job is refused)."""
    from jobns.launcher.system import mountinfo  # setup only, not a task

    tree = handle.tree
    replaced = UserError(f"refuse {tree.path}: it was replaced while its capacity was being set up")
    try:
        look = os.open(tree.name, O_LOOK, dir_fd=handle.parent_fds[-1])
    except OSError:
        raise replaced from None
    try:
        m = mountinfo.by_id(mountinfo.mount_id(look))
        if m is None or m.fstype != fstype or m.parent_id != str(mountinfo.mount_id(handle.fd)):
            raise replaced
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=look), m
    finally:
        os.close(look)


def seal(tree: Tree, ours: Callable[[Mount], bool]) -> None:
    """Make a tree root root's own (0700) so nobody enters it by path any more (an
    outside writer cannot refill what teardown removes, nor mount anything on it: SECURITY.md
    rule 6). Whatever a user mounted on the root is detached first, so the seal lands on
    jobns's own mount (ours) or the tree's own directory, and never on hers."""
    got = open_root(tree, ours, detach=True)
    if got is None:
        return
    fd, _ = got
    try:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, TOP_MODE)
    except OSError:
        pass  # a read-only capacity left by an earlier attempt: nobody can write there
    finally:
        os.close(fd)


def remove_recorded(
    tree: Tree, ours: Callable[[Mount], bool] = nothing_ours, prune: bool = True
) -> list[str]:
    """Remove a tree by its recorded place, whatever the job left there (even a symlink
    in place of the tree is only unlinked, never followed; whatever a user mounted on or
    in it is detached, never entered). A mount of jobns's own (ours: a capacity that
    could not be released) is never detached here: that would keep its memory alive.

    What cannot be removed because someone keeps writing into it (a process outside the
    job with its cwd there) is not the node's problem: the tree is renamed
    <name>~removing-<hex> (root's, sealed) for `jobns gc`, and teardown goes on.
    prune: remove the parents (the per-node layout's job-ID/) once empty; the release
    process does that itself, under the job's lock (launcher.lifecycle.release)."""
    try:
        fds = _walk_parents(tree, detach=True)
    except (OSError, JobnsError) as e:
        return [f"open {tree.path}: {e}"]
    try:
        if len(fds) != len(tree.parents) + 1:
            return []  # already gone
        top = _top_at(fds[-1], tree, ours, detach=True)
        if top is None:
            return _prune_parents(tree, fds) if prune else []
        os.close(top[0])
        if top[1] == OURS:
            return [f"remove {tree.path}: jobns's capacity is still mounted on it"]
        errors: list[str] = []
        for _attempt in range(3):
            errors = remove_entry(fds[-1], tree.name, tree.path)
            if not errors:
                break
        busy = os.strerror(errno.ENOTEMPTY)
        # Only "not empty": someone keeps refilling it. Any other error is the node's.
        if errors and all(busy in e for e in errors) and retire(fds[-1], tree) is not None:
            errors = []
        return errors + (_prune_parents(tree, fds) if prune else [])
    except (OSError, JobnsError) as e:
        return [f"remove {tree.path}: {e}"]
    finally:
        for fd in fds:
            os.close(fd)


def retire(parent_fd: int, tree: Tree) -> str | None:
    """Rename a sealed tree that would not empty out of the job's way; its new name, or
    None if it is not a sealed (root-owned) directory or could not be renamed."""
    try:
        st = stat_here(parent_fd, tree.name)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            return None
        new = f"{tree.name}{RETIRED}{os.urandom(4).hex()}"
        libc.rename_noreplace(parent_fd, tree.name, new)
    except OSError:
        return None
    return new


def _prune_parents(tree: Tree, parent_fds: list[int]) -> list[str]:
    # Per-node layout: job-ID/ goes once the last node's directory is gone.
    errors: list[str] = []
    for depth in range(len(tree.parents), 0, -1):
        try:
            os.rmdir(tree.parents[depth - 1], dir_fd=parent_fds[depth - 1])
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                errors.append(f"remove {tree.base}/{'/'.join(tree.parents[:depth])}: {e.strerror}")
            break
    return errors


def lookalike(
    tree: Tree, through: Callable[[Mount], bool] = nothing_ours
) -> tuple[os.stat_result, bool] | None:
    """A directory with exactly the modes jobns makes a tree with, looked at without
    following a link and without entering anything mounted on it, its children or its
    parents (a user's stalled FUSE server there would hang us, and a tree someone
    mounted on is not proven dead), except a mount on its root that through() accepts
    (root's own: a [[dirs]] cover), which is looked at instead: (its stat, whether a
    task holds it: a standalone `jobns run` holds a shared flock on its trees). None if
    it is not one."""
    opened = open_root(tree, through)
    if opened is None:
        return None
    fd = opened[0]
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != TOP_MODE:
            return None
        for c in tree.children:
            cst = stat_here(fd, c)
            if not stat.S_ISDIR(cst.st_mode) or stat.S_IMODE(cst.st_mode) != SCRATCH_MODE:
                return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return st, False
        except BlockingIOError:
            return st, True
    except OSError:
        return None
    finally:
        os.close(fd)


def open_parent(tree: Tree, detach: bool = False) -> int | None:
    """The directory holding the tree root, reached from its base without following a
    link and without entering a mount (with detach: a mount on a parent is detached, as
    _walk_parents does); an fd the caller closes, or None if it is gone or not reachable
    so."""
    try:
        fds = _walk_parents(tree, detach)
    except (OSError, JobnsError):
        return None
    if len(fds) != len(tree.parents) + 1:
        for fd in fds:
            os.close(fd)
        return None
    for fd in fds[:-1]:
        os.close(fd)
    return fds[-1]
