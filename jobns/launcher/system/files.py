"""Files replaced atomically: written under a temporary name in their own directory, then
renamed over their name, so that a reader sees the old file or the new one, never half
of one (issue 33: every jobns writer that replaces a file does it here).

The temporary name is .NAME.tmp-PID-HEX (is_temporary knows it): hidden, never ending
in NAME's own suffix (CDI reads only *.json, node_exporter only *.prom), and not to be
guessed; it is created with O_EXCL|O_NOFOLLOW, so whoever else can write the directory
can plant neither a link nor a file for us to write through. Whatever fails, the
temporary is gone again: a full file system gets no litter.

This floor knows no job: who may read a file beyond its mode (the job user's ACL of
launcher.protocol.state) is the caller's `prepare`, and what a failure means is the
caller's message (an OSError comes back as it is). Hot path: imports nothing but os.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

MARK = ".tmp-"
# A new file, made here and now: neither an existing one nor a link is opened.
CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of data is written: on a file system that fills up, write(2)
    returns a short count first and ENOSPC only on the next call."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def temporary_name(name: str) -> str:
    return f".{name}{MARK}{os.getpid()}-{os.urandom(4).hex()}"


def is_temporary(name: str) -> bool:
    """Is this directory entry a temporary of this module's (a write under way, or left
    by a writer that was killed)?"""
    return name.startswith(".") and MARK in name


def split(path: str) -> tuple[str, str]:
    """(directory, name) of a file's path: "/run/x" ("/run", "x"), "x" (".", "x")."""
    where, slash, name = path.rpartition("/")
    return where or slash or ".", name


class Temporary:
    """A new file under a temporary name next to `name` in `where` (a directory fd, or
    path), open as fd with `access` (O_WRONLY, O_RDWR, | O_APPEND ...) and created with
    `mode` (less the umask). commit() renames it over name; discard() removes it (a
    no-op once committed); close() closes fd, which may outlive the commit (a lock
    taken before the file had its name). OSError from the constructor: nothing made."""

    __slots__ = ("dir_fd", "fd", "name", "tmp")

    def __init__(
        self, where: int | str, name: str, mode: int = 0o600, access: int = os.O_WRONLY
    ) -> None:
        self.dir_fd: int | None
        if isinstance(where, int):
            self.dir_fd, self.name, self.tmp = where, name, temporary_name(name)
        else:  # paths, resolved as the caller's own path would be
            base = where.rstrip("/") if where else "."
            self.dir_fd, self.name = None, f"{base}/{name}"
            self.tmp = f"{base}/{temporary_name(name)}"
        self.fd = os.open(self.tmp, access | CREATE, mode, dir_fd=self.dir_fd)

    def commit(self) -> None:
        """Rename the file over its name (replacing what is there); on failure the
        temporary is removed and the OSError raised."""
        try:
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            self.discard()
            raise
        self.tmp = ""

    def discard(self) -> None:
        """Remove the temporary name, if it is still there; never fails."""
        if self.tmp:
            try:
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            except OSError:
                pass
            self.tmp = ""

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def write_atomic(
    where: int | str,
    name: str,
    data: bytes,
    mode: int,
    *,
    owner: tuple[int, int] | None = None,
    prepare: Callable[[int], None] | None = None,
    fsync: bool | Callable[[int], bool] = True,
) -> None:
    """Replace name in where (a directory fd, or path) by a file holding data: written
    under a temporary name, owned by owner (uid, gid) if given, given exactly `mode`
    (not the umask's), then prepare(fd) (e.g. an ACL: after the mode, which would reset
    its mask), fsynced if fsync is true or fsync(fd) says so, closed, and renamed over
    name. Whatever fails (an OSError, or what prepare raises), the temporary is gone."""
    t = Temporary(where, name)
    try:
        try:
            write_all(t.fd, data)
            if owner is not None:
                os.fchown(t.fd, *owner)  # before the mode: chown clears set-id bits
            os.fchmod(t.fd, mode)
            if prepare is not None:
                prepare(t.fd)
            if fsync(t.fd) if callable(fsync) else fsync:
                os.fsync(t.fd)
        finally:
            t.close()
    except BaseException:
        t.discard()
        raise
    t.commit()
