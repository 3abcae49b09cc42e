"""Find (or make) /tmp, /var/tmp and /dev/shm inside a container's root file system.

The root file system is the image's content, which whoever built the image
chose: `tmp -> /etc` in it must not make root mount over the host's /etc. So
each target is reached by an fd walk from the rootfs fd, one component at a
time, with O_PATH|O_NOFOLLOW, and a symbolic link (or anything that is not a
directory) anywhere on the way is refused. The mount is then made on
/proc/self/fd/N of the opened directory, the very inode that was checked.

Mount points that are missing are made, like runtimes make the mount points of
config.json's mounts: real directories (mkdirat on the parent fd, never through
a link), /tmp-like ones with mode 1777, others 0755, owned by root. A failed
hook removes the ones it made. A rootfs that cannot take them (read-only) is
refused with that reason.
"""

from __future__ import annotations

import errno
import os
import stat

from launcher.errors import JobnsError

O_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MODES = {"tmp": 0o1777, "var/tmp": 0o1777, "dev/shm": 0o1777}
DEFAULT_MODE = 0o755


class Target:
    """One opened mount point: its parent and its own O_PATH fds."""

    __slots__ = ("fd", "name", "parent_fd", "path")

    def __init__(self, parent_fd: int, name: str, fd: int, path: str) -> None:
        self.parent_fd = parent_fd
        self.name = name
        self.fd = fd
        self.path = path  # for messages: the host path of the rootfs + the target


def open_root(path: str) -> int:
    """The rootfs directory itself (named by the bundle's author: followed like the runtime
    follows it)."""
    try:
        return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(f"open the container's root file system {path}: {e.strerror}; check "
                         "root.path in the bundle's config.json") from None


def _refuse(parent_fd: int, name: str, path: str, st: os.stat_result) -> JobnsError:
    if stat.S_ISLNK(st.st_mode):
        try:
            dest = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            dest = "?"
        return JobnsError(f"refuse {path}: it is a symbolic link (to {dest!r}) in the "
                          "container image; jobns never mounts through a link inside a "
                          "container: make it a real directory in the image")
    return JobnsError(f"refuse {path}: it is not a directory in the container image; make it "
                      "one")


def resolve(root_fd: int, rootfs: str, target: str, made: list[tuple[int, str, str]]
            ) -> Target:
    """Open target ("/tmp", "/var/tmp", "/dev/shm") under the rootfs without following any
    link; make what is missing, appending (parent fd, name, path) of each to made."""
    parts = target.strip("/").split("/")
    fd = os.dup(root_fd)
    parent = -1
    for i, name in enumerate(parts):
        rel = "/".join(parts[:i + 1])
        path = f"{rootfs}/{rel}"
        if parent >= 0:
            os.close(parent)
        parent = fd
        try:
            fd = os.open(name, O_PATH, dir_fd=parent)
        except FileNotFoundError:
            try:
                os.mkdir(name, MODES.get(rel, DEFAULT_MODE), dir_fd=parent)
            except OSError as e:
                os.close(parent)
                raise JobnsError(f"create mount point {path}: {e.strerror}; add the directory "
                                 "to the container image") from None
            made.append((os.dup(parent), name, path))
            fd = os.open(name, O_PATH, dir_fd=parent)
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            err = _refuse(parent, name, path, st)
            os.close(fd)
            os.close(parent)
            raise err
    return Target(parent, parts[-1], fd, f"{rootfs}/{'/'.join(parts)}")


def remove_made(made: list[tuple[int, str, str]]) -> list[str]:
    """Undo resolve()'s mkdirs, deepest first; returns what could not be removed."""
    errors = []
    for parent, name, path in reversed(made):
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError as e:
            if e.errno != errno.ENOENT:
                errors.append(f"remove mount point {path}: {e.strerror}")
        finally:
            os.close(parent)
    made.clear()
    return errors
