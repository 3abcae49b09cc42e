"""Mount and unmount the size-limited tmpfs of a job tree (the system side of
launcher.capacity).

The tmpfs is mounted on the tree root *on the host*, before the job's namespace is
made, so the binds of the tree's children pick it up; the job's tasks and every later
step see only the limited file system, and a job that writes past it gets ENOSPC while
the node's /tmp and /dev/shm are untouched. Each mount is named ``jobns-<role>-<job id>``
(its "source" in /proc/self/mountinfo), which is how teardown knows it is ours.

Why it is safe: the mount is made through /proc/self/fd/N of the tree root jobns just
created and verified, so a symlink swapped in under the tree's name cannot redirect it;
once mounted the kernel refuses to rename the mount point (EBUSY), so the name keeps
meaning that directory until teardown unmounts it (UMOUNT_NOFOLLOW, by that name).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from jobns.launcher import fs, libc, mountinfo
from jobns.launcher.errors import JobnsError, UserError
from jobns.launcher.plan import TOP_MODE

if TYPE_CHECKING:
    from jobns.launcher.fs import TreeHandle
    from jobns.launcher.plan import Tree


def source_name(role: str, job_id: str) -> str:
    return f"jobns-{role}-{job_id}"


def _ours_at(fd: int, tree: Tree, job_id: str) -> bool:
    """Is the file system open at fd this job's capacity tmpfs (by source and device)?"""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    want = source_name(tree.role, job_id)
    return any(
        m.fstype == "tmpfs" and m.source == want and m.dev == dev for m in mountinfo.mounts()
    )


def ours(tree: Tree, job_id: str) -> bool:
    fd = fs.open_tree(tree)
    if fd is None:
        return False
    try:
        return _ours_at(fd, tree, job_id)
    finally:
        os.close(fd)


def mount(handle: TreeHandle, size: int, uid: int, gid: int, job_id: str) -> None:
    """Mount a tmpfs of `size` bytes on the tree root and remake its children in it.

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
    parent = handle.parent_fds[-1]
    try:
        # By name from the parent: a path lookup crosses into the new mount, the old fd
        # (and /proc/self/fd/N) still lead to the directory beneath it.
        fd = fs.open_dir(parent, tree.name, tree.path)
    except BaseException:
        unmount(tree, job_id)
        raise
    try:
        if not _ours_at(fd, tree, job_id):
            raise UserError(
                f"refuse {tree.path}: it was replaced while its capacity was being set up"
            )
        fs.make_children(fd, tree, uid, gid)
    except BaseException:
        os.close(fd)
        unmount(tree, job_id)
        raise
    os.close(fd)


def unmount(tree: Tree, job_id: str) -> list[str]:
    """Empty and detach every tmpfs of ours on the tree root (a crash may have stacked two).

    Emptied first, then made read-only (the superblock: every copy of the mount), then
    detached: a copy kept alive elsewhere (a job user holding her namespace open, a
    process of hers with its cwd inside) then holds an empty file system she cannot
    refill, not the job's data (SECURITY.md rule 6). The mount is found by a walk that
    never follows a symlink and detached through its fd, never by a path the user
    could redirect.
    """
    errors: list[str] = []
    for _ in range(16):
        fd = fs.open_tree(tree)
        if fd is None:
            return errors
        try:
            if not _ours_at(fd, tree, job_id):
                return errors
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
