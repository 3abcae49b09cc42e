"""launcher.commands.bytecode (no root): the fast loads run exactly the code importlib would.

Each case works on a private copy of the packages, compiled here, and imports it in a
fresh `python -IS`, so the checkout's own pycs, the venv's site-packages and this test
process's modules play no part.
"""

from __future__ import annotations

import ast
import compileall
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobns.launcher.commands import bytecode

REPO = Path(__file__).resolve().parents[2]

# In the copy: start() as the installed script calls it, then report, per module, how
# it was loaded and a fingerprint of what it holds (names, and every function's code).
PROBE = """
import hashlib, json, sys
sys.path.append(sys.argv[1])

def shape(code):  # what a code object runs, nested code too (repr shows addresses)
    consts = [shape(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return [code.co_code.hex(), consts, list(code.co_names), code.co_filename]

fast = sys.argv[2] == "fast"
if fast:
    from jobns.launcher.commands import bytecode
    bytecode.start(["jobns", *sys.argv[3:4]])
import importlib
out = {}
for name in sys.argv[4:]:
    m = importlib.import_module(name)
    funcs = {}
    for k, v in vars(m).items():
        code = getattr(v, "__code__", None)
        if code is not None and getattr(v, "__module__", None) == name:
            funcs[k] = hashlib.sha256(repr(shape(code)).encode()).hexdigest()
    out[name] = {
        "loader": type(m.__spec__.loader).__name__ if m.__spec__ else None,
        # (a package's submodules join its names as they are imported: not its own names)
        "names": sorted(
            k for k, v in vars(m).items()
            if not k.startswith("__") and type(v) is not type(sys)
        ),
        "funcs": funcs,
        "file": m.__file__,
        "package": m.__package__,
    }
print(json.dumps(out))
"""


def copy_packages(dest: Path) -> Path:
    """The checkout's jobns/ as the installed package, compiled like pip does."""
    top = dest / "jobns"
    shutil.copytree(REPO / "jobns", top, ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    assert compileall.compile_dir(
        str(top),
        quiet=1,
        invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
    )
    return dest


def probe(site: Path, mode: str, command: str, names: list[str]) -> dict[str, dict[str, object]]:
    r = subprocess.run(
        [sys.executable, "-IS", "-c", PROBE, str(site), mode, command, *names],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    result: dict[str, dict[str, object]] = json.loads(r.stdout)
    return result


LAUNCH = [f"jobns.launcher.{leaf}" for leaf in bytecode.LAUNCH]


def loaded_after_start(site: Path, command: str) -> list[str]:
    r = subprocess.run(
        [
            sys.executable,
            "-IS",
            "-c",
            "import sys; sys.path.append(sys.argv[1]);"
            "from jobns.launcher.commands import bytecode; bytecode.start(['jobns', sys.argv[2]]);"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('jobns.launcher.'))))",
            str(site),
            command,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.split()


def test_preloaded_launch_path_agrees_with_importlib(tmp_path: Path) -> None:
    site = copy_packages(tmp_path)
    # `jobns run` has its whole launch path loaded before cli is even imported.
    loader = ["jobns.launcher.commands", "jobns.launcher.commands.bytecode"]
    assert loaded_after_start(site, "run") == sorted([*LAUNCH, *loader])
    fast = probe(site, "fast", "run", LAUNCH)
    plain = probe(site, "plain", "run", LAUNCH)
    for name in LAUNCH:
        assert fast[name]["loader"] == "_Loader", name  # really preloaded
        assert plain[name]["loader"] == "SourceFileLoader", name
        for key in ("names", "funcs", "file", "package"):
            assert fast[name][key] == plain[name][key], (name, key)


def test_finder_loads_other_modules_and_agrees(tmp_path: Path) -> None:
    site = copy_packages(tmp_path)
    names = [
        "jobns.launcher.commands.report",
        "jobns.launcher.lifecycle.lifecycle",
        "jobns.hook.hook",
    ]
    fast = probe(site, "fast", "status", names)
    plain = probe(site, "plain", "status", names)
    for name in names:
        assert fast[name]["loader"] == "_Loader", name
        for key in ("names", "funcs", "file", "package"):
            assert fast[name][key] == plain[name][key], (name, key)
    # Not `jobns run`: nothing of the launch path was loaded ahead of need.
    assert loaded_after_start(site, "status") == [
        "jobns.launcher.commands",
        "jobns.launcher.commands.bytecode",
    ]


def test_a_changed_source_is_never_run_from_its_old_pyc(tmp_path: Path) -> None:
    site = copy_packages(tmp_path)
    src = site / "jobns/launcher/model/enforced.py"
    st = src.stat()
    src.write_text(src.read_text() + "\nADDED_AFTER_COMPILE = 1\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    fast = probe(site, "fast", "run", LAUNCH)
    mod = fast["jobns.launcher.model.enforced"]
    assert mod["loader"] == "SourceFileLoader"  # left to importlib, which recompiled it
    assert "ADDED_AFTER_COMPILE" in mod["names"]  # type: ignore[operator]
    # The modules before it in LAUNCH were preloaded; preloading stopped there.
    before = LAUNCH[: LAUNCH.index("jobns.launcher.model.enforced")]
    assert all(fast[n]["loader"] == "_Loader" for n in before)


@pytest.mark.parametrize("damage", ["truncated", "hash-based", "missing", "other-magic"])
def test_a_pyc_importlib_would_not_use_is_not_used(tmp_path: Path, damage: str) -> None:
    site = copy_packages(tmp_path)
    pkg = site / "jobns/launcher/system"
    pyc = pkg / f"__pycache__/errors.{sys.implementation.cache_tag}.pyc"
    if damage == "truncated":
        pyc.write_bytes(pyc.read_bytes()[:10])  # a header cut short: importlib recompiles
    elif damage == "hash-based":
        py_compile.compile(
            str(pkg / "errors.py"),
            cfile=str(pyc),
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
    elif damage == "missing":
        pyc.unlink()
    else:
        data = bytearray(pyc.read_bytes())
        data[0] ^= 0xFF
        pyc.write_bytes(bytes(data))
    code = bytecode.checked_code(str(pkg / "errors.py"), str(pyc), bytecode._magic())
    assert code is None
    fast = probe(
        site, "fast", "run", ["jobns.launcher.system.errors", "jobns.launcher.commands.run"]
    )
    assert fast["jobns.launcher.system.errors"]["loader"] == "SourceFileLoader"
    assert "JobnsError" in fast["jobns.launcher.system.errors"]["names"]  # type: ignore[operator]


def _top_level_imports(path: Path) -> set[str]:
    """The jobns.launcher modules (LAUNCH's form: "floor.module") a module imports when it
    is run (not in functions, not under TYPE_CHECKING)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If):
            continue  # `if TYPE_CHECKING:` blocks: never run
        if isinstance(node, ast.ImportFrom) and node.module:
            rel = node.module.removeprefix("jobns.launcher.")
            if rel == node.module:
                continue
            out |= {rel} if "." in rel else {f"{rel}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {
                a.name.removeprefix("jobns.launcher.")
                for a in node.names
                if a.name.startswith("jobns.launcher.")
            }
    return out


def test_launch_order_puts_every_module_after_what_it_imports() -> None:
    seen = {"commands", "commands.bytecode"}  # the loader and its package run it
    for rel in bytecode.LAUNCH:
        floor, _, leaf = rel.partition(".")
        path = REPO / "jobns/launcher" / floor / (f"{leaf}.py" if leaf else "__init__.py")
        needs = _top_level_imports(path) | ({floor} if leaf else set())
        assert needs <= seen, f"{rel} imports {sorted(needs - seen)} before they are preloaded"
        seen.add(rel)


def test_the_collector_pauses_while_loading_and_runs_for_the_command(tmp_path: Path) -> None:
    site = copy_packages(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-IS",
            "-c",
            "import gc, sys; sys.path.append(sys.argv[1]);"
            "from jobns.launcher.commands import bytecode; bytecode.start(['jobns', 'run']);"
            "paused = not gc.isenabled(); bytecode.start(['jobns', 'run']);"
            "from jobns.launcher.commands.cli import main; bytecode.loaded();"
            "print(paused, gc.isenabled(), gc.get_freeze_count() > 1000,"
            " sum(isinstance(f, bytecode.Finder) for f in sys.meta_path))",
            str(site),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.split() == ["True", "True", "True", "1"]  # one finder, however called
