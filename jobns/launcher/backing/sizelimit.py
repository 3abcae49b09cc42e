"""Mount and unmount the size-limited tmpfs of a job tree (the system side of
launcher.model.capacity).

The tmpfs is mounted on the tree root *on the host*, before the job's namespace is
made, so the binds of the tree's children pick it up; the job's tasks and every later
step see only the limited file system, and a job that writes past it gets ENOSPC while
the node's /tmp and /dev/shm are untouched. Each mount is named ``jobns-<role>-<job id>``
(its "source" in /proc/self/mountinfo), for the administrator's eyes only: a user can
give her FUSE mount the same name. jobns knows its mount by the identity the kernel gave
it (launcher.system.mountinfo.Identity: mount id, device, type), recorded in the job record when
setup mounts it (owner() says which mounts of a tree are jobns's).

Why it is safe: the mount is made through /proc/self/fd/N of the tree root jobns just
created and verified, so a symlink swapped in under the tree's name cannot redirect it;
once mounted the kernel refuses to rename the mount point (EBUSY), so the name keeps
meaning that directory; teardown reaches it by a walk of O_PATH fds and detaches it
through its fd, never by a path.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from jobns.launcher.backing import fs
from jobns.launcher.backing.fs import TreeHandle
from jobns.launcher.model.plan import TOP_MODE, Tree
from jobns.launcher.model.record import TreeRecord
from jobns.launcher.system import libc
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.mountinfo import Identity, Mount


def source_name(role: str, job_id: str) -> str:
    return f"jobns-{role}-{job_id}"


def owner(t: TreeRecord, job_id: str) -> Callable[[Mount], bool]:
    """Which mounts on a recorded tree's root are jobns's own: the one whose identity the
    record keeps. A record of the previous version (or of a setup that died between its
    mount and its record) keeps none: then only a mount of the kind jobns makes there can
    be ours - a tmpfs named ours (only root makes a tmpfs in the host's namespace: a
    user's FUSE mount has type fuse.*, whatever she names it) or an ext4/xfs on a loop
    device backed by the recorded image (launcher.backing.diskimage.ours_at) - and whatever a
    user stacked on it is detached before it is looked into."""
    if t.mount is not None:
        return t.mount.matches
    if t.image is not None:
        from jobns.launcher.backing.diskimage import ours_at

        image = t.image
        return lambda m: ours_at(m, image)
    if t.capacity is not None:
        return _legacy(t.tree, job_id)
    return fs.nothing_ours


def _legacy(tree: Tree, job_id: str) -> Callable[[Mount], bool]:
    name = source_name(tree.role, job_id)
    return lambda m: m.fstype == "tmpfs" and m.source == name


def mount(handle: TreeHandle, size: int, uid: int, gid: int, job_id: str) -> Identity:
    """Mount a tmpfs of `size` bytes on the tree root and remake its children in it;
    returns its identity, for the job record.

    The caller re-acquires the tree afterwards (fs.acquire_tree(create=False)), which
    verifies the new root and children exactly as it verifies any tree.
    """
    tree = handle.tree
    name = source_name(tree.role, job_id)
    data = f"size={size},mode={TOP_MODE:04o},uid={uid},gid={gid}"
    try:
        libc.mount(
            name, f"/proc/self/fd/{handle.fd}", "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, data
        )
    except OSError as e:
        raise JobnsError(
            f"mount a {size}-byte tmpfs on {tree.path} (capacity): {e.strerror}; "
            "is the size possible on this node?"
        ) from None
    try:
        fd, m = fs.new_mount(handle, "tmpfs")
    except BaseException:
        unmount(tree, _legacy(tree, job_id))
        raise
    try:
        fs.make_children(fd, tree, uid, gid)
    except BaseException:
        unmount(tree, Identity.of(m).matches)
        raise
    finally:
        os.close(fd)
    return Identity.of(m)


def unmount(tree: Tree, ours: Callable[[Mount], bool]) -> list[str]:
    """Empty and detach every tmpfs of ours on the tree root (a crash may have stacked two).

    Whatever a user mounted on it is detached first, never entered (launcher.backing.fs.open_root),
    and so is whatever she mounted inside it (the emptying walk, launcher.system.removal). Ours is
    emptied first, then made read-only (the superblock: every copy of the mount), then
    detached: a copy kept alive elsewhere (a job user holding her namespace open, a
    process of hers with its cwd inside) then holds an empty file system she cannot
    refill, not the job's data (SECURITY.md rule 6). It is reached by a walk that never
    follows a symlink and detached through its fd, never by a path the user could redirect.
    """
    for _ in range(16):
        got = fs.open_root(tree, ours, detach=True)
        if got is None:
            return []
        fd, kind = got
        try:
            if kind != fs.OURS:
                return []
            fs.clear_dir(fd, tree.path)  # best effort: what a writer keeps goes with it
            try:
                libc.mount(
                    None,
                    f"/proc/self/fd/{fd}",
                    None,
                    libc.MS_REMOUNT | libc.MS_RDONLY | libc.MS_NOSUID | libc.MS_NODEV,
                )
            except OSError:
                pass  # EBUSY: a file is still open for writing; it is emptied all the same
            # Detach: the job's namespace may still hold a copy until its last task is gone.
            libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
        except OSError as e:
            return [f"unmount the capacity tmpfs on {tree.path}: {e.strerror}"]
        finally:
            os.close(fd)
    return [f"unmount the capacity tmpfs on {tree.path}: still mounted after 16 attempts"]
