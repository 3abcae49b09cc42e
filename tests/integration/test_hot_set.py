"""The hot set, measured: what the installed `jobns run` and `jobns hook` really import
(root, real namespaces; the containers are test_hook.py's stand-ins).

commands/bytecode.py HOT declares it; tests/unit/test_hot_set.py holds the tricks to it.
Here each real run (a task making its own namespace and one joining a set-up job, as an
ordinary user; createRuntime and poststop for a prolog's job and for a standalone
container, as root) is traced: together they import exactly HOT, none imports a HEAVY
module, and poststop not even ctypes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.commands.bytecode import HOT
from tests.conftest import OsUser, Sandbox
from tests.integration.test_bytecode import interpreter
from tests.integration.test_hook import Container, as_user
from tests.unit.test_hot_set import HEAVY

pytestmark = pytest.mark.root
TRACE = str(Path(__file__).with_name("import_trace.py"))


class Tracer:
    """Runs jobns commands through import_trace.py and keeps what each loaded."""

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        self.runs: dict[str, set[str]] = {}

    def run(
        self, label: str, args: list[str], user: OsUser | None = None, stdin: bytes = b""
    ) -> None:
        out = self.box.root / f"trace-{label}"
        fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if user is not None:
                os.fchown(fd, user.uid, user.gid)
            r = subprocess.run(
                [interpreter(), "-I", TRACE, str(fd), *self.box.cmd(args)[1:]],
                input=stdin,
                capture_output=True,
                cwd="/",
                env=self.box.env(user, None),
                pass_fds=(fd,),
                timeout=60,
                **self.box.creds(user),
            )
            assert r.returncode == 0, r.stderr.decode()
        finally:
            os.close(fd)
        lines = out.read_text().split("\n")
        self.runs[label] = set().union(*(ln.split() for ln in lines))
        assert self.runs[label], f"{label}: the trace wrote nothing"


@pytest.fixture
def tracer(sandbox: Sandbox) -> Iterator[Tracer]:
    yield Tracer(sandbox)
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


# The floors' packages: loaded with any of their modules, they hold no code of their own.
PACKAGES = {
    "launcher",
    "hook",
    *(
        f"launcher.{p.name}"
        for p in Path(__file__).parents[2].joinpath("jobns/launcher").iterdir()
        if (p / "__init__.py").exists()
    ),
    "schemas",
}


def test_run_and_hook_import_exactly_the_hot_set(
    sandbox: Sandbox, users: list[OsUser], tracer: Tracer
) -> None:
    alice = users[0]
    # Root's first read of the config parses it and fills the cache, as a node's first
    # prolog does; every run measured below reads the cache.
    warm = sandbox.run(["run", "--job-id", "hs-warm", "--", "true"])
    assert warm.returncode == 0, warm.stderr
    tracer.run("run-new", ["run", "--job-id", "hs-new", "--", "true"], alice)
    assert sandbox.run(["setup", "--job-id", "hs-j", "--user", alice.name]).returncode == 0
    try:
        tracer.run("run-join", ["run", "--job-id", "hs-j", "--", "true"], alice)
        prolog_job = Container(
            sandbox, "hs-c1", annotations={"org.jobns.job-id": "hs-j"}, process=as_user(alice)
        )
        standalone = Container(sandbox, "hs-c2")
        for c in (prolog_job, standalone):
            c.start()
            try:
                tracer.run(f"create-{c.id}", ["hook", "createRuntime"], stdin=c.state())
            finally:
                c.stop()
            tracer.run(f"poststop-{c.id}", ["hook", "poststop"], stdin=c.state("stopped"))
    finally:
        assert sandbox.run(["teardown", "--job-id", "hs-j"]).returncode == 0
    for label, loaded in tracer.runs.items():
        assert sorted(HEAVY & {m.partition(".")[0] for m in loaded}) == [], label
        if label.startswith("poststop"):
            assert "ctypes" not in loaded, label
    measured = {
        m.removeprefix("jobns.")
        for loaded in tracer.runs.values()
        for m in loaded
        if m.startswith("jobns.") and m.removeprefix("jobns.") not in PACKAGES
    }
    assert sorted(measured - set(HOT)) == [], "imported by a hot run, missing from HOT"
    assert sorted(set(HOT) - measured) == [], "in HOT, imported by no hot run"
    assert sandbox.leftovers() == []
