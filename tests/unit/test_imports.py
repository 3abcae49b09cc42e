"""The import graph of jobns/launcher/ and jobns/hook/ (no root): no cycle, and it flows one way.

Every import counts, also those inside functions and under TYPE_CHECKING: a cycle that
only closes at run time is still a knot a newcomer has to untie.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "hook", "schemas")

# The floors, lowest first: a module imports only from its own floor and the floors below
# (docs/development.md "Checks and code layout"). Each launcher floor is a folder, and its
# __init__.py says what belongs there. The OCI hook sits above the lifecycle (it makes a
# standalone job's trees) and below the commands (gc and cli call into it).
FLOORS = (
    "schemas",
    "launcher.system",
    "launcher.protocol",
    "launcher.model",
    "launcher.staging",
    "launcher.backing",
    "launcher.mountns",
    "launcher.lifecycle",
    "launcher.burstbuffer",
    "hook",
    "launcher.commands",
)


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / "jobns" / pkg).rglob("*.py")):
            parts = p.relative_to(REPO / "jobns").with_suffix("").parts
            out[".".join(parts[:-1] if p.stem == "__init__" else parts)] = p
    return out


def floor(module: str) -> int:
    """The index in FLOORS of the floor module is on."""
    found = [i for i, f in enumerate(FLOORS) if module == f or module.startswith(f"{f}.")]
    assert found, f"{module} is on no floor: move it into one of {FLOORS}"
    return found[-1]


def imports(path: Path) -> set[str]:
    """The top-level names of every module path imports, absolute imports only."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.partition(".")[0])
        elif isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            # jobns.launcher.model.plan is the module launcher.model.plan here.
            targets = [t.removeprefix("jobns.") for t in targets]
            edges[name] |= {t for t in targets if t in mods and t != name and t not in PACKAGES}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                found.append([*stack[stack.index(v) :], v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_every_module_is_on_a_floor_and_every_floor_is_a_folder() -> None:
    assert sorted((REPO / "jobns/launcher").glob("*.py")) == [REPO / "jobns/launcher/__init__.py"]
    folders = {f"launcher.{p.name}" for p in (REPO / "jobns/launcher").iterdir() if p.is_dir()}
    assert folders - {"launcher.__pycache__"} == {f for f in FLOORS if f.startswith("launcher.")}
    for m in set(modules()) - {*PACKAGES}:
        floor(m)  # fails for a module on no floor


def test_imports_flow_down_the_floors() -> None:
    edges = graph()
    upward = {(m, t) for m, ts in edges.items() for t in ts if floor(t) > floor(m)}
    assert upward == set()


def test_the_floor_rule_sees_an_upward_import() -> None:
    """The rule is not vacuous: a lifecycle module importing a command is upward."""
    assert floor("launcher.commands.run") > floor("launcher.lifecycle.lifecycle")
    assert floor("hook.hook") > floor("launcher.mountns.binds")


# Import name -> the distribution that provides it, where the two differ.
DISTRIBUTIONS = {"prctl": "python-prctl", "_prctl": "python-prctl"}


def requirement_names(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ ;\[]", s, maxsplit=1)[0].lower() for s in specs}


def test_the_declared_dependencies_are_what_the_installed_program_imports() -> None:
    """A declared dependency the program never imports is a defect, and so is an import
    left undeclared (issue 23): test tools belong to the test extra."""
    third_party = set().union(*(imports(p) for p in modules().values()))
    third_party -= {*sys.stdlib_module_names, "jobns", "__future__"}
    wanted = {DISTRIBUTIONS.get(name, name) for name in third_party}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = requirement_names(project["dependencies"])
    assert declared == wanted
    assert not declared & requirement_names(project["optional-dependencies"]["test"])


def test_the_debian_package_depends_on_the_same_modules() -> None:
    """debian/control's Depends of package jobns: Debian's python3-* of each dependency."""
    control = (REPO / "debian" / "control").read_text()
    stanza = next(s for s in control.split("\n\n") if s.startswith("Package: jobns\n"))
    field = re.search(r"^Depends:(.*(?:\n .*)*)", stanza, re.MULTILINE)
    assert field is not None, stanza
    named = {d.split()[0] for d in field.group(1).split(",") if d.strip()}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dists = requirement_names(project["dependencies"])
    debian = {f"python3-{d.removeprefix('python-')}" for d in dists}
    assert {n for n in named if n.startswith("python3-")} == debian
