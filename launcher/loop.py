"""Loop devices through the kernel's loop-control interface (no losetup process).

attach(image_fd)   LOOP_CTL_GET_FREE, then LOOP_CONFIGURE (Linux 5.8+) with
                   LO_FLAGS_AUTOCLEAR: the device detaches itself when its last user
                   (our fd, then the mount) goes away, so a crash between attaching
                   and mounting leaves no loop device behind.
backing(name)      the file behind /dev/loopN, from /sys/block/loopN/loop/backing_file
                   (the kernel appends " (deleted)" once the file is unlinked).
backed_by(prefix)  every loop device whose backing file lies under a directory: how
                   gc and recover recognise ours (by the configured scratch base, never
                   by a name a user could choose).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LOOP_CLR_FD = 0x4C01
LO_FLAGS_AUTOCLEAR = 4
LO_NAME_SIZE = 64
# struct loop_config { u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]; }
# struct loop_info64 { u64 device, inode, rdevice, offset, sizelimit; u32 number,
#   encrypt_type, encrypt_key_size, flags; u8 file_name[64], crypt_name[64],
#   encrypt_key[32]; u64 init[2]; }
_CONFIG = struct.Struct("=IIQQQQQIIII64s64s32sQQ64x")
DELETED = " (deleted)"


def attach(image_fd: int, name: str) -> tuple[str, int]:
    """Attach the open image to a free loop device (autoclear); returns (/dev/loopN, an
    fd of it). The caller keeps the fd until the device is mounted, then closes it."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(32):  # another attacher may take the free device first (EBUSY)
            number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
            dev = f"/dev/loop{number}"
            fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            config = _CONFIG.pack(
                image_fd,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                LO_FLAGS_AUTOCLEAR,
                os.fsencode(name)[: LO_NAME_SIZE - 1],
                b"",
                b"",
                0,
                0,
            )
            try:
                fcntl.ioctl(fd, LOOP_CONFIGURE, config)
            except OSError as e:
                os.close(fd)
                if e.errno == errno.EBUSY:
                    continue
                raise OSError(e.errno, f"LOOP_CONFIGURE {dev}: {e.strerror}") from None
            return dev, fd
    finally:
        os.close(ctl)
    raise OSError(errno.EBUSY, "no free loop device after 32 attempts")


def backing(name: str) -> str | None:
    """The backing file of loop device `name` ("loop3"), None if it has none."""
    try:
        with open(
            f"/sys/block/{name}/loop/backing_file", encoding="utf-8", errors="surrogateescape"
        ) as f:
            return f.read().rstrip("\n")
    except OSError:
        return None


def backed_by(directory: str) -> dict[str, str]:
    """{"/dev/loopN": backing file} for every loop device backed by a file under
    `directory` (deleted files included, without the " (deleted)" suffix)."""
    prefix = directory.rstrip("/") + "/"
    out: dict[str, str] = {}
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return out
    for name in names:
        if not name.startswith("loop"):
            continue
        path = backing(name)
        if path is None:
            continue
        if path.endswith(DELETED):
            path = path[: -len(DELETED)]
        if path.startswith(prefix):
            out[f"/dev/{name}"] = path
    return out


def detach(dev: str) -> None:
    """Detach a loop device nothing has mounted (LOOP_CLR_FD; with autoclear set, the
    kernel also does it on the last close)."""
    fd = os.open(dev, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: already detached
            raise
    finally:
        os.close(fd)
