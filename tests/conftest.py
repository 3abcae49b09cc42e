"""Shared fixtures: the installed jobns, ordinary test users, and a private set of bases.

Root and real-component tests never skip silently on CI: under CI=true a missing
prerequisite is a failure, elsewhere a skip that says what is missing.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
JOBNS = os.environ.get("JOBNS_BIN", "/opt/jobns/venv/bin/jobns")
ON_CI = os.environ.get("CI") == "true"
TEST_USERS = ("jobnsalice", "jobnsbob")


def require(condition: bool, reason: str) -> None:
    """Skip with a reason off CI; fail on CI, where every test must really run."""
    if condition:
        return
    if ON_CI:
        pytest.fail(f"prerequisite missing on CI: {reason}")
    pytest.skip(reason)


def require_root() -> None:
    require(os.geteuid() == 0, "needs root (real mount namespaces and chown)")
    require(os.access(JOBNS, os.X_OK), f"{JOBNS} is not installed (run ci/install-python)")


class OsUser:
    def __init__(self, name: str) -> None:
        pw = pwd.getpwnam(name)
        self.name = name
        self.uid = pw.pw_uid
        self.gid = pw.pw_gid
        self.home = pw.pw_dir


def _ensure_user(name: str) -> OsUser:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
    return OsUser(name)


@pytest.fixture(scope="session")
def users() -> Iterator[list[OsUser]]:
    """Two ordinary users (created once, removed at the end of the session)."""
    require_root()
    created = [n for n in TEST_USERS if not _exists(n)]
    made = [_ensure_user(n) for n in TEST_USERS]
    yield made
    for n in created:
        subprocess.run(["userdel", "-r", n], check=False, capture_output=True)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


class Sandbox:
    """A config whose bases live in a directory of this test only."""

    def __init__(self, root: Path, shm: Path) -> None:
        self.root = root
        self.local = root / "local"
        self.shared = root / "shared"
        self.state = root / "state"
        self.shm = shm
        for d in (self.local, self.shared, self.shm):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o1777)  # like /tmp: ordinary users make their own job directories
        self.state.mkdir(mode=0o755, exist_ok=True)
        # The once-per-boot warning about a private / (these VMs) belongs to its own test.
        (self.state / "propagation-checked").touch()
        self.config = root / "jobns.toml"
        self.write_config()

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(
            f'local_base = "{self.local}"\nshm_base = "{self.shm}"\n'
            f'shared_base = "{self.shared}"\nstate_dir = "{self.state}"\nkill_wait = 2\n' + extra
        )
        self.config.chmod(0o644)

    def run(
        self,
        args: Sequence[str],
        user: OsUser | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        kw.setdefault("cwd", "/")  # the checkout may live under /tmp or /var/tmp
        result: subprocess.CompletedProcess[str] = subprocess.run(
            self.cmd(args),
            timeout=timeout,
            capture_output=True,
            text=True,
            env=self.env(user, env),
            **self.creds(user),
            **kw,
        )
        return result

    def popen(
        self,
        args: Sequence[str],
        user: OsUser | None = None,
        env: dict[str, str] | None = None,
        **kw: Any,
    ) -> subprocess.Popen[str]:
        kw.setdefault("cwd", "/")
        proc: subprocess.Popen[str] = subprocess.Popen(
            self.cmd(args), text=True, env=self.env(user, env), **self.creds(user), **kw
        )
        return proc

    def cmd(self, args: Sequence[str]) -> list[str]:
        sub, *rest = args
        return [JOBNS, sub, "--config", str(self.config), *rest]

    @staticmethod
    def creds(user: OsUser | None) -> dict[str, Any]:
        if user is None:
            return {}
        return {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}

    @staticmethod
    def env(user: OsUser | None, extra: dict[str, str] | None) -> dict[str, str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
        if user is not None:
            env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
        else:
            env.update(HOME="/root", USER="root")
        env.update(extra or {})
        return env

    def leftovers(self) -> list[str]:
        """Everything left in the bases (what a finished job must not leave), once the
        epilogs' release processes have finished their work."""
        self.wait_released()
        out: list[str] = []
        for base in (self.local, self.shared, self.shm):
            out += [str(p) for p in base.iterdir()]
        return out

    def wait_released(self, timeout: float = 60) -> None:
        """Wait until no release process of an epilog is at work: jobns teardown returns
        once a job's trees are renamed out of its way, and a process of its own removes
        them (launcher.lifecycle.release), holding a lock on its record under state/releases."""
        deadline = time.monotonic() + timeout
        while any(_held(p) for p in sorted((self.state / "releases").glob("*"))):
            assert time.monotonic() < deadline, "a release process is still at work"
            time.sleep(0.02)


def _held(path: Path) -> bool:
    """Is the file locked (flock) by another process?"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.fixture
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_root()
    # Not under /tmp: the job's own /tmp hides the host's, and tests look from outside.
    root = Path("/var/lib/jobns-tests") / uuid.uuid4().hex[:12]
    root.mkdir(parents=True)
    Path("/var/lib/jobns-tests").chmod(0o755)
    root.chmod(0o755)
    shm = Path("/dev/shm") / f"jobns-tests-{root.name}"
    box = Sandbox(root, shm)
    yield box
    # jobns setup makes state_dir a private bind mount of itself (as on a real node); a
    # test that failed half-way may also have left a job's capacity or pin mounted: no
    # run of the suite leaves a mount behind on the node, whatever failed.
    for target in sorted(_mounts_under(root, shm), reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)


def _mounts_under(*tops: Path) -> list[str]:
    out = []
    for line in host_mounts().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if any(target == str(t) or target.startswith(f"{t}/") for t in tops):
            out.append(target)
    return out


def host_mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


def _scratch_targets() -> set[str]:
    return {
        ln for ln in host_mounts().splitlines() if ln.split()[4] in ("/tmp", "/var/tmp", "/dev/shm")
    }


HOST_SCRATCH_MOUNTS = _scratch_targets()  # the node's own, before any test ran


def job_mounts(box: Sandbox) -> list[str]:
    """Host mounts a job may have left: pins, binds, anything under the sandbox except
    the state directory's own self-bind (deliberate, like Slurm's BasePath)."""
    out = []
    for line in host_mounts().splitlines():
        target = line.split()[4]
        if target == str(box.state):
            continue
        if target.startswith((str(box.root), str(box.shm))) or (
            target in ("/tmp", "/var/tmp", "/dev/shm") and line not in HOST_SCRATCH_MOUNTS
        ):
            out.append(line)
    return out


def assert_refused(
    box: Sandbox, job: str, user: OsUser, setup: subprocess.CompletedProcess[str], needle: str
) -> None:
    """The job's user made it impossible: the prolog exits 0 naming the reason, nothing of
    the job exists, each task exits 125 with the reason, and the epilog forgets it."""
    assert setup.returncode == 0 and "refused" in setup.stderr and needle in setup.stderr, (
        setup.stderr
    )
    assert box.leftovers() == [] and own_mounts(box) == []
    task = box.run(["run", "--job-id", job, "--", "true"], user=user)
    assert task.returncode == 125 and "refused" in task.stderr and needle in task.stderr, (
        task.stderr
    )
    assert task.stderr.count("\n") == 1
    down = box.run(["teardown", "--job-id", job])
    assert down.returncode == 0 and down.stderr == "", down.stderr
    assert box.leftovers() == [] and own_mounts(box) == []
    assert sorted(os.listdir(box.state / "jobs")) == []


def own_mounts(box: Sandbox) -> list[str]:
    """job_mounts, less the file systems a test mounted itself (source jobns-test)."""
    return [m for m in job_mounts(box) if " - tmpfs jobns-test " not in m]
