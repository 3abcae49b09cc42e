"""The hot set (commands/bytecode.py HOT) is where speed tricks live, and only there (no root).

`jobns run` and the OCI hook run once per task or container: their modules may write
`TYPE_CHECKING = False`, hand-written __slots__, jsonfast and fastimport's signal, and
must import nothing heavy. Every other module is plain Python. What the real runs import
is measured in tests/integration/test_hot_set.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from jobns.launcher.commands.bytecode import HOT
from tests.conftest import REPO

# What the hot set never imports (docs/speed.md "The hot set"): each costs milliseconds a
# task, or pulls in a package a node may not need.
HEAVY = frozenset(
    {
        "typing",
        "dataclasses",
        "json",
        "re",
        "enum",
        "signal",
        "subprocess",
        "argparse",
        "tomllib",
        "ctypes",
        "struct",
        "threading",
        "jsonschema",
        "pyroute2",
        "docker",
    }
)
# The tricks, each as the one way it is written in this code base.
TRICK_IMPORTS = ("jobns.launcher.system.jsonfast", "jobns.launcher.system.fastimport")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO / "jobns").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in ("launcher", "hook", "schemas")
        for p in sorted((REPO / "jobns" / pkg).rglob("*.py"))
    }


def tricks(path: Path) -> list[str]:
    """The speed tricks module `path` uses, each named once."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" for t in node.targets
        ):
            found.add("TYPE_CHECKING = False")
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
                ):
                    found.add(f"hand-written __slots__ ({node.name})")
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            found |= {f"imports {n}" for n in names if n in TRICK_IMPORTS}
    return sorted(found)


def test_the_hot_set_names_real_modules() -> None:
    known = python_modules()
    assert sorted(set(HOT) - set(known)) == []
    assert len(set(HOT)) == len(HOT)


def test_no_speed_trick_outside_the_hot_set() -> None:
    """A module off the hot set imports typing, uses dataclasses and json: a newcomer
    reads plain Python wherever speed does not pay."""
    outside = {
        name: tricks(path)
        for name, path in python_modules().items()
        if name not in HOT and tricks(path)
    }
    assert outside == {}


def test_the_hot_set_imports_nothing_heavy() -> None:
    """Every hot module together (and the interpreter's own start): none of HEAVY."""
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        + "".join(f"import jobns.{m}; " for m in HOT)
        + "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.split()
    loaded = {m.partition(".")[0] for m in out}
    assert sorted(HEAVY & loaded) == []
    # Only hot modules: a hot module that imports a cold one at its top makes it hot.
    cold = sorted(
        m.removeprefix("jobns.")
        for m in out
        if m.startswith("jobns.")
        and m.removeprefix("jobns.") not in HOT
        and m.removeprefix("jobns.") in python_modules()
        and not (REPO / "jobns" / Path(*m.split(".")[1:]) / "__init__.py").exists()
    )
    assert cold == []
