"""What every subject of doctor shares: the kinds of finding and the file-system
helpers more than one subject asks (what a path is on, who may replace it, whether it
lies in a job's private directories, reading a file that may be a FIFO, showing a value
read from a file)."""

from __future__ import annotations

import os
import stat

from jobns.launcher.system.mountinfo import mounts

OK, NOTE, PROBLEM = "ok", "note", "problem"

NETWORK_FS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "cifs",
    "smb3",
    "beegfs",
    "fuse.glusterfs",
    "ceph",
    "fuse.ceph",
    "pvfs2",
    "orangefs",
    "fuse.sshfs",
    "9p",
}


Finding = tuple[str, str]


def fs_type(path: str) -> str:
    """The type of the file system path is on (the deepest mount above it)."""
    real = os.path.realpath(path)
    best, kind = "", "?"
    for m in mounts():
        point = m.point.rstrip("/") or "/"
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, m.fstype
    return kind


def path_guarded(path: str, what: str) -> list[Finding]:
    """A problem for each directory above path that lets a user other than root replace
    what lies below it (owned by a user, or writable by others without the sticky bit
    on a root-owned entry): she could put a symbolic link at the mount point, and setup
    then refuses every job on the node (it never binds through a link)."""
    out: list[Finding] = []
    parts = path.strip("/").split("/")
    parent = "/"
    for part in parts:
        child = f"{parent.rstrip('/')}/{part}"
        try:
            pst, cst = os.lstat(parent), os.lstat(child)
        except OSError:
            return out
        shared = pst.st_mode & 0o022 and not (pst.st_mode & stat.S_ISVTX and cst.st_uid == 0)
        if pst.st_uid != 0 or shared:
            out.append(
                (
                    PROBLEM,
                    f"{what}: {parent} (uid {pst.st_uid}, mode "
                    f"{stat.S_IMODE(pst.st_mode):04o}) lets another user replace {child}; "
                    f"fix: chown root {parent}; chmod go-w {parent} (or keep the path "
                    "under root's directories only)",
                )
            )
        parent = child
    return out


def _inside_any(path: str, points: list[str]) -> bool:
    """Whether path is one of points or below one (as written: the job's binds are)."""
    path = os.path.normpath(path)
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in points)


def _regular_text(path: str, limit: int = 1 << 20) -> str | None:
    """The text of the regular file at path (its first `limit` bytes), or None. Opened
    without blocking and checked before reading: a FIFO or a device named in a config
    must not hang doctor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _shown(text: str) -> str:
    # Values come from files: no line break or terminal escape reaches the output raw.
    return text if text.isprintable() else repr(text)
