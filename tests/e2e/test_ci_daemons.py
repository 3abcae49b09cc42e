"""The daemons that ci/start-docker and ci/start-slurm start actually work.

Outside CI a missing daemon skips these tests with the reason; with CI=true it fails them,
so a broken CI set-up can never pass as "all skipped".
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI") == "true"
# Root's PATH here starts with pyenv shims under /root, which other users cannot read.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT = 120.0


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this must work, not skip)")
    pytest.skip(reason)


def _run(
    argv: list[str], *, cwd: str | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=SAFE_PATH)
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env
    )


def _describe(proc: subprocess.CompletedProcess[str]) -> str:
    return f"{proc.args!r} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"


def _require_root() -> None:
    if os.geteuid() != 0:
        _unavailable("needs root (the CI scripts run as root)")


def _require_docker() -> None:
    _require_root()
    if shutil.which("docker") is None:
        _unavailable("docker CLI not installed: run ci/install-system")
    proc = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    if proc.returncode != 0:
        _unavailable(
            f"dockerd not answering `docker info`: run ci/start-docker ({proc.stderr.strip()})"
        )


def _require_slurm() -> None:
    _require_root()
    for tool in ("srun", "sinfo", "scontrol"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} not installed: run ci/install-system")
    proc = _run(["scontrol", "ping"], timeout=30)
    if proc.returncode != 0 or "is UP" not in proc.stdout:
        first = (proc.stdout.strip() or proc.stderr.strip() or "no output").splitlines()[0]
        _unavailable(f"slurmctld not answering `scontrol ping`: run ci/start-slurm ({first})")


def _node_states() -> list[str]:
    proc = _run(["sinfo", "-h", "-o", "%t"], timeout=30)
    assert proc.returncode == 0, _describe(proc)
    return proc.stdout.split()


def _wait_idle(timeout: float = 30.0) -> list[str]:
    """The node may still be completing the previous job for a moment."""
    deadline = time.monotonic() + timeout
    states = _node_states()
    while states != ["idle"] and time.monotonic() < deadline:
        time.sleep(0.25)
        states = _node_states()
    return states


@pytest.fixture
def ordinary_user() -> Iterator[pwd.struct_passwd]:
    _require_slurm()
    name = f"jcd{uuid.uuid4().hex[:10]}"
    proc = _run(["useradd", "-m", "-s", "/bin/sh", name], timeout=30)
    assert proc.returncode == 0, _describe(proc)
    try:
        yield pwd.getpwnam(name)
    finally:
        # A job step may still be exiting: userdel refuses while the user has processes.
        for _ in range(40):
            if _run(["userdel", "-r", name], timeout=30).returncode in (0, 6):
                break
            time.sleep(0.25)
        else:
            pytest.fail(f"could not remove test user {name}")


@pytest.mark.docker
def test_docker_info_answers() -> None:
    _require_docker()
    proc = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip(), "docker info reported no server version"


@pytest.mark.slurm
def test_srun_as_root_and_node_idle() -> None:
    _require_slurm()
    assert _wait_idle() == ["idle"], f"node not idle before srun: {_node_states()}"
    proc = _run(["srun", "-N1", "true"], cwd="/")
    assert proc.returncode == 0, _describe(proc)
    states = _wait_idle()
    assert states == ["idle"], f"node not idle after srun: {states}"


@pytest.mark.slurm
def test_srun_as_ordinary_user(ordinary_user: pwd.struct_passwd) -> None:
    _require_slurm()
    # su keeps the working directory, and slurmd runs the task there: use the user's home.
    proc = _run(["su", ordinary_user.pw_name, "-c", "srun -N1 id -u"], cwd=ordinary_user.pw_dir)
    assert proc.returncode == 0, _describe(proc)
    assert proc.stdout.strip() == str(ordinary_user.pw_uid), _describe(proc)
