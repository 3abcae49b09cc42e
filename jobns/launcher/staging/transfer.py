"""Move and copy a job's files, as the job user, so that nothing is ever lost.

The system side of launcher.staging.model. Every operation runs in a forked worker that
has dropped to the job user (all its groups, then gid, then uid) and closed every
other file descriptor: the files are the user's, so a symlink or a rename race planted
by the user can reach nothing the user could not reach anyway (CVE-2023-41914 is about
root doing this). Walks are still fd-relative with O_NOFOLLOW, so a symlink in the tree
is moved as a symlink and never followed.

What "nothing is lost" means, and how:

* A file is presented under its final name only when complete: it is written to
  ``.jobns-part-<hash of name>`` next to it, fsynced, then renamed over the name.
* A source is deleted only after its copy is durable (file fsynced, directory fsynced).
* So at every instant each file is whole in the source, or whole in the destination, or
  both; never neither. A crash, a kill or a full disk mid-way leaves that state, and
  running the same operation again (``jobns recover``, ``jobns teardown``) finishes it:
  a stale part file has the same name and is replaced, a file present on both sides is
  copied again and then deleted from the source.
* On one file system a move is a rename (atomic; a directory moves as a whole). Across
  file systems it is copy-then-delete per file, or, with ``[arc] movetool``, the tool
  copies each top-level entry into a part directory, which is fsynced and then merged
  into place by renames before the source is removed. The tool runs without a shell:
  ``shlex.split(movetool) + [SOURCE, PART_DIR/]``. It must *copy* (``cp -a``, ``rsync -a``):
  jobns deletes the source itself once the copy is in place, and a tool that deletes
  its source (``mv``, ``rsync --remove-source-files``) could leave the only copy of a file
  half-written in a part directory if killed; launcher.staging.model refuses ``mv``.

Names starting with ``.jobns-part-`` are reserved for part files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import re
import select
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Self

from jobns.launcher.system import files, libc, removal, sysprog
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fork import spawn
from jobns.launcher.system.user import switch_user

PART = ".jobns-part-"
PAUSE_VAR = "JOBNS_TEST_PAUSE_IN"
TOOL_OUTPUT_TAIL = 2000
# A step's errors (and, apart, its warnings) end up in the epilog's output, the syslog
# and the job's record in state_dir (/run: memory). Their number, their length and the
# number of files are the user's to choose (a name is 255 bytes, a path has no limit in
# a walk by fds): only the first lines are kept, each cut to one line of MAX_LINE
# characters, all together at most MAX_TOTAL, and one more line says how many were not.
MAX_LINES = 50
MAX_LINE = TOOL_OUTPUT_TAIL + 500  # a movetool's output tail and what it failed on
MAX_TOTAL = 20000
MAX_REPORT = 1 << 20  # bytes of a worker's report root reads (it is the job user's)

Result = dict[str, object]


def printable(text: str) -> str:
    """text with every character a terminal or a log would act on written as an escape
    (a file name may hold a newline, ESC, or bytes that are no UTF-8)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(line: str) -> str:
    """One printable line of at most MAX_LINE characters: its start (the operation and
    the path) and its end (the reason and the fix), the middle cut out."""
    if len(line) <= MAX_LINE:
        text = printable(line)
        if len(text) <= MAX_LINE:
            return text
    half = (MAX_LINE - 40) // 2
    cut = f"[{len(line) - 2 * half} characters cut]" if len(line) > 2 * half else "[...]"
    return f"{printable(line[:half])[:half]} {cut} {printable(line[-half:])[-half:]}"


class Lines(list[str]):
    """Errors or warnings, bounded as they are collected (see MAX_LINES): the first ones
    kept in order, and how many more there were."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self.size = 0

    def append(self, line: object) -> None:
        if self.dropped == 0 and len(self) < MAX_LINES:
            text = clip(str(line))
            if self.size + len(text) <= MAX_TOTAL:
                super().append(text)
                self.size += len(text)
                return
        self.dropped += 1

    def extend(self, lines: Iterable[object]) -> None:
        for line in lines:
            self.append(line)

    def __iadd__(self, lines: Iterable[object]) -> Self:  # type: ignore[override,misc]
        self.extend(lines)
        return self

    def listed(self, what: str) -> list[str]:
        """The kept lines, and one saying how many were dropped."""
        if not self.dropped:
            return list(self)
        return [
            *self,
            f"... and {self.dropped} more {what} not listed (only the first {len(self)} are kept)",
        ]


def part_name(name: str) -> str:
    return PART + hashlib.sha256(os.fsencode(name)).hexdigest()[:16]


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _grant(dir_fd: int, name: str, bits: int) -> None:
    """Give ourselves `bits` on an entry we own whose mode denies us (e.g. mode 000),
    through an O_PATH fd: that pins the inode we looked at, no symlink can redirect it."""
    pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(pfd)
        if st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        os.chmod(f"/proc/self/fd/{pfd}", stat.S_IMODE(st.st_mode) | bits)
    finally:
        os.close(pfd)


def open_dir_at(dir_fd: int, name: str) -> int:
    """Open a subdirectory to read and write it (never through a symlink)."""
    try:
        return os.open(name, removal.O_DIR, dir_fd=dir_fd)
    except PermissionError:
        _grant(dir_fd, name, 0o700)
        return os.open(name, removal.O_DIR, dir_fd=dir_fd)


def open_dir_path(path: str) -> int:
    """A top-level directory named by a staging plan: its last component must not be a
    symlink (the plan's confinement is about this very directory)."""
    parent, _, name = path.rpartition("/")
    pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_dir_at(pfd, name)
    finally:
        os.close(pfd)


# ------------------------------------------------------- a directive's own paths
#
# A stage_in/stage_out path is the user's: the worker follows its symbolic links (they
# reach only what she could reach), but never a /proc magic link (/proc/PID/root of her
# process in another job leads into that job's mounts, a FUSE server of hers among
# them), and what it names must lie on a file system the path itself passes through:
# the mount whose mount point is the path or its nearest ancestor in the host's mount
# table, or any mount at one of its ancestors ("/" included). A link may lead anywhere
# on those file systems, never onto another one (her FUSE mount in another job's tree,
# another namespace's mount). A FUSE mount on the path itself is allowed; the step's
# deadline bounds what its server does.


def open_stage_path(path: str, flags: int) -> int:
    """Open a directive's path, following symbolic links but no magic link (ELOOP)."""
    return libc.openat2(libc.AT_FDCWD, path, flags | os.O_CLOEXEC, libc.RESOLVE_NO_MAGICLINKS)


def open_stage_dir(path: str) -> int:
    """A directive's destination directory, made (0700) where missing, like
    os.makedirs but every existing component opened without magic links."""
    flags = os.O_RDONLY | os.O_DIRECTORY
    missing: list[str] = []
    here = path
    while True:
        try:
            fd = open_stage_path(here or "/", flags)
            break
        except FileNotFoundError:
            if not here or here == "/":
                raise
            here, _, name = here.rpartition("/")
            missing.append(name)
    try:
        for name in reversed(missing):
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            sub = libc.openat2(fd, name, flags | os.O_CLOEXEC, libc.RESOLVE_NO_MAGICLINKS)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unescape(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as \\ooo."""
    if "\\" not in field:
        return field
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table() -> dict[int, str]:
    """Mount id -> mount point, of this process's (the host's) mount namespace."""
    table = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ", 5)
            if len(fields) > 4 and fields[0].isdigit():
                table[int(fields[0])] = _unescape(fields[4])
    return table


def mount_id(fd: int) -> int:
    """The id of the mount fd's object is reached through (mountinfo's first field)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "no mnt_id in /proc/self/fdinfo")


def stage_confined(fd: int, path: str, mounts: Callable[[], dict[int, str]]) -> str | None:
    """None if the object open at fd lies on a mount whose mount point is `path` or
    one of its ancestors; else what it lies on, for a message."""
    point = mounts().get(mount_id(fd))
    if point is None:
        return "a mount of another mount namespace"
    if point == "/" or path == point or path.startswith(point + "/"):
        return None
    return f"the file system mounted at {printable(point)}"


class Transfer:
    """The engine; one per worker. Collects errors and warnings instead of stopping at
    the first, so one unreadable file does not keep every other output in scratch."""

    def __init__(self, phase: str, movetool: list[str] | None = None, timeout: float = 0.0) -> None:
        self.phase = phase
        self.movetool = movetool
        self.timeout = timeout
        self.errors = Lines()
        self.warnings = Lines()
        self.committed = 0
        self._pause = os.environ.get(PAUSE_VAR, "")
        self._mount_table: dict[int, str] | None = None
        # The whole step's end (the root side kills the worker then, launcher.system
        # .transfer.as_user): a movetool gets what is left of it, so its failure is
        # reported, and its source kept, before that.
        self._end = time.monotonic() + timeout if timeout > 0 else None

    def _left(self) -> float | None:
        return None if self._end is None else max(0.001, self._end - time.monotonic())

    def result(self) -> Result:
        return {
            "errors": list(self.errors),
            "errors_dropped": self.errors.dropped,
            "warnings": list(self.warnings),
            "warnings_dropped": self.warnings.dropped,
            "committed": self.committed,
        }

    def _commit(self) -> None:
        self.committed += 1
        # Test hook (docs/development.md "Test hooks"): stop right after the Nth file is in place.
        if self._pause == f"{self.phase}@{self.committed}":
            os.kill(os.getpid(), signal.SIGSTOP)

    def _error(self, op: str, path: str, e: BaseException, fix: str = "") -> None:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        self.errors.append(f"{self.phase}: {op} {path}: {reason}" + (f"; {fix}" if fix else ""))

    # ------------------------------------------------------------------ moving

    def move_contents(self, src: str, dst: str, skip: frozenset[str] = frozenset()) -> None:
        """Move everything inside directory src into directory dst (merging)."""
        try:
            sfd = open_dir_path(src)
        except OSError as e:
            self._error("open", src, e)
            return
        try:
            if all(n in skip for n in os.listdir(sfd)):
                os.close(sfd)
                return  # nothing to move: dst need not even exist (an empty scratch)
        except OSError as e:
            os.close(sfd)
            self._error("list", src, e)
            return
        try:
            dfd = open_dir_path(dst)
        except OSError as e:
            os.close(sfd)
            self._error("open", dst, e)
            return
        try:
            if self.movetool is not None:
                self._move_top_with_tool(sfd, dfd, src, dst, skip)
            else:
                self._move_dir(sfd, dfd, src, dst, skip)
        finally:
            os.close(sfd)
            os.close(dfd)

    def _move_dir(
        self, sfd: int, dfd: int, spath: str, dpath: str, skip: frozenset[str] = frozenset()
    ) -> bool:
        """Move the entries of one directory; True when the source is now empty."""
        copied: list[str] = []
        try:
            names = sorted(os.listdir(sfd))
        except OSError as e:
            self._error("list", spath, e)
            return False
        complete = True
        for name in names:
            if name in skip:
                complete = False
            elif name.startswith(PART):
                complete &= self._drop_part(sfd, name, spath)
            else:
                complete &= self._move_entry(sfd, dfd, name, spath, dpath, copied)
        self._settle(sfd, dfd, spath, dpath, copied)
        return complete

    def _settle(self, sfd: int, dfd: int, spath: str, dpath: str, copied: list[str]) -> None:
        """Make the copies durable, then (only then) delete their sources."""
        try:
            os.fsync(dfd)
        except OSError as e:
            self._error("sync", dpath, e)
            return
        for name in copied:
            try:
                os.unlink(name, dir_fd=sfd)
            except FileNotFoundError:
                pass
            except OSError as e:
                self._error("remove the moved source", f"{spath}/{name}", e)
        try:
            os.fsync(sfd)
        except OSError as e:
            self._error("sync", spath, e)

    def _move_entry(
        self, sfd: int, dfd: int, name: str, spath: str, dpath: str, copied: list[str]
    ) -> bool:
        src, dst = f"{spath}/{name}", f"{dpath}/{name}"
        try:
            st = _lstat(name, sfd)
            if st is None:
                return True  # gone meanwhile (or moved by an earlier run)
            there = _lstat(name, dfd)
            if there is not None and stat.S_ISDIR(st.st_mode) and stat.S_ISDIR(there.st_mode):
                return self._merge_dir(sfd, dfd, name, st, spath, dpath)
            if there is not None and stat.S_ISDIR(there.st_mode) != stat.S_ISDIR(st.st_mode):
                self.errors.append(
                    f"{self.phase}: move {src} -> {dst}: one is a directory "
                    "and the other is not; rename one of them, then run the "
                    "step again (both are kept)"
                )
                return False
            try:
                os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=dfd)
                self._commit()
                return True
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
            # Across file systems: per file copy, the source removed after the sync.
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o700, dir_fd=dfd)
                return self._merge_dir(sfd, dfd, name, st, spath, dpath)
            if self._copy_nondir(sfd, dfd, name, st, src, dst):
                copied.append(name)
                return True
            return False
        except OSError as e:
            self._error("move", f"{src} -> {dst}", e, _fix(e))
            return False

    def _merge_dir(
        self, sfd: int, dfd: int, name: str, st: os.stat_result, spath: str, dpath: str
    ) -> bool:
        src, dst = f"{spath}/{name}", f"{dpath}/{name}"
        sub_s = open_dir_at(sfd, name)
        try:
            sub_d = open_dir_at(dfd, name)
        except BaseException:
            os.close(sub_s)
            raise
        try:
            complete = self._move_dir(sub_s, sub_d, src, dst)
            if complete:
                _copy_dir_meta(sub_d, st)
        finally:
            os.close(sub_s)
            os.close(sub_d)
        if not complete:
            return False
        try:
            os.rmdir(name, dir_fd=sfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._error("remove the moved directory", src, e)
            return False
        return True

    def _drop_part(self, dir_fd: int, name: str, path: str) -> bool:
        """A part file or directory in a *source*: left by a copy into this directory that
        was interrupted. Its source still existed then (sources go only after their copy
        is in place), so it is never the only copy: remove it, never move it."""
        errors = removal.remove_entry(dir_fd, name, f"{path}/{name}")
        self.errors += [f"{self.phase}: {e}" for e in errors]
        return not errors

    # -------------------------------------------------------------- movetool

    def _move_top_with_tool(
        self, sfd: int, dfd: int, spath: str, dpath: str, skip: frozenset[str]
    ) -> None:
        same_fs = os.fstat(sfd).st_dev == os.fstat(dfd).st_dev
        try:
            names = sorted(os.listdir(sfd))
        except OSError as e:
            self._error("list", spath, e)
            return
        copied: list[str] = []
        for name in names:
            if name in skip:
                continue
            if name.startswith(PART):
                self._drop_part(sfd, name, spath)
            elif same_fs:
                self._move_entry(sfd, dfd, name, spath, dpath, copied)
            else:
                self._move_with_tool(sfd, dfd, name, spath, dpath)
        self._settle(sfd, dfd, spath, dpath, copied)

    def _move_with_tool(self, sfd: int, dfd: int, name: str, spath: str, dpath: str) -> None:
        assert self.movetool is not None
        src, part = f"{spath}/{name}", part_name(name)
        part_path = f"{dpath}/{part}"
        if _lstat(name, sfd) is None:
            return
        for err in removal.remove_entry(dfd, part, part_path):  # a crashed earlier attempt's
            self.errors.append(f"{self.phase}: {err}")
            return
        try:
            os.mkdir(part, 0o700, dir_fd=dfd)
        except OSError as e:
            self._error("create", part_path, e, _fix(e))
            return
        argv = [*self.movetool, src, part_path + "/"]
        try:
            # Dies with the worker: an orphaned tool would go on writing into the part
            # directory a later run reuses.
            r = subprocess.run(
                sysprog.argv(argv),  # never through PATH (launcher.system.sysprog)
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd="/",
                env=sysprog.environment(_tool_env()),
                check=False,
                timeout=self._left(),
                preexec_fn=lambda: libc.set_pdeathsig(signal.SIGKILL),
            )
            failure = (
                None
                if r.returncode == 0
                else f"exit status {r.returncode}: {_tail(r.stderr or r.stdout)}"
            )
        except subprocess.TimeoutExpired:
            failure = (
                f"still running when the step's {self.timeout:g} s ran out ([staging] timeout)"
            )
        except OSError as e:
            failure = f"{e.strerror}; check [arc] movetool"
        pfd = open_dir_at(dfd, part)
        try:
            if failure is None and _lstat(name, pfd) is None:
                failure = f"it left no {name} in {part_path}"
            if failure is not None:
                self.errors.append(
                    f"{self.phase}: movetool {' '.join(argv)}: {failure}; {src} is kept"
                )
                return
            _sync_tree(pfd, name)
            copied: list[str] = []
            complete = self._move_entry(pfd, dfd, name, part_path, dpath, copied)
            self._settle(pfd, dfd, part_path, dpath, copied)
        finally:
            os.close(pfd)
        if not complete:
            return
        try:
            os.rmdir(part, dir_fd=dfd)
            os.fsync(dfd)
        except OSError as e:
            self._error("finish", part_path, e)
            return
        for err in removal.remove_entry(sfd, name, src):  # the tool may have removed it itself
            self.errors.append(f"{self.phase}: {err}")

    # ---------------------------------------------------------------- copying

    def copy_path(self, src: str, dst: str, line: str) -> None:
        """A stage_in/stage_out directive: copy file or directory src to dst (a directory
        is merged into an existing one; a file replaces an existing file). Both paths are
        the user's: they are opened without /proc magic links and must stay on the file
        systems their own paths pass through (stage_confined)."""
        side = "stage_in" if self.phase == "staging-in" else "stage_out"
        try:
            # The directive names this path: follow its links (not magic ones), not links below.
            spfd = open_stage_path(src, os.O_PATH)
        except FileNotFoundError:
            if self.phase == "staging-out":
                self.warnings.append(f"{line!r}: {src} does not exist; nothing copied out")
            else:
                self.errors.append(
                    f"{line!r}: stage_in source {src} does not exist; fix the directive"
                )
            return
        except OSError as e:
            self._refuse_path(line, f"{side} source", src, e)
            return
        try:
            self._copy_resolved(spfd, src, dst, line, side)
        finally:
            os.close(spfd)

    def _copy_resolved(self, spfd: int, src: str, dst: str, line: str, side: str) -> None:
        try:
            foreign = stage_confined(spfd, src, self._mounts)
            if foreign is not None:
                self._refuse_mount(line, f"{side} source", src, foreign)
                return
            st = os.fstat(spfd)
        except OSError as e:
            self._error("stat", src, e, f"fix {line!r}")
            return
        parent, _, name = dst.rpartition("/")
        try:
            pfd = open_stage_dir(parent or "/")
        except OSError as e:
            self._refuse_path(line, f"{side} destination", parent or "/", e)
            return
        try:
            foreign = stage_confined(pfd, parent or "/", self._mounts)
            if foreign is not None:
                self._refuse_mount(line, f"{side} destination", dst, foreign)
                return
            if stat.S_ISDIR(st.st_mode):
                sfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=spfd)
                try:
                    self._copy_into(sfd, pfd, name, st, src, dst)
                finally:
                    os.close(sfd)
            elif stat.S_ISREG(st.st_mode):
                there = _lstat(name, pfd)
                if there is not None and stat.S_ISDIR(there.st_mode):
                    self.errors.append(
                        f"{line!r}: {dst} is a directory and {src} a file; "
                        "name the file itself as destination"
                    )
                    return
                # Reopened through our own O_PATH fd: the very file examined above.
                fd = os.open(f"/proc/self/fd/{spfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                try:
                    self._copy_file_fd(fd, pfd, name, os.fstat(fd), dst)
                finally:
                    os.close(fd)
            else:
                self.errors.append(f"{line!r}: {src} is neither a file nor a directory")
                return
            os.fsync(pfd)  # the rename into place is durable too
        except OSError as e:
            self._error("copy", f"{src} -> {dst}", e, _fix(e))
        finally:
            os.close(pfd)

    def _mounts(self) -> dict[int, str]:
        """The host's mount table (mount id -> mount point), read once per worker: a
        mount made later is unknown, so refused, never trusted."""
        if self._mount_table is None:
            self._mount_table = mount_table()
        return self._mount_table

    def _refuse_path(self, line: str, what: str, path: str, e: OSError) -> None:
        if e.errno == errno.ELOOP:
            reason = (
                "it leads through a /proc magic link (such as /proc/PID/root or "
                "/proc/PID/fd/N), which staging never follows, or through too many "
                "symbolic links; name the file's own path below an allowed root"
            )
        elif e.errno == errno.ENOSYS:
            reason = "this kernel has no openat2 (Linux 5.6 or later is needed to stage)"
        else:
            reason = (e.strerror or str(e)).rpartition(": ")[2] + f"; fix {line!r}"
        self.errors.append(f"{line!r}: {what} {path}: {reason}")

    def _refuse_mount(self, line: str, what: str, path: str, foreign: str) -> None:
        self.errors.append(
            f"{line!r}: {what} {path} leads onto {foreign}, a file system its path does "
            "not pass through; staging never follows a link onto another file system: "
            "name the path on that file system itself, below an allowed root"
        )

    def _copy_into(
        self, sfd: int, parent_fd: int, name: str, st: os.stat_result, spath: str, dpath: str
    ) -> None:
        """Copy the directory open at sfd to parent_fd/name (merging)."""
        there = _lstat(name, parent_fd)
        if there is None:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        elif not stat.S_ISDIR(there.st_mode):
            self.errors.append(
                f"{self.phase}: copy {spath} -> {dpath}: the destination "
                "exists and is not a directory; remove it"
            )
            return
        dfd = open_dir_at(parent_fd, name)
        try:
            ok = True
            for entry in sorted(os.listdir(sfd)):
                if entry.startswith(PART):
                    continue  # an interrupted copy's part file, never data
                ok &= self._copy_entry(sfd, dfd, entry, f"{spath}/{entry}", f"{dpath}/{entry}")
            os.fsync(dfd)
            if ok:
                _copy_dir_meta(dfd, st)
        finally:
            os.close(dfd)

    def _copy_entry(self, sfd: int, dfd: int, name: str, src: str, dst: str) -> bool:
        try:
            st = _lstat(name, sfd)
            if st is None:
                return True
            if stat.S_ISDIR(st.st_mode):
                sub = open_dir_at(sfd, name)
                try:
                    self._copy_into(sub, dfd, name, st, src, dst)
                finally:
                    os.close(sub)
                return True
            there = _lstat(name, dfd)
            if there is not None and stat.S_ISDIR(there.st_mode):
                self.errors.append(
                    f"{self.phase}: copy {src} -> {dst}: the destination is a directory; remove it"
                )
                return False
            return self._copy_nondir(sfd, dfd, name, st, src, dst)
        except OSError as e:
            self._error("copy", f"{src} -> {dst}", e, _fix(e))
            return False

    def _copy_nondir(
        self, sfd: int, dfd: int, name: str, st: os.stat_result, src: str, dst: str
    ) -> bool:
        """Copy a file, symlink or fifo to dfd/name via a part file; True when in place."""
        part = part_name(name)
        mode = st.st_mode
        if stat.S_ISREG(mode):
            try:
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=sfd
                )
            except PermissionError:
                _grant(sfd, name, 0o400)  # our own file, mode 0: still ours to move
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=sfd
                )
            try:
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    raise OSError(
                        errno.EAGAIN, "it was replaced while being copied; run the step again"
                    )
                self._copy_file_fd(fd, dfd, name, st, dst)
            finally:
                os.close(fd)
            return True
        _unlink_quiet(part, dfd)
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=sfd), part, dir_fd=dfd)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(part, stat.S_IMODE(mode), dir_fd=dfd)
        else:
            kind = "socket" if stat.S_ISSOCK(mode) else "device"
            self.warnings.append(
                f"{self.phase}: {src} is a {kind}, which has no content; not copied"
            )
            return False
        os.rename(part, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        self._commit()
        return True

    def _copy_file_fd(self, fd: int, dfd: int, name: str, st: os.stat_result, dst: str) -> None:
        part = part_name(name)
        _unlink_quiet(part, dfd)
        out = os.open(part, os.O_WRONLY | files.CREATE, 0o600, dir_fd=dfd)
        try:
            _copy_data(fd, out)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(out)
        except BaseException:
            os.close(out)
            _unlink_quiet(part, dfd)  # never leave half a file, even under a part name
            raise
        os.close(out)
        os.rename(part, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        self._commit()

    # ------------------------------------------------------------- stdio links

    def link_stdio(self, session: str, scratch: str, names: list[str]) -> None:
        """stdout/stderr stay in the session directory; scratch gets symlinks to them."""
        try:
            sfd, dfd = open_dir_path(session), open_dir_path(scratch)
        except OSError as e:
            self._error("open", f"{session} or {scratch}", e)
            return
        try:
            for name in names:
                target = f"{session}/{name}"
                try:
                    fd = os.open(
                        name,
                        os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                        0o600,
                        dir_fd=sfd,
                    )
                    os.close(fd)
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                        self._error("create", target, e)
                        continue
                try:
                    if os.readlink(name, dir_fd=dfd) == target:
                        continue
                    self.errors.append(f"{self.phase}: {scratch}/{name} exists; remove it")
                except FileNotFoundError:
                    os.symlink(target, name, dir_fd=dfd)
                except OSError as e:
                    self._error("link", f"{scratch}/{name} -> {target}", e, "remove what is there")
            os.fsync(dfd)
        finally:
            os.close(sfd)
            os.close(dfd)

    def unlink_stdio(self, session: str, scratch: str, names: list[str]) -> None:
        """Drop the symlinks link_stdio made (a file the job put there instead is moved)."""
        try:
            dfd = open_dir_path(scratch)
        except OSError as e:
            self._error("open", scratch, e)
            return
        try:
            for name in names:
                try:
                    if os.readlink(name, dir_fd=dfd) == f"{session}/{name}":
                        os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass  # absent, or not our link: moved like any other output
        finally:
            os.close(dfd)


def _unlink_quiet(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _copy_data(src: int, dst: int) -> None:
    offset = 0
    while True:
        try:
            n = os.copy_file_range(src, dst, 1 << 24)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            break
        if n == 0:
            return
        offset += n
    while True:  # the portable way, from where copy_file_range stopped
        chunk = os.pread(src, 1 << 20, offset)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            written = os.write(dst, view)
            view = view[written:]
        offset += len(chunk)


def _copy_dir_meta(dfd: int, st: os.stat_result) -> None:
    os.fchmod(dfd, stat.S_IMODE(st.st_mode) | 0o700)  # keep it ours to finish and remove
    os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _sync_tree(dir_fd: int, name: str) -> None:
    """fsync every file and directory below dir_fd/name (what a movetool wrote)."""
    st = _lstat(name, dir_fd)
    if st is None or stat.S_ISLNK(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        fd = open_dir_at(dir_fd, name)
        try:
            for entry in os.listdir(fd):
                _sync_tree(fd, entry)
            os.fsync(fd)
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
        )
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fix(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "the destination is full: free space there, then run the step again"
    if e.errno == errno.EDQUOT:
        return "the job user's quota is exhausted there: raise it, then run the step again"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "the job user may not do this; fix the permissions, then run the step again"
    return ""


def _tail(data: bytes | str) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    text = text.strip().replace("\n", " | ")
    return text[-TOOL_OUTPUT_TAIL:] or "(no output)"


def _tool_env() -> dict[str, str]:
    try:
        pw = pwd.getpwuid(os.getuid())
        home, name = pw.pw_dir, pw.pw_name
    except KeyError:
        home, name = "/", str(os.getuid())
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": name,
        "LOGNAME": name,
        "LANG": "C.UTF-8",
    }


# ---------------------------------------------------------------------- the worker


class OutOfTime(Exception):
    """A worker did not finish within its deadline; it was killed (SIGKILL, its whole
    process group). reaped: False when it could not be reaped at once (stuck in the
    user's file system: init reaps it once that answers)."""

    def __init__(self, what: str, pid: int, seconds: float, reaped: bool) -> None:
        super().__init__(f"{what}: still running after {seconds:g} s")
        self.pid = pid
        self.seconds = seconds
        self.reaped = reaped


KILL_GRACE = 2.0  # seconds root waits for a killed worker to be reaped, then leaves it


def as_user(
    uid: int,
    gid: int,
    groups: list[int],
    what: str,
    work: Callable[[], Result],
    deadline: float = 0.0,
) -> Result:
    """Run work() in a forked child (launcher.system.fork: it holds nothing of root's, not the
    job lock, state or tree fds) that is the job user; its Result, or an error.

    With a deadline (seconds, > 0) root waits for the worker at most that long: it only
    polls the worker's pipes, never touches the user's files, so a file system she
    serves (a stopped FUSE server) can stall the worker but never root. When it passes,
    the worker's process group is killed and OutOfTime raised."""
    r, w = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    end = time.monotonic() + deadline if deadline > 0 else None

    def worker() -> None:
        switch_user(uid, gid, groups)
        # After the uid change: changing credentials clears the parent-death signal.
        libc.set_pdeathsig(signal.SIGKILL)  # a killed jobns must not leave it running
        if os.getppid() != parent:
            os._exit(1)
        os.umask(0o077)
        os.chdir("/")
        try:
            result = work()
        except BaseException as e:
            result = {"errors": [f"{what}: {e}"], "warnings": []}
        data = json.dumps(result).encode()
        while data:
            data = data[os.write(w, data) :]

    # A process group of its own (set on both sides: no race with a kill), so that a
    # movetool it runs dies with it.
    child = spawn(worker, keep=(w,), before=lambda: os.setpgid(0, 0))
    try:
        os.setpgid(child.pid, child.pid)
    except OSError:
        pass  # it did so itself already
    os.close(w)
    report, failure_data, done = _read_worker(r, child.report_fd, end)
    child.report_fd = -1  # closed by _read_worker
    if not done:
        _kill_group(child.pid)
        reaped = _reap(child.pid, KILL_GRACE)
        raise OutOfTime(what, child.pid, deadline, reaped is not None)
    # Both pipes closed: it is exiting. Still bounded: closing a file of a stalled FUSE
    # server on exit can block it.
    left = KILL_GRACE if end is None else max(KILL_GRACE, end - time.monotonic())
    reaped = _reap(child.pid, left)
    if reaped is None:
        _kill_group(child.pid)
    status = reaped or 0
    if report is None:
        return {
            "errors": [
                f"{what}: the worker (job user {uid}) reported more than {MAX_REPORT} "
                "bytes; not read"
            ],
            "warnings": [],
        }
    if os.WIFSIGNALED(status):
        return {
            "errors": [
                f"{what}: the worker (job user {uid}) was killed by signal "
                f"{os.WTERMSIG(status)}; run the step again"
            ],
            "warnings": [],
        }
    failure = _failure(failure_data)
    if failure is not None:
        return {"errors": [f"{what}: {failure}"], "warnings": []}
    try:
        result = json.loads(report)
        assert isinstance(result, dict)
        return result
    except (ValueError, AssertionError, RecursionError):
        return {
            "errors": [
                f"{what}: the worker (job user {uid}) died without a report (status {status:#x})"
            ],
            "warnings": [],
        }


def _read_worker(r: int, report_fd: int, end: float | None) -> tuple[bytes | None, bytes, bool]:
    """Read the worker's result pipe and its fork report pipe until both are closed or
    `end` (monotonic) passes: (result, or None if over MAX_REPORT; fork report; whether
    both closed). Closes both fds."""
    chunks: list[bytes] = []
    size = 0
    failure = b""
    poller = select.poll()
    waiting = {r, report_fd}
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    try:
        while waiting:
            if end is None:
                timeout_ms = None
            else:
                left = end - time.monotonic()
                if left <= 0:
                    return None, failure, False
                timeout_ms = max(1, int(left * 1000) + 1)
            for fd, _ in poller.poll(timeout_ms):
                chunk = os.read(fd, 1 << 16)
                if fd == report_fd:
                    failure = (failure + chunk)[:MAX_REPORT]
                else:
                    chunks.append(chunk)
                    size += len(chunk)
                if not chunk or size > MAX_REPORT:
                    # Past MAX_REPORT, closing the pipe ends the worker's writes.
                    poller.unregister(fd)
                    waiting.discard(fd)
                    if fd == r:
                        os.close(r)
                        r = -1
    finally:
        for fd in (r, report_fd):
            if fd >= 0:
                os.close(fd)
    return (b"".join(chunks) if size <= MAX_REPORT else None), failure, True


def _failure(data: bytes) -> str | None:
    """The message of a fork report (launcher.system.fork: "<code> <kind> <message>")."""
    if not data:
        return None
    text = data.decode(errors="replace")
    _, _, rest = text.partition(" ")
    kind, _, msg = rest.partition(" ")
    return msg if kind in ("U", "E") else text


def _kill_group(pid: int) -> None:
    """SIGKILL the worker's process group: the worker, and a movetool it started. Only
    ever called before the worker is reaped, so the group id is still the worker's."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(pid: int, grace: float) -> int | None:
    """The worker's wait status, waiting at most grace seconds; None if it has not
    ended by then (stuck in a file system's uninterruptible request, a SIGKILL pending):
    it is left to init, which reaps it once it ends (root must not hang on it)."""
    end = time.monotonic() + grace
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if got:
            return status
        if time.monotonic() >= end:
            return None
        time.sleep(0.01)


def errors_of(result: Result) -> list[str]:
    """A worker's errors, bounded again (its report is the job user's process's)."""
    return _lines_of(result, "errors")


def warnings_of(result: Result) -> list[str]:
    return _lines_of(result, "warnings")


def _lines_of(result: Result, key: str) -> list[str]:
    lines = Lines()
    items = result.get(key)
    if isinstance(items, list):
        lines += items
    dropped = result.get(f"{key}_dropped")
    if type(dropped) is int and dropped > 0:
        lines.dropped += min(dropped, 1 << 40)
    return lines.listed(key)


def split_movetool(movetool: str) -> list[str] | None:
    if not movetool:
        return None
    try:
        argv = shlex.split(movetool)
    except ValueError as e:
        raise JobnsError(f"[arc] movetool = {movetool!r}: {e}") from None
    return argv or None
