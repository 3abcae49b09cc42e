"""A plain `pip install` of the checkout into a fresh venv is the program that runs (issue 23).

pip writes `bin/jobns` from pyproject's [project.scripts] (launcher/commands/entry.py);
nothing rewrites it. The venv is made here: `python3 -m venv`, then its own pip installs a copy of
the checkout (no build/ left in the checkout; the build backend comes from the package
index, as for ci/install-python; --no-deps: the launch path imports none).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, OsUser, Sandbox, require_root
from tests.integration.test_bytecode import OWN_NAMESPACE_LAUNCH, imported_by_import_system

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def pip_jobns() -> Iterator[Path]:
    """bin/jobns of a fresh venv into which pip installed this checkout."""
    require_root()
    # Not under /tmp: a job's own /tmp hides the host's, and jobns imports inside a job.
    top = Path("/var/lib/jobns-tests") / f"pip-{uuid.uuid4().hex[:12]}"
    top.mkdir(parents=True)
    Path("/var/lib/jobns-tests").chmod(0o755)
    top.chmod(0o755)
    try:
        src = top / "src"
        skip = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist")
        shutil.copytree(REPO, src, symlinks=True, ignore=skip)
        venv = top / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
        # With its dependencies, as a site installs it (pip's cache from ci/install-python
        # serves them): parsing a config file needs jsonschema.
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
            check=True, capture_output=True, timeout=300, cwd="/",
            env={"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                 "PIP_ROOT_USER_ACTION": "ignore", "HOME": "/root"},
        )  # fmt: skip
        subprocess.run(["chmod", "-R", "a+rX", str(top)], check=True)
        yield venv / "bin" / "jobns"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_pip_writes_the_entry_point_and_nothing_rewrites_it(pip_jobns: Path) -> None:
    first, *rest = pip_jobns.read_text().splitlines()
    assert first == f"#!{pip_jobns.parent / 'python'}"  # no options: pip writes none
    assert "from jobns.launcher.commands.entry import main" in rest


@pytest.mark.parametrize("who", ["root", "user"])
def test_a_pip_installed_task_launch_loads_its_modules_from_byte_code(
    pip_jobns: Path, sandbox: Sandbox, users: list[OsUser], who: str
) -> None:
    user = users[0] if who == "user" else None
    args = ["run", "--job-id", f"pip-{who}", "--", "true"]
    found = imported_by_import_system(sandbox, args, user, jobns=str(pip_jobns))
    assert found == OWN_NAMESPACE_LAUNCH
    assert sandbox.leftovers() == []


def plant_ctypes(directory: Path) -> Path:
    """A `_ctypes` (launcher.system.libc imports it on every launch) that leaves a mark."""
    mark = directory / "imported"
    directory.mkdir(parents=True)
    (directory / "_ctypes.py").write_text(
        f"open({str(mark)!r}, 'w').close()\nraise ImportError('planted _ctypes')\n"
    )
    directory.chmod(0o755)
    return mark


def test_root_ignores_python_variables_of_its_environment(
    pip_jobns: Path, sandbox: Sandbox
) -> None:
    """-I cannot be on a console script's #! line: a root jobns that finds a PYTHON*
    variable starts again as `python -I` (jobns/launcher/commands/entry.py)."""
    mark = plant_ctypes(sandbox.root / "path")
    env = {"PYTHONPATH": str(sandbox.root / "path"), "PYTHONWARNINGS": "error"}
    cmd = [str(pip_jobns), *sandbox.cmd(["run", "--job-id", "pip-env", "--", "true"])[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=60,
                       env=sandbox.env(None, env))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not mark.exists()
    assert sandbox.leftovers() == []


def test_a_users_own_environment_is_hers(
    pip_jobns: Path, sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A user's jobns runs with her rights: her PYTHONPATH changes only what she could
    run anyway, and is not worth a second interpreter start per task
    (jobns/launcher/commands/entry.py)."""
    mark = plant_ctypes(sandbox.root / "path")
    alice = users[0]
    (sandbox.root / "path").chmod(0o777)
    cmd = [str(pip_jobns), *sandbox.cmd(["run", "--job-id", "pip-user-env", "--", "true"])[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=60,
                       env=sandbox.env(alice, {"PYTHONPATH": str(sandbox.root / "path")}),
                       **sandbox.creds(alice))  # fmt: skip
    assert r.returncode != 0 and mark.exists(), r.stderr
