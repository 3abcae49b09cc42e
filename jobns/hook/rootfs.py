"""Find (or make) /tmp, /var/tmp and /dev/shm inside a container's root file system.

The root file system is the image's content, which whoever built the image
chose: `tmp -> /etc` in it must not make root mount over the host's /etc. So
each target is reached by an fd walk from the rootfs fd, one component at a
time, with O_PATH|O_NOFOLLOW, and a symbolic link (or anything that is not a
directory) anywhere on the way is refused. The mount is then made on
/proc/self/fd/N of the opened directory, the very inode that was checked.

The rootfs itself is reached the same way from / (open_root): a symbolic link on
the way is followed only if root owns it (a site's /home -> /data/home); a user's
link (the bundle's rootfs -> /etc, or a directory of the bundle path swapped for
one after the runtime looked) is refused, or root would make world-writable
directories, and mount, wherever that user points.

Mount points that are missing are made, like runtimes make the mount points of
config.json's mounts: real directories (mkdirat on the parent fd, never through
a link), /tmp-like ones with mode 1777, others 0755, owned by root. A failed
hook removes the ones it made. A rootfs that cannot take them (read-only) is
refused with that reason. `jobns oci-config` makes nothing in the rootfs (the
runtime makes mount points) but refuses the same links first (check).
"""

from __future__ import annotations

import errno
import os
import stat

from jobns.launcher.system.errors import JobnsError

O_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MODES = {"tmp": 0o1777, "var/tmp": 0o1777, "dev/shm": 0o1777}
DEFAULT_MODE = 0o755
MAX_LINKS = 40  # as the kernel's path walk (ELOOP)


class Target:
    """One opened mount point: its parent and its own O_PATH fds."""

    __slots__ = ("fd", "name", "parent_fd", "path")

    def __init__(self, parent_fd: int, name: str, fd: int, path: str) -> None:
        self.parent_fd = parent_fd
        self.name = name
        self.fd = fd
        self.path = path  # for messages: the host path of the rootfs + the target


def _components(path: str) -> list[str]:
    """path's components, last first (a stack to pop from)."""
    return [p for p in path.split("/") if p and p != "."][::-1]


def open_root(path: str) -> int:
    """An O_PATH fd of the rootfs directory, walked to from / one component at a time;
    a symbolic link is followed only if root (or the caller: oci-config run by the job
    user) owns it. Relative link targets and '..' resolve like the kernel's walk."""
    trusted = {0, os.geteuid()}
    fd = os.open("/", O_PATH | os.O_DIRECTORY)
    todo = _components(path)
    here = ""  # the path walked so far, for messages
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                nfd = os.open("..", O_PATH, dir_fd=fd)
                os.close(fd)
                fd, here = nfd, here.rpartition("/")[0]
                continue
            at = f"{here}/{name}"
            try:
                nfd = os.open(name, O_PATH, dir_fd=fd)
            except OSError as e:
                raise JobnsError(
                    f"open the container's root file system {path}: {at}: "
                    f"{e.strerror}; check root.path in the bundle's "
                    "config.json"
                ) from None
            st = os.fstat(nfd)
            if stat.S_ISDIR(st.st_mode):
                os.close(fd)
                fd, here = nfd, at
                continue
            try:
                if not stat.S_ISLNK(st.st_mode):
                    raise JobnsError(
                        f"open the container's root file system {path}: {at} is "
                        "not a directory; check root.path in the bundle's "
                        "config.json"
                    )
                if st.st_uid not in trusted:
                    raise JobnsError(
                        f"refuse the container's root file system {path}: {at}: "
                        f"it is a symbolic link owned by uid {st.st_uid}; jobns "
                        "(root) follows only root's links on the way to a "
                        "rootfs: name the real directory in root.path and the "
                        "bundle path"
                    )
                links += 1
                if links > MAX_LINKS:
                    raise JobnsError(
                        f"open the container's root file system {path}: too "
                        "many levels of symbolic links"
                    )
                # The link's own inode (the fd), not whatever the name points to by now.
                dest = os.readlink("", dir_fd=nfd)
            finally:
                os.close(nfd)
            todo += _components(dest)
            if dest.startswith("/"):
                top = os.open("/", O_PATH | os.O_DIRECTORY)
                os.close(fd)
                fd, here = top, ""
        return fd
    except BaseException:
        os.close(fd)
        raise


def _refuse(parent_fd: int, name: str, path: str, st: os.stat_result) -> JobnsError:
    if stat.S_ISLNK(st.st_mode):
        try:
            dest = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            dest = "?"
        return JobnsError(
            f"refuse {path}: it is a symbolic link (to {dest!r}) in the "
            "container image; jobns never mounts through a link inside a "
            "container: make it a real directory in the image"
        )
    return JobnsError(f"refuse {path}: it is not a directory in the container image; make it one")


def _step(parent: int, name: str, path: str) -> int | None:
    """O_PATH fd of the directory name in parent, None if it is missing; a symbolic link
    or anything else that is not a directory is refused (never followed)."""
    try:
        fd = os.open(name, O_PATH, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JobnsError(f"open mount point {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise _refuse(parent, name, path, st)
    return fd


def resolve(root_fd: int, rootfs: str, target: str, made: list[tuple[int, str, str]]) -> Target:
    """Open target ("/tmp", "/var/tmp", "/dev/shm") under the rootfs without following any
    link; make what is missing, appending (parent fd, name, path) of each to made."""
    parts = target.strip("/").split("/")
    fd = os.dup(root_fd)
    parent = -1
    try:
        for i, name in enumerate(parts):
            rel = "/".join(parts[: i + 1])
            path = f"{rootfs}/{rel}"
            if parent >= 0:
                os.close(parent)
            parent, fd = fd, -1
            found = _step(parent, name, path)
            if found is None:
                try:
                    os.mkdir(name, MODES.get(rel, DEFAULT_MODE), dir_fd=parent)
                except OSError as e:
                    raise JobnsError(
                        f"create mount point {path}: {e.strerror}; add the "
                        "directory to the container image"
                    ) from None
                made.append((os.dup(parent), name, path))
                # Opened again like any other: swapped for a link meanwhile, it is refused.
                found = _step(parent, name, path)
                if found is None:
                    raise JobnsError(
                        f"create mount point {path}: it vanished while being made; refusing"
                    )
            fd = found
    except BaseException:
        for x in (fd, parent):
            if x >= 0:
                os.close(x)
        raise
    return Target(parent, parts[-1], fd, f"{rootfs}/{'/'.join(parts)}")


def check(rootfs: str, targets: list[str]) -> None:
    """For oci-config, before it makes anything: the rootfs is reachable (open_root) and
    no target has a symbolic link or a non-directory on its way. Missing directories are
    fine (the runtime makes mount points); nothing is created."""
    root_fd = open_root(rootfs)
    try:
        for target in targets:
            parts = target.strip("/").split("/")
            fd = os.dup(root_fd)
            try:
                for i, name in enumerate(parts):
                    found = _step(fd, name, f"{rootfs}/{'/'.join(parts[: i + 1])}")
                    if found is None:
                        break
                    os.close(fd)
                    fd = found
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


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
