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

import errno
import os

from launcher import fs, libc
from launcher.errors import JobnsError
from launcher.plan import SCRATCH_MODE, TOP_MODE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from launcher.fs import TreeHandle
    from launcher.plan import Tree


def source_name(role: str, job_id: str) -> str:
    return f"jobns-{role}-{job_id}"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_at(path: str) -> list[tuple[str, str, str]]:
    """(fstype, source, major:minor) of every mount whose mount point is path, bottom first."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or _unescape(fields[4]) != path:
                continue
            rest = right.split()
            if len(rest) >= 2:
                found.append((rest[0], _unescape(rest[1]), fields[2]))
    return found


def ours(tree: Tree, job_id: str) -> bool:
    want = source_name(tree.role, job_id)
    return any(t == "tmpfs" and s == want for t, s, _ in mounts_at(tree.path))


def mount(handle: TreeHandle, size: int, uid: int, gid: int, job_id: str) -> None:
    """Mount a tmpfs of `size` bytes on the tree root and remake its children in it.

    The caller re-acquires the tree afterwards (fs.acquire_tree(create=False)), which
    verifies the new root and children exactly as it verifies any tree.
    """
    tree = handle.tree
    name = source_name(tree.role, job_id)
    data = f"size={size},mode={TOP_MODE:04o},uid={uid},gid={gid}"
    try:
        libc.mount(name, f"/proc/self/fd/{handle.fd}", "tmpfs", libc.MS_NOSUID | libc.MS_NODEV,
                   data)
    except OSError as e:
        raise JobnsError(f"mount a {size}-byte tmpfs on {tree.path} (capacity): {e.strerror}; "
                         "is the size possible on this node?") from None
    parent = handle.parent_fds[-1]
    try:
        # By name from the parent: a path lookup crosses into the new mount, the old fd
        # (and /proc/self/fd/N) still lead to the directory beneath it.
        fd = fs.open_dir(parent, tree.name, tree.path)
    except BaseException:
        unmount(tree, job_id)
        raise
    try:
        st = os.fstat(fd)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        if not any(t == "tmpfs" and s == name and d == dev for t, s, d in mounts_at(tree.path)):
            raise JobnsError(f"refuse {tree.path}: it was replaced while its capacity was "
                             "being set up")
        for child in tree.children:
            os.mkdir(child, 0o700, dir_fd=fd)
            cfd = os.open(child, fs.O_DIR, dir_fd=fd)
            try:
                os.fchmod(cfd, SCRATCH_MODE)
                os.fchown(cfd, uid, gid)
            finally:
                os.close(cfd)
    except BaseException:
        os.close(fd)
        unmount(tree, job_id)
        raise
    os.close(fd)


def unmount(tree: Tree, job_id: str) -> list[str]:
    """Detach every tmpfs of ours on the tree root (a crash may have stacked two)."""
    errors: list[str] = []
    for _ in range(16):
        try:
            if not ours(tree, job_id):
                return errors
        except OSError as e:
            return [f"read /proc/self/mountinfo: {e.strerror}"]
        try:
            # Detach: the job's namespace may still hold a copy until its last task is gone.
            libc.umount2(tree.path, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
        except OSError as e:
            if e.errno != errno.EINVAL:
                return [f"unmount the capacity tmpfs on {tree.path}: {e.strerror}"]
    return [f"unmount the capacity tmpfs on {tree.path}: still mounted after 16 attempts"]
