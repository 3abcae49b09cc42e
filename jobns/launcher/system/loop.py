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
attached(prefix)   the same as Device objects: path, deleted or not, size.
identity(dev)      (st_dev, st_ino) of the backing file (LOOP_GET_STATUS64): a path
                   names a file only until it is unlinked and made again, so a device
                   still attached to a finished job's deleted image (someone holds its
                   file system) is told from the next job's by this, never by the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LOOP_CLR_FD = 0x4C01
LOOP_GET_STATUS64 = 0x4C05
LO_FLAGS_AUTOCLEAR = 4
LO_NAME_SIZE = 64
# struct loop_config { u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8]; }
# struct loop_info64 { u64 device, inode, rdevice, offset, sizelimit; u32 number,
#   encrypt_type, encrypt_key_size, flags; u8 file_name[64], crypt_name[64],
#   encrypt_key[32]; u64 init[2]; }
_CONFIG = struct.Struct("=IIQQQQQIIII64s64s32sQQ64x")
_INFO64 = struct.Struct("=QQQQQIIII64s64s32sQQ")  # struct loop_info64 (232 bytes)
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


@dataclass(slots=True)
class Device:
    """A loop device and its backing file as sysfs names it (path without the
    " (deleted)" suffix; deleted: the kernel added it, the file was unlinked)."""

    dev: str
    path: str
    deleted: bool

    def size(self) -> int:
        """Bytes the device offers (what its file system may fill), 0 if gone."""
        try:
            with open(f"/sys/block/{self.dev[len('/dev/') :]}/size", encoding="ascii") as f:
                return int(f.read()) * 512
        except (OSError, ValueError):
            return 0


def attached(directory: str) -> list[Device]:
    """Every loop device backed by a file under `directory`, deleted files included."""
    prefix = directory.rstrip("/") + "/"
    out: list[Device] = []
    try:
        names = sorted(os.listdir("/sys/block"))
    except OSError:
        return out
    for name in names:
        if not name.startswith("loop"):
            continue
        path = backing(name)
        if path is None:
            continue
        deleted = path.endswith(DELETED)
        if deleted:
            path = path[: -len(DELETED)]
        if path.startswith(prefix):
            out.append(Device(f"/dev/{name}", path, deleted))
    return out


def backed_by(directory: str) -> dict[str, str]:
    """{"/dev/loopN": backing file} for every loop device backed by a file under
    `directory` (deleted files included, without the " (deleted)" suffix)."""
    return {d.dev: d.path for d in attached(directory)}


def identity(dev: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file behind dev, as the kernel holds it (the file itself,
    whatever its name now); None if the device has none or cannot be asked (root only).
    Opening the device never detaches it: whatever holds it (a mount) keeps it open."""
    try:
        fd = os.open(dev, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = fcntl.ioctl(fd, LOOP_GET_STATUS64, bytes(_INFO64.size))
    except OSError:
        return None
    finally:
        os.close(fd)
    device, inode = _INFO64.unpack(info)[:2]
    return decode_dev(device), inode


def decode_dev(value: int) -> int:
    """PURE: an st_dev from the kernel's new_encode_dev() form (lo_device): the minor's
    low byte, the major, then the minor's other bits."""
    return os.makedev((value >> 8) & 0xFFF, (value & 0xFF) | ((value >> 12) & 0xFFF00))


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
