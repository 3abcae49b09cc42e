"""The jobns wheel for the node images, built on the host, installed in them offline.

The image builds run with no network (no registry, and the build containers must not
talk to anything), so the wheel is built here, from a copy of the source tree (pip
would otherwise write build/ and *.egg-info into the working tree other people are
editing). jobns is pure Python: one wheel serves every release's interpreter, and its
runtime dependencies are each release's own Debian packages (containers/images.py).
Wheels are identified by a digest of their *contents*: zip members carry the build
time, so the same sources give different wheel bytes on every build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import tomllib
import zipfile
from pathlib import Path

from containers.errors import RigError

REPO = Path(__file__).resolve().parent.parent
# The venv the project's tools live in; its interpreter is Debian's /usr/bin/python3.
HOST_PYTHON = os.environ.get("JOBNS_RIG_PYTHON", "/opt/jobns/venv/bin/python")
COPY_IGNORE = shutil.ignore_patterns(
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "build",
    "dist",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
)


def cache_dir() -> Path:
    base = os.environ.get("JOBNS_RIG_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jobns-rig"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def project(repo: Path = REPO) -> dict[str, object]:
    try:
        with open(repo / "pyproject.toml", "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RigError(f"read {repo / 'pyproject.toml'}: {e}") from None


def wheel_digest(path: Path) -> str:
    """sha256 over (member name, member bytes), ignoring zip timestamps."""
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(path) as z:
            for name in sorted(z.namelist()):
                h.update(name.encode() + b"\0")
                h.update(hashlib.sha256(z.read(name)).digest())
    except (OSError, zipfile.BadZipFile) as e:
        raise RigError(f"hash wheel {path}: {e}") from None
    return h.hexdigest()


def interpreter_tag() -> str:
    out = subprocess.run(
        [
            HOST_PYTHON,
            "-c",
            "import sys,sysconfig;print(sys.version.split()[0],sysconfig.get_platform())",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RigError(
            f"run {HOST_PYTHON}: {out.stderr.strip()}; set JOBNS_RIG_PYTHON to a "
            "Python 3.11 with pip"
        )
    return out.stdout.strip()


# PEP 517's build_wheel hook, called directly: ~0.3 s, against ~3 s for `pip wheel`
# (which makes a fresh isolated build environment every time).
BUILD_HOOK = """
import importlib, sys
name, _, attr = sys.argv[2].partition(":")
backend = importlib.import_module(name)
for part in filter(None, attr.split(".")):
    backend = getattr(backend, part)
print(backend.build_wheel(sys.argv[1]))
"""


def build_env(requires: list[str]) -> Path:
    """A cached venv holding the project's build requirements (+ wheel, which
    setuptools before 70.1 needs for bdist_wheel)."""
    reqs = sorted({*requires, "wheel"})
    key = hashlib.sha256("\n".join([interpreter_tag(), *reqs]).encode()).hexdigest()[:16]
    final = cache_dir() / "buildenv" / key
    if (final / ".complete").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=final.parent))
    try:
        for cmd in (
            [HOST_PYTHON, "-m", "venv", str(work)],
            [
                str(work / "bin/python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *reqs,
            ],
        ):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RigError(
                    f"make the build environment ({' '.join(cmd)}): exit "
                    f"{proc.returncode}\n{proc.stderr.strip()[-2000:]}"
                )
        (work / ".complete").write_text("\n".join(reqs) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)  # only bin/python is used: a renamed venv still works for that
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def jobns_wheel(dest: Path, repo: Path = REPO) -> Path:
    """Build the jobns wheel from a copy of the sources into dest; return its path."""
    proj = project(repo)
    tool = proj.get("tool", {})
    st = tool.get("setuptools", {}) if isinstance(tool, dict) else {}
    packages = st.get("packages", []) if isinstance(st, dict) else []
    bs = proj.get("build-system", {})
    requires = [str(r) for r in bs.get("requires", [])] if isinstance(bs, dict) else []
    backend = (
        str(bs.get("build-backend", "setuptools.build_meta:__legacy__"))
        if isinstance(bs, dict)
        else "setuptools.build_meta:__legacy__"
    )
    if not packages:
        raise RigError(f"find packages in {repo / 'pyproject.toml'} [tool.setuptools]: none")
    env = build_env(requires)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jobns-src-") as src:
        for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"):
            if (repo / name).exists():
                shutil.copy2(repo / name, Path(src) / name)
        dirs = st.get("package-dir", {}) if isinstance(st, dict) else {}
        for pkg in packages:
            # Where the package's sources are: [tool.setuptools.package-dir] maps
            # jobns.launcher to jobns/launcher/, else the package's own path.
            where = dirs.get(pkg) if isinstance(dirs, dict) else None
            top = str(where or pkg).split("/")[0].split(".")[0]
            if not (Path(src) / top).exists():
                shutil.copytree(repo / top, Path(src) / top, ignore=COPY_IGNORE)
        cmd = [str(env / "bin/python"), "-c", BUILD_HOOK, str(dest), backend]
        proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RigError(f"build the jobns wheel with {backend}: exit {proc.returncode}\n{tail}")
    wheel = dest / proc.stdout.strip().splitlines()[-1]
    if not wheel.is_file():
        raise RigError(f"build the jobns wheel: {backend} reported {wheel.name}, not in {dest}")
    return wheel
