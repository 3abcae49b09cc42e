"""Shared machinery of the attack tests (DESIGN.md "Who attacks jobns").

Fixtures here are never autouse, so other modules of this directory are unaffected:
- ``world``: a sandbox, the two users (alice: the job user, bob: another user), a
  world-writable scratch directory, and a registry of every process a test starts,
  killed (by pid or process group) and every mount under the sandbox detached when the
  test ends, pass or fail.
- ``fuse``: a squashfs image and a way for an ordinary user to FUSE-mount it.

Attackers run as jobnsalice / jobnsbob with the system interpreter (/usr/bin/python3),
which every user can execute; small programs below do what a shell cannot (setns,
pidfd_getfd, ptrace).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts, require

PY = "/usr/bin/python3"
PAUSE = "JOBNS_TEST_PAUSE_IN"
MIB = 1024 * 1024

# ---------------------------------------------------------------- attacker programs

# argv: PID SRC DST [SRC DST ...]: enter the user and mount namespaces of PID (a task of
# the caller's own job) and bind-mount each SRC over DST there. Needs nothing but owning
# the job: the job's mount namespace belongs to the job user's user namespace.
NS_BIND = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    e = ctypes.get_errno()
    sys.exit(f"{what}: {os.strerror(e)}")
pid = sys.argv[1]
for kind, flag in (("user", 0x10000000), ("mnt", 0x00020000)):
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
    if libc.setns(fd, flag) != 0:
        fail(f"setns {kind}")
for src, dst in zip(sys.argv[2::2], sys.argv[3::2]):
    if libc.mount(src.encode(), dst.encode(), None, 4096, None) != 0:  # MS_BIND
        fail(f"mount {src} {dst}")
print("mounted")
"""

# The start of a program whose argv[1] is the PID of a task of the caller's own voluntary
# job: enter its user and mount namespaces (they are hers), exit with the reason if not.
NS_JOIN = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for kind, flag in (("user", 0x10000000), ("mnt", 0x00020000)):
    fd = os.open(f"/proc/{sys.argv[1]}/ns/{kind}", os.O_RDONLY)
    if libc.setns(fd, flag) != 0:
        sys.exit(f"setns {kind}: {os.strerror(ctypes.get_errno())}")
"""

# argv: PID: duplicate every fd of PID into ourselves (pidfd_getfd, syscall 438) and
# print a JSON list of [fd, st_dev, st_ino] for each one we got, and the errnos we did not.
STEAL_FDS = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
pid = int(sys.argv[1])
try:
    pfd = os.pidfd_open(pid)
except OSError as e:
    print(json.dumps({"got": [], "errors": [e.errno]})); sys.exit(0)
got, errors = [], []
for fd in range(256):
    r = libc.syscall(438, pfd, fd, 0)
    if r >= 0:
        st = os.fstat(r)
        got.append([fd, st.st_dev, st.st_ino])
    else:
        e = ctypes.get_errno()
        if e != 9:  # EBADF: no such fd there
            errors.append(e)
print(json.dumps({"got": got, "errors": sorted(set(errors))}))
"""

# argv: PID: PTRACE_ATTACH (16); prints "attached" or the errno.
PTRACE_ATTACH = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
r = libc.ptrace(16, int(sys.argv[1]), None, None)
print("attached" if r == 0 else f"errno {ctypes.get_errno()}")
"""

# argv: PATH: open it and print the outcome: "ok" or the exception's class name.
TRY_OPEN = r"""
import os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print(path, "ok")
    except OSError as e:
        print(path, type(e).__name__)
"""


# ---------------------------------------------------------------------- assertions


def no_crash(r: subprocess.CompletedProcess[str]) -> None:
    """Whatever happened, jobns did not crash (no traceback, no internal error)."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "internal error" not in out, out


def one_line(r: subprocess.CompletedProcess[str]) -> None:
    """Exactly one `jobns: ...` line on stderr (docs/command-line.md "Exit codes")."""
    no_crash(r)
    assert r.stderr.startswith("jobns: ") and r.stderr.count("\n") == 1, r.stderr


def refused(r: subprocess.CompletedProcess[str]) -> None:
    """A task of a job that was refused at setup: 125 and one line saying so."""
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    one_line(r)
    assert "refused" in r.stderr.lower(), r.stderr


def unescape(field: str) -> str:
    """/proc/self/mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, source) of every mount of this (the host's) namespace."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            rest = right.split()
            found.append((unescape(left.split()[4]), rest[0], unescape(rest[1])))
    return found


def shmem_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except OSError:
        return ""


def euid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except OSError:
        return None
    return None


def uids_of(pid: int) -> list[int]:
    """Real, effective, saved and fs uid of a process ([] if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        return []
    return []


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def fd_targets(pid: int) -> dict[int, str]:
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for name in names:
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return out


def identity(path: Path | str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def snapshot(top: Path) -> list[tuple[str, str, int, int, int]]:
    """Every entry below top with its kind, owner, mode and size (or link target):
    what must not change when an attack fails."""
    out = []
    for root, dirs, names in os.walk(top):
        for n in sorted([*dirs, *names]):
            p = Path(root) / n
            st = os.lstat(p)
            what = (
                os.readlink(p)
                if stat.S_ISLNK(st.st_mode)
                else (p.read_bytes().hex() if stat.S_ISREG(st.st_mode) else "")
            )
            out.append(
                (
                    str(p.relative_to(top)),
                    what,
                    st.st_uid,
                    stat.S_IMODE(st.st_mode),
                    stat.S_IFMT(st.st_mode),
                )
            )
    st = os.lstat(top)
    out.append((".", "", st.st_uid, stat.S_IMODE(st.st_mode), stat.S_IFMT(st.st_mode)))
    return sorted(out)


# --------------------------------------------------------------------------- world


class World:
    """One attack's stage: a sandbox, alice (the job user), bob (another user)."""

    def __init__(self, box: Sandbox, users: list[OsUser]) -> None:
        self.box = box
        self.alice, self.bob = users
        self.w = box.root / "w"  # world-writable scratch for pid files and proofs
        self.w.mkdir()
        self.w.chmod(0o1777)
        self.procs: list[subprocess.Popen[Any]] = []
        self.pids: list[int] = []
        self.fuse_mode: int | None = None

    # ---------------------------------------------------------------- processes

    def as_user(
        self,
        user: OsUser | None,
        argv: Sequence[str],
        timeout: float = 60,
        env: dict[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        kw.setdefault("cwd", "/")
        result: subprocess.CompletedProcess[str] = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=Sandbox.env(user, env),
            **Sandbox.creds(user),
            **kw,
        )
        return result

    def python(
        self, user: OsUser | None, code: str, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self.as_user(user, [PY, "-c", code, *args], timeout=timeout)

    def start(self, user: OsUser | None, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]:
        """A background process of user's, in a process group of its own (killed at the
        end of the test by that group's id)."""
        kw.setdefault("cwd", "/")
        kw.setdefault("stdin", subprocess.DEVNULL)
        env = Sandbox.env(user, kw.pop("env", None))
        p: subprocess.Popen[str] = subprocess.Popen(
            list(argv), text=True, start_new_session=True, env=env, **Sandbox.creds(user), **kw
        )
        self.procs.append(p)
        return p

    def start_jobns(
        self,
        args: Sequence[str],
        user: OsUser | None = None,
        env: dict[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.Popen[str]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = self.box.popen(args, user=user, env=env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def track(self, *pids: int) -> None:
        self.pids += pids

    def wait_file(self, path: Path, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = path.read_text()
                if text.endswith("\n"):
                    return text
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} did not appear within {timeout}s")
            time.sleep(0.02)

    def task(
        self,
        job: str,
        user: OsUser | None,
        script: str = "exec sleep 300",
        env: dict[str, str] | None = None,
    ) -> tuple[subprocess.Popen[str], int]:
        """A task of the job (`jobns run --job-id JOB`) that writes its pid, then runs
        script; returns (the jobns process, the task's pid)."""
        pidfile = self.w / f"task-{job}-{len(self.procs)}.pid"
        p = self.start_jobns(
            ["run", "--job-id", job, "--", "sh", "-c", f"echo $$ > {pidfile}; {script}"],
            user=user,
            env=env,
        )
        pid = int(self.wait_file(pidfile))
        self.track(pid)
        return p, pid

    # ------------------------------------------------------------------- jobns

    def setup(
        self,
        job: str,
        *extra: str,
        user: OsUser | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        who = user or self.alice
        return self.box.run(
            ["setup", "--job-id", job, "--user", who.name, *extra], env=env, timeout=timeout
        )

    def teardown(
        self, job: str, *extra: str, timeout: float = 120, released: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The epilog; released: then wait for its release process too (it removes what
        the epilog renamed out of the job's way, launcher.lifecycle.release)."""
        r = self.box.run(["teardown", "--job-id", job, *extra], timeout=timeout)
        if released:
            self.box.wait_released(timeout=timeout)
        return r

    def run(
        self,
        job: str,
        script: str,
        user: OsUser | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        extra: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        return self.box.run(
            ["run", "--job-id", job, *extra, "--", "sh", "-c", script],
            user=user,
            env=env,
            timeout=timeout,
        )

    def status(self) -> dict[str, Any]:
        r = self.box.run(["status", "--json"])
        assert r.returncode == 0, r.stderr
        doc: dict[str, Any] = json.loads(r.stdout)
        return doc

    # ------------------------------------------------------------------- places

    def decoy(self, name: str = "decoy", mode: int = 0o755) -> Path:
        """A root-owned directory standing in for /etc (a regression that followed a
        link into it must not wreck the test machine): a file and a subdirectory."""
        d = self.box.root / name
        d.mkdir(mode=mode)
        d.chmod(mode)
        (d / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (d / "passwd").chmod(0o644)
        (d / "sub").mkdir(mode=0o755)
        (d / "sub" / "shadow").write_text("root:$6$secret:19000::::::\n")
        (d / "sub" / "shadow").chmod(0o600)
        return d

    def jobs_left(self) -> list[str]:
        jobs = self.box.state / "jobs"
        return sorted(os.listdir(jobs)) if jobs.is_dir() else []

    def assert_clean(self, keep: Sequence[Path | str] = ()) -> None:
        """Nothing of any job is left: no mount, no state, no directory in the bases
        but the entries named in keep (what the contract says is kept)."""
        assert job_mounts(self.box) == []
        assert self.jobs_left() == []
        assert sorted(self.box.leftovers()) == sorted(str(k) for k in keep)

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        # Mounts a test (or a failing jobns) left under the sandbox: deepest first.
        for _ in range(3):
            left = sorted(
                {
                    t
                    for t, _, _ in mounts()
                    if t.startswith((str(self.box.root) + "/", str(self.box.shm)))
                    and t != str(self.box.state)
                },
                key=len,
                reverse=True,
            )
            if not left:
                break
            for target in left:
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)
        if self.fuse_mode is not None:
            os.chmod("/dev/fuse", self.fuse_mode)


@pytest.fixture
def world(sandbox: Sandbox, users: list[OsUser]) -> Iterator[World]:
    w = World(sandbox, users)
    try:
        yield w
    finally:
        w.cleanup()


# ---------------------------------------------------------------------------- FUSE


class Fuse:
    """An ordinary user's FUSE mounts (squashfuse over a small squashfs image)."""

    def __init__(self, world: World) -> None:
        self.world = world
        src = world.box.root / "fuse-src"
        src.mkdir()
        (src / "inside").write_text("a file on the user's FUSE file system\n")
        (src / "dir").mkdir()
        self.image = world.box.root / "fuse.sqfs"
        subprocess.run(
            ["mksquashfs", str(src), str(self.image), "-quiet", "-noappend", "-no-progress"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.image.chmod(0o644)

    def mount(self, user: OsUser, mountpoint: Path, *options: str) -> subprocess.Popen[str]:
        """user mounts the image at mountpoint (squashfuse -f: its pid is the server)."""
        opts = ["-o", ",".join(options)] if options else []
        p = self.world.start(
            user,
            ["squashfuse", "-f", *opts, str(self.image), str(mountpoint)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while not any(t == str(mountpoint) and ft.startswith("fuse") for t, ft, _ in mounts()):
            if p.poll() is not None:
                err = p.stderr.read() if p.stderr else ""
                raise AssertionError(f"squashfuse {mountpoint} failed: {err}")
            assert time.monotonic() < deadline, f"{mountpoint} was not mounted"
            time.sleep(0.02)
        return p


@pytest.fixture
def fuse(world: World) -> Fuse:
    for tool in ("squashfuse", "mksquashfs", "fusermount3"):
        require(
            shutil.which(tool) is not None,
            f"{tool} is missing (apt-get install squashfuse squashfs-tools fuse3)",
        )
    require(os.path.exists("/dev/fuse"), "no /dev/fuse on this machine")
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    if mode & 0o006 != 0o006:
        # Debian's udev makes /dev/fuse 0666 (50-udev-default.rules); machines without
        # udev (this VM, containers) leave it 0600. Restored when the test ends.
        world.fuse_mode = mode
        os.chmod("/dev/fuse", 0o666)
    return Fuse(world)


FUSE_CONF = Path("/etc/fuse.conf")


@pytest.fixture
def fuse_allow_other(fuse: Fuse) -> Iterator[Fuse]:
    """FUSE as on sites that let users share mounts (user_allow_other in /etc/fuse.conf,
    usual where sshfs is used): a user may mount with allow_root, and then root's own
    lookups reach her FUSE server, which she can stop. /etc/fuse.conf is restored."""
    old = FUSE_CONF.read_text() if FUSE_CONF.exists() else None
    FUSE_CONF.write_text((old or "") + "\nuser_allow_other\n")
    try:
        yield fuse
    finally:
        if old is None:
            FUSE_CONF.unlink()
        else:
            FUSE_CONF.write_text(old)
