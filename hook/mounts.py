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
  checked against the (st_dev, st_ino) verified on the host (launcher.fs.reopen);
- a mount made on /proc/self/fd/N lies on top of N's directory, and N still
  names the directory underneath: the nosuid,nodev remount goes through a fresh
  O_PATH open of the name, checked to be the bound directory.

The child never holds the hook's stdout/stderr (runc waits for their EOF) and
reports one line through a pipe: "ok" or the error.
"""

from __future__ import annotations

import os

from hook import rootfs as rootfs_mod
from launcher import fs, libc
from launcher.errors import EXIT_JOBNS_FAILED, JobnsError
from launcher.namespace import _KEEP  # the flags a bind remount must keep

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from hook.rootfs import Target
    from launcher.fs import TreeHandle
    from launcher.plan import Plan


def open_namespace(pid: int, cid: str) -> int:
    """An fd of the container init's mount namespace, refused if it is the hook's own."""
    path = f"/proc/{pid}/ns/mnt"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(f"open {path} (container {cid}): {e.strerror}; the state's pid is "
                         "not a live process (run jobns as a createRuntime hook)") from None
    theirs = os.fstat(fd)
    mine = os.stat("/proc/self/ns/mnt")
    if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
        os.close(fd)
        raise JobnsError(f"container {cid} shares the host's mount namespace: jobns would bind "
                         "over the host's /tmp; give the container a mount namespace "
                         "(linux.namespaces: mount)")
    return fd


def apply(ns_fd: int, ns_path: str, rootfs: str, plan: Plan, handles: list[TreeHandle]
          ) -> None:
    """Make plan.binds under rootfs inside the namespace; JobnsError if anything failed
    (then mount points the child made are removed again)."""
    expected = [fs.identity(handles[b.tree], b.child) for b in plan.binds]
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(write_fd, ns_fd, ns_path, rootfs, plan, handles, expected)
    os.close(write_fd)
    try:
        reply = b""
        while chunk := os.read(read_fd, 65536):
            reply += chunk
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if reply != b"ok":
        text = reply.decode(errors="replace") or \
            f"bind into the container: the helper died (wait status {status:#x})"
        raise JobnsError(text)


def _quiet_stdio() -> None:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)


def _child(reply_fd: int, ns_fd: int, ns_path: str, rootfs: str, plan: Plan,
           handles: list[TreeHandle], expected: list[tuple[int, int]]) -> None:
    # Everything used here is imported already: after setns, imports would read the
    # container's view of the file system.
    made: list[tuple[int, str, str]] = []
    mounted: list[int] = []
    try:
        _quiet_stdio()
        os.umask(0)  # mount points get exactly rootfs.MODES
        try:
            libc.setns(ns_fd, libc.CLONE_NEWNS, ns_path)
        except OSError as e:
            raise JobnsError(f"enter the container's mount namespace {ns_path}: "
                             f"{e.strerror}") from None
        root_fd = rootfs_mod.open_root(rootfs)
        targets = [rootfs_mod.resolve(root_fd, rootfs, b.target, made) for b in plan.binds]
        sources = [fs.reopen(handles[b.tree], b.child, ident)
                   for b, ident in zip(plan.binds, expected, strict=True)]
        for (src_fd, src_path), target, ident in zip(sources, targets, expected, strict=True):
            st = os.fstat(target.fd)
            if (st.st_dev, st.st_ino) == ident:
                continue  # already there: the runtime bound it (jobns oci-config) or we did
            mounted.append(bind(src_fd, src_path, target, ident))
        os.write(reply_fd, b"ok")
        os._exit(0)
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
        try:
            os.write(reply_fd, msg.encode(errors="replace"))
        finally:
            os._exit(EXIT_JOBNS_FAILED)


def bind(src_fd: int, src_path: str, target: Target, ident: tuple[int, int]) -> int:
    """Bind src over target, then make it nosuid,nodev; returns an O_PATH fd of the new
    mount (for undoing it)."""
    try:
        libc.mount(f"/proc/self/fd/{src_fd}", f"/proc/self/fd/{target.fd}", None, libc.MS_BIND)
        top = os.open(target.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=target.parent_fd)
    except OSError as e:
        raise JobnsError(f"bind {src_path} over {target.path}: {e.strerror}") from None
    try:
        st = os.fstat(top)
        if (st.st_dev, st.st_ino) != ident:
            raise JobnsError(f"bind {src_path} over {target.path}: the mount point was "
                             "replaced while binding; refusing")
        flags = libc.MS_REMOUNT | libc.MS_BIND | libc.MS_NOSUID | libc.MS_NODEV
        vfs = os.fstatvfs(top)
        for st_bit, ms_bit in _KEEP:
            if vfs.f_flag & st_bit:
                flags |= ms_bit
        libc.mount(None, f"/proc/self/fd/{top}", None, flags)
    except OSError as e:
        try:
            libc.umount2(f"/proc/self/fd/{top}", libc.MNT_DETACH)
        except OSError:
            pass
        os.close(top)
        raise JobnsError(f"make {target.path} nosuid,nodev: {e.strerror}") from None
    except BaseException:
        os.close(top)
        raise
    return top
