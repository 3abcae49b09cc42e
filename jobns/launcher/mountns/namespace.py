"""Create or join a job's mount namespace and apply a plan's binds. Runs in the task child.

Two modes (docs/design.md "Two modes, chosen by who runs it"):
- root: a plain mount namespace; the task switches to the job user afterwards.
- unprivileged: a user namespace that maps only the caller's uid and gid, plus a
  mount namespace owned by it (the way every task runs under Slurm, because
  slurmstepd drops to the job user before it execs the task).
"""

from __future__ import annotations

import errno
import os
import stat

from jobns.launcher.system import libc
from jobns.launcher.system.errors import JobnsError, UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.plan import Bind, Plan, Tree

    T = TypeVar("T")

# statvfs f_flag bits -> mount flags a bind remount must keep (a user namespace
# may not clear flags of the mount it copied: they are "locked", see mount_namespaces(7)).
_KEEP = (
    (os.ST_RDONLY, libc.MS_RDONLY),
    (os.ST_NOEXEC, libc.MS_NOEXEC),
    (os.ST_NOATIME, 1024),
    (os.ST_NODIRATIME, 2048),
    (os.ST_RELATIME, 1 << 21),
)

USERNS_SYSCTLS = "user.max_user_namespaces (and kernel.unprivileged_userns_clone on Debian)"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def userns_refusal(err: OSError) -> JobnsError:
    reason = os.strerror(err.errno) if err.errno else str(err)
    return JobnsError(
        f"create a user namespace: {reason}; unprivileged user namespaces are "
        f"disabled on this node (sysctl {USERNS_SYSCTLS}) or not allowed here "
        "(a chroot, a restricted container); ask the administrator to enable "
        "them, or to set the job up as root (jobns setup in a prolog)"
    )


def unshare(userns: bool, net_none: bool) -> None:
    """New mount (and user, and network) namespaces for this process."""
    flags = libc.CLONE_NEWNS
    if userns:
        flags |= libc.CLONE_NEWUSER
    if net_none:
        flags |= libc.CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    try:
        libc.unshare(flags)
    except OSError as e:
        if userns and e.errno in (errno.EPERM, errno.ENOSPC, errno.EINVAL, errno.EUSERS):
            raise userns_refusal(e) from None
        reason = os.strerror(e.errno or 0)
        raise JobnsError(
            f"create a mount namespace: {reason}; jobns needs root or unprivileged user namespaces"
        ) from None
    if userns:
        # Map only ourselves: the job sees no other uid, and setgroups stays denied
        # so the mapping cannot be used to drop a group that restricts access.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    # Slave, not private: NFS/autofs mounts the host makes later still appear in the
    # job (Slurm needed job_container.conf Shared=true for this); ours never leak out.
    libc.mount(None, "/", None, libc.MS_REC | libc.MS_SLAVE)


OPTION_FLAGS = {"noexec": libc.MS_NOEXEC, "ro": libc.MS_RDONLY}  # a Bind's options
_OPTION_ST = {"noexec": os.ST_NOEXEC, "ro": os.ST_RDONLY}  # the same, as statvfs shows them


def remount_flags(vfs: os.statvfs_result, options: tuple[str, ...]) -> int:
    """The flags of the remount that makes a bind nosuid,nodev plus options, keeping the
    flags it has (vfs: its statvfs) that a remount must not drop (_KEEP)."""
    flags = libc.MS_REMOUNT | libc.MS_BIND | libc.MS_NOSUID | libc.MS_NODEV
    for option in options:
        flags |= OPTION_FLAGS[option]
    for st_bit, ms_bit in _KEEP:
        if vfs.f_flag & st_bit:
            flags |= ms_bit
    return flags


def has_flags(vfs: os.statvfs_result, options: tuple[str, ...]) -> bool:
    """Is the mount (vfs: its statvfs) nosuid,nodev with these options already?"""
    want = os.ST_NOSUID | os.ST_NODEV
    for option in options:
        want |= _OPTION_ST[option]
    return vfs.f_flag & want == want


def bind(
    source_fd: int, source_path: str, target: str, options: tuple[str, ...] = (), site: bool = False
) -> None:
    """Bind the directory open at source_fd over target, then add nosuid,nodev (and the
    bind's options: noexec, ro).

    Mounting from /proc/self/fd/N uses the directory opened before any bind, so
    binding job-ID/tmp over /tmp cannot hide job-ID/var_tmp (the ordering pitfall),
    and a symlink swapped in since cannot redirect the mount. site: a [[dirs]] path,
    which may lie below directories a user can write: it is reached without following
    any symbolic link, and the mount and its remount go through fds, never the name.
    """
    if site:
        return _bind_site(source_fd, source_path, target, options)
    try:
        libc.mount(f"/proc/self/fd/{source_fd}", target, None, libc.MS_BIND)
        libc.mount(None, target, None, remount_flags(os.statvfs(target), options))
    except OSError as e:
        raise JobnsError(f"bind {source_path} over {target}: {e.strerror}") from None


def check_site_targets(plan: Plan) -> None:
    """Setup, in the host's namespaces as root, before anything is made: each extra
    directory's mount point is reachable without a link. Here a link's owner is known
    (in a job's user namespace root and every other user both show as the overflow uid),
    so a site's own link fails as the site's error and a user's refuses only the job."""
    for b in plan.binds:
        extra = plan.trees[b.tree].extra
        if extra is not None:
            os.close(_open_site_target(b.target, plan.trees[b.tree].path, extra.templated))


def _open_site_target(target: str, source_path: str, per_job: bool = False) -> int:
    """per_job: the path holds the job's symbols (%j, %u): a missing mount point is
    missing for this job or user only, so it refuses the job, never fails the node."""
    try:
        return libc.openat2(
            -100,  # AT_FDCWD
            target,
            os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
            libc.RESOLVE_NO_SYMLINKS,
        )
    except OSError as e:
        # e.strerror names openat2 and the path again: the bare reason reads better.
        reason = os.strerror(e.errno) if e.errno else str(e)
        what = f"bind {source_path} over {target}: {reason}"
        culprit = _not_a_directory(target) if e.errno in (errno.ELOOP, errno.ENOTDIR) else None
        if culprit is not None and culprit[1] != 0:
            # Somebody's own link or file, not the site's: a user could otherwise take
            # nodes out of service by planting one. Refuse the job, keep the node.
            raise UserError(
                f"{what}: {culprit[0]} is not a directory and belongs to uid {culprit[1]}, "
                "not root, so nothing is bound through it; an administrator should make "
                "the path a root-owned directory (jobns doctor)"
            ) from None
        if per_job and e.errno == errno.ENOENT:
            raise UserError(
                f"{what}: the [[dirs]] path names this job or its user (%j, %u), and an "
                "administrator must create it (a root-owned directory) before the job "
                "starts; only this job is refused"
            ) from None
        why = (
            "a symbolic link is on the way (give the real path in [[dirs]] path)"
            if e.errno == errno.ELOOP
            else "it must be an existing directory on every node (jobns doctor checks)"
        )
        raise JobnsError(f"{what}; {why}") from None


def _not_a_directory(target: str) -> tuple[str, int] | None:
    """The first component of target that is not a directory (a symbolic link, a file),
    and its owner; None if there is none (or it cannot be looked at). Only looks: lstat
    never follows the link it finds."""
    path = ""
    for part in target.strip("/").split("/"):
        path += f"/{part}"
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return path, st.st_uid
    return None


def _bind_site(source_fd: int, source_path: str, target: str, options: tuple[str, ...]) -> None:
    fd = _open_site_target(target, source_path)
    try:
        libc.mount(f"/proc/self/fd/{source_fd}", f"/proc/self/fd/{fd}", None, libc.MS_BIND)
    except OSError as e:
        os.close(fd)
        raise JobnsError(f"bind {source_path} over {target}: {e.strerror}") from None
    try:
        # The new mount lies on top of fd's directory: reach it by name again, and make
        # sure it is the source (nobody swapped the name meanwhile).
        top = _open_site_target(target, source_path)
        try:
            src, now = os.fstat(source_fd), os.fstat(top)
            if (src.st_dev, src.st_ino) != (now.st_dev, now.st_ino):
                # Only someone who may write a directory on the path can do that.
                raise UserError(
                    f"bind {source_path} over {target}: the mount point was replaced "
                    "while binding (jobns doctor names the directory that lets a user "
                    "do that)"
                )
            try:
                libc.mount(
                    None, f"/proc/self/fd/{top}", None, remount_flags(os.fstatvfs(top), options)
                )
            except OSError as e:
                names = ",".join(("nosuid", "nodev", *options))
                raise JobnsError(f"make {target} {names}: {e.strerror}") from None
        finally:
            os.close(top)
    except BaseException:
        try:
            libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def apply_binds(
    plan: Plan,
    handles: list[TreeHandle],
    expected: list[tuple[int, int]],
    place: Callable[[Bind], T] | None = None,
    bind_one: Callable[[int, str, T, tuple[int, int]], object] | None = None,
) -> list[object]:
    """The one executor of a plan's binds (run, setup's holder and the OCI hook use it).

    First every source is opened again here, by a walk that never follows a symlink,
    and checked to be the directory verified before (expected: its (st_dev, st_ino)); a
    bind source must belong to the caller's mount namespace, and opening them all before
    the first bind is what makes that ordering trap impossible. Then each is bound
    over its target: by default the path b.target in this namespace; the hook passes
    `place` (resolve the target under a container's rootfs) and `bind_one` (bind there).
    Returns what each bind_one returned.
    """
    from jobns.launcher.backing import fs

    sources = [
        fs.reopen(handles[b.tree], b.child, ident)
        for b, ident in zip(plan.binds, expected, strict=True)
    ]
    done: list[object] = []
    for (fd, path), b, ident in zip(sources, plan.binds, expected, strict=True):
        if place is None or bind_one is None:
            bind(fd, path, b.target, b.options, plan.trees[b.tree].extra is not None)
        else:
            done.append(bind_one(fd, path, place(b), ident))
    return done


def _within(path: str, top: str) -> bool:
    """path is top or lies below it (both absolute and normalised)."""
    return os.path.commonpath((path, top)) == top


def cover_bases(plan: Plan, roots: list[tuple[int, int]]) -> None:
    """Hide, in the job's new mount namespace, every other job's trees: each base that
    holds the job's trees (and that no bind of the job hides anyway, as /tmp hides a
    local_base of /tmp) gets an empty read-only tmpfs of root's, and in it, at the same
    paths, only this job's own directories (<base>/job-ID, the per-node layout's shared
    job-ID/ with every node's tree of the job), bound recursively, so a capacity or a
    cover on a tree comes along. File permissions cannot keep another job of the same
    user out of hers; this does. Run as root before the job user can act in the
    namespace: in the voluntary mode the covers are then locked to what they cover in
    her user namespace (mount_namespaces(7)), so she can neither unmount nor move them.
    roots: the (st_dev, st_ino) setup verified of each tree root; each is reached again
    by a walk that follows no link and must be the same (UserError otherwise)."""
    targets = [b.target for b in plan.binds]
    bases = {os.path.normpath(t.base) for t in plan.trees}
    bases = {b for b in bases if not any(_within(b, t) for t in targets)}
    for top in sorted(b for b in bases if not any(o != b and _within(b, o) for o in bases)):
        trees = [i for i, t in enumerate(plan.trees) if _within(os.path.normpath(t.base), top)]
        _cover_base(top, plan, trees, roots, [t for t in targets if _within(t, top)])


def _cover_base(
    top: str, plan: Plan, trees: list[int], roots: list[tuple[int, int]], targets: list[str]
) -> None:
    kept: dict[str, tuple[int, tuple[str, ...]]] = {}  # path under top -> (fd, options)
    try:
        for i in trees:
            tree = plan.trees[i]
            rel = os.path.relpath(f"{os.path.normpath(tree.base)}/{tree.rel.split('/')[0]}", top)
            if rel not in kept:
                options = tree.extra.options if tree.extra is not None else ()
                kept[rel] = (_open_own(tree, roots[i]), options)
        flags = libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC
        libc.mount(f"jobns-hide-{os.path.basename(top)}", top, "tmpfs", flags, "size=64k,mode=0755")
        # The directories a bind of the job needs as mount points, then its own trees.
        for target in targets:
            _mkdirs(top, target)
        for rel, (fd, options) in kept.items():
            point = os.path.join(top, rel)
            _mkdirs(top, point)
            libc.mount(f"/proc/self/fd/{fd}", point, None, libc.MS_BIND | libc.MS_REC)
            libc.mount(None, point, None, remount_flags(os.statvfs(point), options))
        libc.mount(None, top, None, libc.MS_REMOUNT | libc.MS_BIND | libc.MS_RDONLY | flags)
    except OSError as e:
        what = f"hide the other jobs' trees in {top} from the job"
        raise JobnsError(f"{what}: {e.strerror}") from None
    finally:
        for fd, _ in kept.values():
            os.close(fd)


def _mkdirs(top: str, path: str) -> None:
    """Make path and the directories above it up to top, in root's fresh tmpfs on top:
    0755 whatever the umask (a prolog's may be 077), so the job can walk to its trees."""
    at = top
    for part in os.path.relpath(path, top).split("/"):
        at = os.path.join(at, part)
        if part != "." and not os.path.isdir(at):
            os.mkdir(at)
            os.chmod(at, 0o755)  # noqa: S103 (root's, empty: a way to the job's trees)


def _open_own(tree: Tree, root: tuple[int, int]) -> int:
    """An fd of the first directory of tree.rel under its base (the tree root, or the
    per-node layout's job-ID/), reached by a walk that follows no link and checked to
    lead to the tree root setup verified."""
    from jobns.launcher.backing import fs

    fds = [fs.open_base(tree.base, f"{tree.role} base")]
    try:
        for part in tree.rel.split("/"):
            fds.append(fs.open_dir(fds[-1], part, tree.path))
        st = os.fstat(fds[-1])
        if (st.st_dev, st.st_ino) != root:
            raise UserError(f"refuse {tree.path}: it was replaced while the job was being set up")
        return fds.pop(1)
    except FileNotFoundError:
        gone = f"refuse {tree.path}: it was removed while the job was being set up"
        raise UserError(gone) from None
    except UserError:
        raise
    except JobnsError as e:
        raise UserError(str(e)) from None
    finally:
        for fd in fds:
            os.close(fd)


def unshare_net() -> None:
    """A private network namespace for one task of a set-up job (--net none)."""
    try:
        libc.unshare(libc.CLONE_NEWNET)
    except OSError as e:
        raise JobnsError(f"create a network namespace: {os.strerror(e.errno or 0)}") from None


def loopback_up() -> None:
    """--net none: the new network namespace has only lo; bring it up."""
    # pyroute2 costs ~200 ms to import: only this option pays it.
    from pyroute2 import IPRoute

    try:
        with IPRoute() as ipr:
            (idx,) = ipr.link_lookup(ifname="lo")
            ipr.link("set", index=idx, state="up")
    except Exception as e:  # pyroute2 raises its own NetlinkError(code, message)
        code = getattr(e, "code", None)
        reason = os.strerror(code) if isinstance(code, int) else str(e)
        raise JobnsError(
            f"bring up lo in the job's network namespace: {reason} "
            "(needs CAP_NET_ADMIN, or run jobns as the job user)"
        ) from None


def join(user_pin: str | None, mnt_pin: str) -> None:
    """Enter a set-up job's namespaces from their pin files (user first, then mount)."""
    fds = []
    try:
        if user_pin is not None:
            fds.append(
                (os.open(user_pin, os.O_RDONLY | os.O_CLOEXEC), libc.CLONE_NEWUSER, user_pin)
            )
        fds.append((os.open(mnt_pin, os.O_RDONLY | os.O_CLOEXEC), libc.CLONE_NEWNS, mnt_pin))
        for fd, kind, path in fds:
            libc.setns(fd, kind, path)
    except OSError as e:
        raise JobnsError(
            f"join the job's namespace {e.filename or mnt_pin}: {e.strerror}; "
            "is the job set up on this node (jobns status)?"
        ) from None
    finally:
        for fd, _, _ in fds:
            os.close(fd)


def join_pid(pin: str, job_id: str) -> None:
    """Make this process's later children members of job_id's PID namespace (setns of a
    PID namespace moves only the children forked after it: this process stays where it
    is, and sees and supervises them by their host pids)."""
    try:
        fd = os.open(pin, os.O_RDONLY | os.O_CLOEXEC)
        try:
            libc.setns(fd, libc.CLONE_NEWPID, pin)
        finally:
            os.close(fd)
    except OSError as e:
        raise JobnsError(
            f"join job {job_id}'s PID namespace {pin}: {e.strerror}; "
            "is the job set up on this node (jobns status)?"
        ) from None


def pid_namespace_gone(job_id: str) -> JobnsError:
    """A fork into a PID namespace whose init has exited fails with ENOMEM."""
    return JobnsError(
        f"start a task in job {job_id}'s PID namespace: its init has ended, so the job is "
        "ending (or was killed on this node); no task may start in it now (jobns status)"
    )
