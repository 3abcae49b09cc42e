"""The only ctypes module: the few syscalls Python 3.11's os module lacks.

Every wrapper raises OSError naming the call and its arguments, so a failure
deep inside namespace setup still tells the operator which path and why.
Python 3.12 grew os.unshare/os.setns; Debian 12 ships 3.11, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os

# <sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000

# <sys/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)


def oserror(op: str, path: str | None = None) -> OSError:
    """An OSError for the errno of the last libc call, naming the operation."""
    err = ctypes.get_errno()
    msg = f"{op}: {os.strerror(err)}"
    return OSError(err, msg, path) if path is not None else OSError(err, msg)


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) < 0:
        raise oserror(f"mount({source!r} -> {target!r}, type={fstype!r}, flags={flags:#x})",
                      target)


def umount2(target: str, flags: int = 0) -> None:
    if _libc.umount2(_b(target), flags) < 0:
        raise oserror(f"umount2({target!r}, {flags:#x})", target)


def unshare(flags: int) -> None:
    if _libc.unshare(flags) < 0:
        raise oserror(f"unshare({flags:#x})")


def setns(fd: int, nstype: int, what: str = "") -> None:
    """Join the namespace behind fd. CLONE_NEWNS needs a single-threaded caller."""
    if _libc.setns(fd, nstype) < 0:
        raise oserror(f"setns({what or fd}, {nstype:#x})", what or None)


RENAME_NOREPLACE = 1
_libc.renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint)


def rename_noreplace(dir_fd: int, old: str, new: str) -> None:
    """renameat2(RENAME_NOREPLACE) within one directory: EEXIST rather than replace."""
    if _libc.renameat2(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new),
                       RENAME_NOREPLACE) < 0:
        raise oserror(f"rename {old!r} -> {new!r}", new)
