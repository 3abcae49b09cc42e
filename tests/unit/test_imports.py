"""The import graph of launcher/ and hook/ (no root): no cycle, and it flows one way.

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

# Lower layers never import higher ones (docs/development.md "Checks and code layout":
# cli -> commands -> lifecycle -> record/pins/staging/fs -> plan/job/config/state -> libc).
COMMANDS = {
    "launcher.entry",  # the installed script's main(): it starts the loader, then cli
    "launcher.cli",
    "launcher.run",
    "launcher.setup",
    "launcher.teardown",
    "launcher.recover",
    "launcher.gc",
    "launcher.report",
    "hook.hook",
    "hook.oci_config",
    "launcher.manpage",
}  # not a command: a tool that renders cli's help as a man page
LOW = {
    "launcher.libc",
    "launcher.errors",
    "launcher.plan",
    "launcher.job",
    "launcher.config",
    "launcher.state",
    "launcher.fork",
    "launcher.removal",
    "launcher.mountinfo",
    "launcher.fastimport",
    "launcher.jsonfast",
    "launcher.validate",
    "launcher.environment",
    "launcher.directives",  # a leaf parser: config parses [[dirs]] sizes with it
    "launcher.dirpath",  # a leaf: the job's symbols in [[dirs]] paths (config, plan)
    "launcher.sysprog",  # where root's programs are: diskimage, jobsize, gc... use it
}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).glob("*.py")):
            out[pkg if p.stem == "__init__" else f"{pkg}.{p.stem}"] = p
    return out


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
            # Installed under one `jobns` package: jobns.launcher.x is the file launcher/x.py.
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


def test_imports_flow_one_way() -> None:
    edges = graph()
    assert set(edges) >= COMMANDS | LOW
    upward = {
        (m, t)
        for m, ts in edges.items()
        for t in ts
        if (m in LOW and t not in LOW and t != "schemas.generated")
        or (m not in COMMANDS and t in COMMANDS)
    }
    assert upward == set()


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
