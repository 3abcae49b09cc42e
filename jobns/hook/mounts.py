"""Bind the job's directories into a container that is being created (createRuntime).

The runtime calls the hook after it made the container's mounts and before
pivot_root, with the host pid of the container's init. A forked child joins
that process's mount namespace (setns(CLONE_NEWNS) needs a single-threaded
caller and one whose fs_struct is not shared: a fresh fork is both) and binds
there, so the hook itself stays in the host's namespace. Binding inside the
container's namespace is what makes it work for runtimes whose rootfs/dev (a
tmpfs) exists only there (Podman, runc).

Two kernel rules shape the child:
- a bind source must be a directory of the caller's mount namespace (else
  EINVAL), so the job's directories are opened again by path after setns (the
  container's namespace is a copy of the host's: the same paths are there) and
  checked against the (st_dev, st_ino) verified on the host (launcher.backing.fs.reopen);
- a mount made on /proc/self/fd/N lies on top of N's directory, and N still
  names the directory underneath: the nosuid,nodev remount goes through a fresh
  O_PATH open of the name, checked to be the bound directory. The rootfs is the
  user's: if the name was swapped meanwhile (renamed away, a link to /etc put in
  its place), the bind is undone through N (umount2 on /proc/self/fd/N detaches
  the mount on top of N's directory, wherever it has been moved) and the hook
  fails.
- an extra private directory ([[dirs]] path) is optional in a container: if its
  mount point cannot be reached or made safely in the rootfs (a symbolic link or a
  file on the way in the image, a read-only rootfs) it is skipped with a warning,
  never followed and never fatal; missing directories are made exactly like those of
  /tmp (mkdirat on the parent's fd, never through a link, in the container's mount
  namespace before any process of the container runs);
- a bind onto a shared mount propagates to every peer of that mount, in other
  namespaces too (the host's, with rootfsPropagation shared, which Podman sets for
  an rshared volume), where it would outlive the container: refused.

The child (launcher.system.fork) never holds the hook's stdout/stderr (runc waits for their
EOF) nor anything else of the hook's, and reports once: nothing, or the error.
"""

from __future__ import annotations

import os

from jobns.hook import rootfs as rootfs_mod
from jobns.launcher.backing import fs
from jobns.launcher.mountns.namespace import apply_binds, has_flags, remount_flags
from jobns.launcher.protocol.state import PAUSE_VAR
from jobns.launcher.system import libc, mountinfo
from jobns.launcher.system.errors import JobnsError, warn
from jobns.launcher.system.fastimport import signal
from jobns.launcher.system.fork import spawn

PAUSE_POINT = "hook-bind"  # test hook: the bind helper stops itself before it binds

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.hook.rootfs import Target
    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.plan import Plan


def open_namespace(pid: int, cid: str) -> int:
    """An fd of the container init's mount namespace, refused if it is the hook's own."""
    path = f"/proc/{pid}/ns/mnt"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(
            f"open {path} (container {cid}): {e.strerror}; the state's pid is "
            "not a live process (run jobns as a createRuntime hook)"
        ) from None
    theirs = os.fstat(fd)
    mine = os.stat("/proc/self/ns/mnt")
    if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
        os.close(fd)
        raise JobnsError(
            f"container {cid} shares the host's mount namespace: jobns would bind "
            "over the host's /tmp; give the container a mount namespace "
            "(linux.namespaces: mount)"
        )
    return fd


def apply(ns_fd: int, ns_path: str, rootfs: str, plan: Plan, handles: list[TreeHandle]) -> None:
    """Make plan.binds under rootfs inside the namespace; JobnsError if anything failed
    (then mount points the child made are removed again)."""
    expected = [fs.identity(handles[b.tree], b.child) for b in plan.binds]
    # The extra directories the child had to skip, one line each.
    skip_r, skip_w = os.pipe2(os.O_CLOEXEC)
    try:
        # launcher.system.fork: the child holds only the namespace fd and the skip pipe (not the
        # hook's JobLock, not runc's stdout) and reports once.
        child = spawn(
            lambda: _child(ns_fd, ns_path, rootfs, plan, handles, expected, skip_w),
            keep=(ns_fd, skip_w),
        )
        os.close(skip_w)
        skip_w = -1
        # Read to the end first: a child blocked on a full pipe would never finish.
        skipped = b""
        while chunk := os.read(skip_r, 65536):
            skipped += chunk
        child.finish("bind into the container")
    finally:
        os.close(skip_r)
        if skip_w >= 0:
            os.close(skip_w)
    for line in skipped.decode(errors="replace").splitlines():
        warn(f"warning: {line}")


def _child(
    ns_fd: int,
    ns_path: str,
    rootfs: str,
    plan: Plan,
    handles: list[TreeHandle],
    expected: list[tuple[int, int]],
    skip_fd: int,
) -> None:
    # Everything used here is imported already: after setns, imports would read the
    # container's view of the file system.
    made: list[tuple[int, str, str]] = []
    mounted: list[int] = []
    try:
        os.umask(0)  # mount points get exactly rootfs.MODES
        try:
            libc.setns(ns_fd, libc.CLONE_NEWNS, ns_path)
        except OSError as e:
            raise JobnsError(
                f"enter the container's mount namespace {ns_path}: {e.strerror}"
            ) from None
        root_fd = rootfs_mod.open_root(rootfs)
        targets: dict[int, tuple[Target | None, tuple[str, ...]]] = {}
        for b in plan.binds:
            try:
                targets[id(b)] = (rootfs_mod.resolve(root_fd, rootfs, b.target, made), b.options)
            except JobnsError as e:
                if plan.trees[b.tree].extra is None:
                    raise  # /tmp, /var/tmp, /dev/shm: never without them
                os.write(skip_fd, f"{b.target} skipped in the container: {e}\n".encode())
                targets[id(b)] = (None, b.options)
        for b, ident in zip(plan.binds, expected, strict=True):
            target = targets[id(b)][0]
            if target is None:
                continue
            if (os.fstat(target.fd).st_dev, os.fstat(target.fd).st_ino) != ident:
                not_shared(target)  # all checked before the first bind
        paused = [os.environ.get(PAUSE_VAR) != PAUSE_POINT]

        def bind_one(
            src_fd: int,
            src_path: str,
            placed: tuple[Target | None, tuple[str, ...]],
            ident: tuple[int, int],
        ) -> None:
            target, options = placed
            if target is None:
                return  # an extra directory this rootfs cannot take (reported)
            st = os.fstat(target.fd)
            if (st.st_dev, st.st_ino) == ident:
                # Already there: the runtime bound it (jobns oci-config) or we did; its
                # flags are the job's whatever the bundle asked for.
                remount(target.fd, target.path, options)
                return
            if not paused[0]:
                paused[0] = True
                os.kill(os.getpid(), signal.SIGSTOP)
            mounted.append(bind(src_fd, src_path, target, ident, options))

        # The one executor of a plan's binds (launcher.mountns.namespace), placing each target
        # under the container's rootfs.
        apply_binds(plan, handles, expected, lambda b: targets[id(b)], bind_one)
    except BaseException as e:
        msg = str(e) if isinstance(e, JobnsError) else f"bind into the container: {e}"
        for fd in reversed(mounted):
            try:
                libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
            except OSError:
                pass
        errors = rootfs_mod.remove_made(made)
        if errors:
            msg += f" (and could not undo: {'; '.join(errors)})"
        raise JobnsError(msg) from None


def not_shared(target: Target) -> None:
    """Refuse a mount point on a shared mount: the bind would propagate to its peers, in
    other mount namespaces too, and stay there after the container."""
    mnt_id = mountinfo.mount_id(target.fd)
    for m in mountinfo.mounts():
        if m.mount_id == mnt_id:
            group = [x for x in m.optional if x.startswith("shared:")]
            if group:
                raise JobnsError(
                    f"bind into the container: {target.path} is on a shared mount "
                    f"(peer group {group[0][7:]}), so the bind would also appear in the "
                    "other mount namespaces of that group (the host's) and outlive the "
                    "container; give the container private or slave root propagation "
                    "(linux.rootfsPropagation; Podman makes it shared for an rshared "
                    "volume)"
                )
            return


def _detach(path: str) -> None:
    try:
        libc.umount2(path, libc.MNT_DETACH)
    except OSError:
        pass


def remount(fd: int, path: str, options: tuple[str, ...]) -> None:
    """Give the mount open at fd (O_PATH) nosuid,nodev and the bind's options, keeping
    the flags it has (a no-op when all are there already)."""
    vfs = os.fstatvfs(fd)
    if has_flags(vfs, options):
        return
    try:
        libc.mount(None, f"/proc/self/fd/{fd}", None, remount_flags(vfs, options))
    except OSError as e:
        raise JobnsError(
            f"remount {path} {','.join(options) or 'nosuid,nodev'}: {e.strerror}"
        ) from None


def bind(
    src_fd: int,
    src_path: str,
    target: Target,
    ident: tuple[int, int],
    options: tuple[str, ...] = (),
) -> int:
    """Bind src over target, then make it nosuid,nodev (plus options); returns an O_PATH
    fd of the new mount (for undoing it). On failure the bind is undone through target.fd, the very
    directory it was made on, whatever its name is by now."""
    try:
        libc.mount(f"/proc/self/fd/{src_fd}", f"/proc/self/fd/{target.fd}", None, libc.MS_BIND)
    except OSError as e:
        raise JobnsError(f"bind {src_path} over {target.path}: {e.strerror}") from None
    top = -1
    try:
        try:
            top = os.open(
                target.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target.parent_fd
            )
        except OSError as e:
            raise JobnsError(
                f"bind {src_path} over {target.path}: {e.strerror} (the mount "
                "point was removed while binding?); refusing"
            ) from None
        st = os.fstat(top)
        if (st.st_dev, st.st_ino) != ident:
            raise JobnsError(
                f"bind {src_path} over {target.path}: the mount point was "
                "replaced while binding; refusing"
            )
        try:
            libc.mount(None, f"/proc/self/fd/{top}", None, remount_flags(os.fstatvfs(top), options))
        except OSError as e:
            raise JobnsError(f"make {target.path} nosuid,nodev: {e.strerror}") from None
    except BaseException:
        _detach(f"/proc/self/fd/{target.fd}")
        if top >= 0:
            os.close(top)
        raise
    return top
