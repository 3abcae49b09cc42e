"""Root's own mount points of a job, away from everything its user can touch:

  <state_dir>/mounts/              root 0700
  <state_dir>/mounts/<job-id>/     a small tmpfs of root's (jobns-mounts-<job-id>), 0700,
                                   nosuid,nodev,noexec, private: the job's *area*
      cdi/<n>-<target>             launcher.mountns.cdi: the host paths a CDI spec names
      oci/<n>-<target>             hook.oci_config: the bind sources of the bundles root
                                   prepares for a prolog's job (made by the first one)
      fill<path>                   launcher.mountns.dirs: the pre-run program's way into an extra
                                   directory with options (only while it runs)
      stage                        launcher.mountns.dirs: where a cover is made and flagged
                                   before it is moved onto its tree

An engine or a program that follows a path under here follows nothing a user controls
(every component is root's, none writable by anyone else), and what is mounted here was
bound from a directory verified by fd, never by a path. state_dir is a private mount
(launcher.protocol.state.ensure_state_dir), so nothing mounted under it propagates into any
namespace, and every job's namespace hides state_dir (launcher.mountns.pins), so no job holds
these mounts. release() detaches the area, and with it everything mounted in it, in one
lazy unmount, before the job's trees are removed (they would keep a capacity alive:
SECURITY.md rule 6): teardown does it first thing, in any state (launcher.mountns.cdi.remove),
`jobns gc` for a job that has no record.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from jobns.launcher.backing.fs import detach_at
from jobns.launcher.mountns.namespace import remount_flags
from jobns.launcher.protocol import state
from jobns.launcher.system import libc, mountinfo
from jobns.launcher.system.errors import JobnsError

O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def area(state_dir: str, job_id: str) -> str:
    return f"{state_dir}/{state.MOUNTS}/{job_id}"


def open_area(state_dir: str, job_id: str, *sub: str) -> int:
    """The job's area (mounted now if it is not yet), and sub-directories of it made as
    needed; an fd of the last."""
    top = f"{state_dir}/{state.MOUNTS}"
    state.private_dir(top, None)
    state.private_dir(f"{top}/{job_id}", None)
    parent = os.open(top, O_DIR)
    try:
        fd = os.open(job_id, O_DIR, dir_fd=parent)
        if mountinfo.mount_id(fd) == mountinfo.mount_id(parent):
            os.close(fd)
            _mount_area(f"{top}/{job_id}", job_id)
            fd = os.open(job_id, O_DIR, dir_fd=parent)
    finally:
        os.close(parent)
    for part in sub:
        try:
            os.mkdir(part, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        nxt = os.open(part, O_DIR, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def _mount_area(path: str, job_id: str) -> None:
    # Nothing is stored here but empty directories for mount points.
    flags = libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC
    try:
        libc.mount(f"jobns-mounts-{job_id}", path, "tmpfs", flags, "size=1m,mode=0700")
    except OSError as e:
        raise JobnsError(f"mount a tmpfs on {path}: {e.strerror}") from None


def bind(src_fd: int, parent_fd: int, name: str, what: str, flags: Callable[[int], int]) -> str:
    """Bind the directory open at src_fd (O_PATH will do) onto a new root-only directory
    `name` under parent_fd, private (nothing mounted later on either side reaches the
    other), then remount it with flags(fd of the new mount); its mount id."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        point = os.open(name, O_PATH_DIR, dir_fd=parent_fd)
        try:
            libc.mount(f"/proc/self/fd/{src_fd}", f"/proc/self/fd/{point}", None, libc.MS_BIND)
        finally:
            os.close(point)
        top = os.open(name, O_PATH_DIR, dir_fd=parent_fd)
        try:
            libc.mount(None, f"/proc/self/fd/{top}", None, libc.MS_PRIVATE)
            libc.mount(None, f"/proc/self/fd/{top}", None, flags(top))
            return mountinfo.mount_id(top)
        finally:
            os.close(top)
    except OSError as e:
        raise JobnsError(f"bind {what}: {e.strerror}") from None


def keeping(options: tuple[str, ...]) -> Callable[[int], int]:
    """bind()'s flags: nosuid,nodev plus options (ro, noexec), keeping what the source
    has (a bind of an extra directory's cover is ro or noexec already)."""

    def flags(fd: int) -> int:
        return remount_flags(os.fstatvfs(fd), options)

    return flags


def release(state_dir: str, job_id: str) -> list[str]:
    """Detach the job's area, and with it everything mounted in it, and remove its mount
    point (absent: nothing to do). Lazily: a process that holds a file in one keeps only
    that (rule 6 is kept by the trees' own teardown: an emptied capacity, a shut-down
    image)."""
    try:
        parent = os.open(f"{state_dir}/{state.MOUNTS}", O_DIR)
    except FileNotFoundError:
        return []  # the common teardown: no CDI, no covers ever made on this node
    except OSError as e:
        return [f"open {state_dir}/{state.MOUNTS}: {e.strerror}"]
    try:
        for _ in range(16):  # stacked by an interrupted setup, at worst
            if not detach_at(parent, job_id):
                break
        os.rmdir(job_id, dir_fd=parent)
    except FileNotFoundError:
        pass
    except OSError as e:
        return [f"remove {area(state_dir, job_id)}: {e.strerror}"]
    finally:
        os.close(parent)
    return []


def orphans(state_dir: str, live: set[str]) -> list[str]:
    """Jobs with an area whose job is not in live (gc)."""
    try:
        names = os.listdir(f"{state_dir}/{state.MOUNTS}")
    except OSError:
        return []
    return sorted(n for n in names if n not in live)
