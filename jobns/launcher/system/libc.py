"""The only ctypes module: the few syscalls Python 3.11's os module lacks.

Every wrapper raises OSError naming the call and its arguments, so a failure
deep inside namespace setup still tells the operator which path and why.
Python 3.12 grew os.unshare/os.setns; Debian 12 ships 3.11, hence ctypes.

It binds libc through `_ctypes`, the C module under `ctypes`: the `ctypes`
package costs ~2 ms to import (its struct and endian helpers) on a path that
runs once per task, and these calls need none of it. Without argtypes, ctypes
passes Python ints as C int, bytes as char * and None as NULL, and returns int;
every flag used here fits in an int.
"""

from __future__ import annotations

import _ctypes
import os

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# typeshed describes the ctypes package, not the bare C module used here.
_C: Any = _ctypes


class _CInt(_C._SimpleCData):  # type: ignore[misc]
    """C int (like ctypes.c_int: a direct subclass, so results come back as int)."""

    _type_ = "i"


class _CLong(_C._SimpleCData):  # type: ignore[misc]
    """C long: syscall(2) is variadic and reads every argument as a long."""

    _type_ = "l"


class _LibcFunction(_C.CFuncPtr):  # type: ignore[misc]
    _flags_ = _C.FUNCFLAG_CDECL | _C.FUNCFLAG_USE_ERRNO
    _restype_ = _CInt


class _Libc:
    """What CFuncPtr((name, library)) needs of a library: its dlopen handle."""

    _handle = _C.dlopen(None, os.RTLD_NOW)


def _function(name: str) -> Callable[..., int]:
    fn: Callable[..., int] = _LibcFunction((name, _Libc))
    return fn


def get_errno() -> int:
    errno_now: int = _C.get_errno()
    return errno_now


# <sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100

# <sys/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

_mount = _function("mount")
_umount2 = _function("umount2")
_unshare = _function("unshare")
_setns = _function("setns")
_renameat2 = _function("renameat2")
_syscall = _function("syscall")
_prctl = _function("prctl")


def oserror(op: str, path: str | None = None) -> OSError:
    """An OSError for the errno of the last libc call, naming the operation."""
    err = get_errno()
    msg = f"{op}: {os.strerror(err)}"
    return OSError(err, msg, path) if path is not None else OSError(err, msg)


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    if _mount(_b(source), _b(target), _b(fstype), flags, _b(data)) < 0:
        raise oserror(f"mount({source!r} -> {target!r}, type={fstype!r}, flags={flags:#x})", target)


def umount2(target: str, flags: int = 0) -> None:
    if _umount2(_b(target), flags) < 0:
        raise oserror(f"umount2({target!r}, {flags:#x})", target)


def unshare(flags: int) -> None:
    if _unshare(flags) < 0:
        raise oserror(f"unshare({flags:#x})")


def setns(fd: int, nstype: int, what: str = "") -> None:
    """Join the namespace behind fd. CLONE_NEWNS needs a single-threaded caller."""
    if _setns(fd, nstype) < 0:
        raise oserror(f"setns({what or fd}, {nstype:#x})", what or None)


RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def rename_noreplace(dir_fd: int, old: str, new: str) -> None:
    """renameat2(RENAME_NOREPLACE) within one directory: EEXIST rather than replace."""
    if _renameat2(dir_fd, os.fsencode(old), dir_fd, os.fsencode(new), RENAME_NOREPLACE) < 0:
        raise oserror(f"rename {old!r} -> {new!r}", new)


def rename_exchange(dir_fd: int, a: str, b: str) -> None:
    """renameat2(RENAME_EXCHANGE) within one directory: swap two entries atomically."""
    if _renameat2(dir_fd, os.fsencode(a), dir_fd, os.fsencode(b), RENAME_EXCHANGE) < 0:
        raise oserror(f"exchange {a!r} <-> {b!r}", b)


SYS_OPEN_TREE = 428  # the same numbers on x86_64 and aarch64 (Linux 5.2+)
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 4


def clone_mount(path: str) -> int:
    """open_tree(OPEN_TREE_CLONE): an fd on a detached bind mount of path alone (no mount
    below it comes along), to attach with attach_mount() after the tree it was taken from
    is gone."""
    fd = _syscall(
        _CLong(SYS_OPEN_TREE),
        _CLong(AT_FDCWD),
        os.fsencode(path),
        _CLong(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW),
    )
    if fd < 0:
        raise oserror(f"open_tree({path!r})", path)
    return fd


def attach_mount(fd: int, target: str) -> None:
    """move_mount(2) the detached mount fd (clone_mount) onto target."""
    if (
        _syscall(
            _CLong(SYS_MOVE_MOUNT),
            _CLong(fd),
            b"",
            _CLong(AT_FDCWD),
            os.fsencode(target),
            _CLong(MOVE_MOUNT_F_EMPTY_PATH),
        )
        < 0
    ):
        raise oserror(f"move_mount(-> {target!r})", target)


SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (Linux 5.6+)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02  # /proc/PID/root, /proc/PID/fd/N, ...: ELOOP
RESOLVE_NO_SYMLINKS = 0x04


def openat2(dir_fd: int, name: str, flags: int, resolve: int) -> int:
    """openat2(2): open name below dir_fd with RESOLVE_* limits, e.g. RESOLVE_NO_XDEV,
    which fails with EXDEV rather than enter a mount (and so never sends a request to a
    FUSE server mounted there), or RESOLVE_NO_MAGICLINKS, which fails with ELOOP rather
    than follow a /proc magic link into another process's root or open files.
    OSError(ENOSYS) on kernels without it (before Linux 5.6)."""
    how = flags.to_bytes(8, "little") + bytes(8) + resolve.to_bytes(8, "little")
    fd = _syscall(_CLong(SYS_OPENAT2), _CLong(dir_fd), os.fsencode(name), how, _CLong(len(how)))
    if fd < 0:
        raise oserror(f"openat2({name!r})", name)
    return fd


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument (the rest 0; passed as longs: prctl is variadic)."""
    if _prctl(option, _CLong(arg), _CLong(0), _CLong(0), _CLong(0)) < 0:
        raise oserror(f"prctl({option}, {arg})")


# The three prctl calls jobns makes (<linux/prctl.h>); python-prctl's C module would cost
# a dlopen (~0.2 ms) for them. tests/unit/test_fastimport.py checks them against it.
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def set_pdeathsig(sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, int(sig))


def set_child_subreaper(on: bool) -> None:
    prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_dumpable(on: bool) -> None:
    prctl(PR_SET_DUMPABLE, 1 if on else 0)


# <linux/magic.h>: file systems whose content never outlives the node's uptime.
TMPFS_MAGIC = 0x01021994
RAMFS_MAGIC = 0x858458F6
_fstatfs = _function("fstatfs")


class _StatfsBuf(_C.Array):  # type: ignore[misc]
    """Room for struct statfs (120 bytes on 64-bit Linux); f_type is its first long."""

    _type_ = _CLong
    _length_ = 16


def fs_type(fd: int) -> int:
    """f_type of the file system fd is on (fstatfs(2)): e.g. TMPFS_MAGIC."""
    buf = _StatfsBuf()
    if _fstatfs(fd, buf) < 0:
        raise oserror(f"fstatfs({fd})")
    magic: int = buf[0]
    return magic & 0xFFFFFFFF
