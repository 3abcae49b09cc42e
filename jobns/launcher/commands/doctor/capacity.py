"""Disk capacities: the loop devices disk images need, where the images may live
(a local disk) and [capacity] scratch_base, the directory that holds them."""

from __future__ import annotations

import os
import stat

from jobns.launcher.backing.diskimage import base_of
from jobns.launcher.commands.doctor.common import (
    NETWORK_FS,
    NOTE,
    OK,
    PROBLEM,
    Finding,
    fs_type,
    path_guarded,
)
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.capacity import tmp_backing


def disk_users(config: config_mod.Config) -> list[str]:
    """What in the config makes disk images (each needs loop devices and mkfs)."""
    users = ['[capacity] tmp_backing = "disk"'] if tmp_backing(config) == "disk" else []
    return users + [f"[[dirs]] {d.path}" for d in config.dirs if d.backing == "disk"]


def loop_devices(
    dev: str = "/dev", users: list[str] | None = None, container: str = ""
) -> list[Finding]:
    """Loop devices hold disk images: a problem only where the config has a disk backing
    (users: what asks for one), else a note. container: in_container()'s reason, where
    `modprobe loop` cannot help."""
    if container:
        load = (
            f"this node is a container ({container}): load the loop module on the host "
            "(modprobe loop) and give the container /dev/loop-control and /dev/loopN "
            "(docker run --device /dev/loop-control --device /dev/loop0 ...)"
        )
    else:
        load = "modprobe loop (and list it in /etc/modules)"
    try:
        st = os.stat(f"{dev}/loop-control")
        what = "" if stat.S_ISCHR(st.st_mode) else f"{dev}/loop-control is not a character device"
        load = load if container else f"remove it and {load}"
    except OSError:
        what = f"no {dev}/loop-control"
    if not what:
        return [(OK, f"loop devices ({dev}/loop-control)")]
    if users:
        return [
            (
                PROBLEM,
                f"{what}: {', '.join(users)} makes disk images, which need loop "
                f"devices; fix: {load}",
            )
        ]
    return [
        (
            NOTE,
            f"{what}: nothing configured here needs loop devices (only a disk backing "
            f'does: [capacity] tmp_backing or a [[dirs]] backing = "disk"); before '
            f"configuring one: {load}",
        )
    ]


def image_fs(what: str, path: str) -> list[Finding]:
    """Disk images belong on a local disk: not a network file system (every job's I/O
    would cross the network, and the node cap would count another node's space), not
    tmpfs (the image would be memory: tmp_backing = "tmpfs" does that directly)."""
    kind = fs_type(path)
    if kind in NETWORK_FS:
        return [(PROBLEM, f"{what} is on {kind}, a network file system; fix: a local disk")]
    if kind in ("tmpfs", "ramfs"):
        return [
            (
                PROBLEM,
                f"{what} is on {kind}: its disk images would take memory; fix: a "
                'local disk (or tmp_backing = "tmpfs")',
            )
        ]
    return []


def scratch_base(config: config_mod.Config) -> list[Finding]:
    """[capacity] scratch_base, where disk capacities' images live: root's, writable by
    root only (then no user can name, squat or swap an image), on a local disk. Others
    may read it: nothing of jobns's waits for a lock there (launcher.backing.diskimage keeps its
    lock in state_dir), and the images themselves are root's 0600."""
    if config.capacity.get("tmp_backing") != "disk":
        return []
    path = base_of(config)
    what = f"[capacity] scratch_base {path}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/")) or "/"
        return image_fs(what, parent) or [
            (OK, f"{what}: made (root's, 0700) by the first disk capacity")
        ]
    except OSError as e:
        return [(PROBLEM, f"{what}: {e.strerror}; fix: mkdir -m 0700 {path}")]
    if not stat.S_ISDIR(st.st_mode):
        return [(PROBLEM, f"{what} is not a directory (a symlink?); fix: mkdir -m 0700 {path}")]
    mode = stat.S_IMODE(st.st_mode)
    out: list[Finding] = []
    if st.st_uid != 0:
        out.append((PROBLEM, f"{what} belongs to uid {st.st_uid}; fix: chown root {path}"))
    if mode & 0o022:
        out.append(
            (
                PROBLEM,
                f"{what} is writable by others (mode {mode:04o}): anyone could plant or "
                f"swap an image; fix: chmod go-w {path}",
            )
        )
    out += image_fs(what, path) + path_guarded(path, what)
    return out or [(OK, f"{what}: root's, mode {mode:04o}, {fs_type(path)}")]
