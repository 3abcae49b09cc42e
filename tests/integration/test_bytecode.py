"""The installed `jobns run` loads its whole launch path from byte code (commands/bytecode.py).

`-X importtime` lists every module the import system loads; a module preloaded from its
pyc never passes through it. So a jobns module in that list is one the launch path
imports but bytecode.LAUNCH misses: correct, but ~45 us slower on every task.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import JOBNS, OsUser, Sandbox, require


def interpreter(jobns: str = JOBNS) -> str:
    """The interpreter the installed script's #! line names (pip writes no options)."""
    require(Path(jobns).is_file(), f"{jobns} is not installed (run ci/install-python)")
    with open(jobns) as f:
        first = f.readline()
    assert first.startswith("#!") and len(first.split()) == 1, first
    return first[2:].strip()


def imported_by_import_system(
    sandbox: Sandbox,
    args: list[str],
    user: OsUser | None,
    env: dict[str, str] | None = None,
    jobns: str = JOBNS,
) -> list[str]:
    """The jobns modules the import system loaded in a run of args by script `jobns`
    started as its #! line says (run once before by root, so the config cache and the
    pycs are there, as on a node whose prolog ran)."""
    warm = [jobns, *sandbox.cmd(["run", "--job-id", "bc-warm", "--", "true"])[1:]]
    assert subprocess.run(warm, cwd="/", env=sandbox.env(None, None), timeout=60).returncode == 0
    r = subprocess.run(
        [interpreter(jobns), "-X", "importtime", jobns, *sandbox.cmd(args)[1:]],
        capture_output=True,
        text=True,
        cwd="/",
        env=sandbox.env(user, env),
        timeout=60,
        **sandbox.creds(user),
    )
    assert r.returncode == 0, r.stderr
    names = [ln.rpartition("|")[2].strip() for ln in r.stderr.splitlines() if "|" in ln]
    return [n for n in names if n.startswith(("jobns.launcher.", "jobns.hook.", "jobns.schemas."))]


def test_the_installed_script_is_the_packaged_entry_point() -> None:
    interpreter()
    assert "from jobns.launcher.commands.entry import main" in Path(JOBNS).read_text()


# What passes through the import system when a task makes its own namespace: the entry
# and the loader itself with their floor's package, then plan (with its record reader,
# fields), removal and fs (with fs's floor and its bounded flock, locking) through the
# finder (bytecode.LAUNCH).
OWN_NAMESPACE_LAUNCH = [
    "jobns.launcher.commands",
    "jobns.launcher.commands.bytecode",
    "jobns.launcher.commands.entry",
    "jobns.launcher.system.fields",
    "jobns.launcher.model.plan",
    "jobns.launcher.backing",
    "jobns.launcher.system.locking",
    "jobns.launcher.system.removal",
    "jobns.launcher.backing.fs",
]


@pytest.mark.root
@pytest.mark.parametrize("who", ["root", "user"])
def test_every_module_of_a_task_launch_is_preloaded(
    sandbox: Sandbox, users: list[OsUser], who: str
) -> None:
    user = users[0] if who == "user" else None
    args = ["run", "--job-id", f"bc-{who}", "--", "true"]
    # A task making its own namespace also plans and makes its trees: those modules
    # come through the finder (bytecode.LAUNCH says why).
    assert imported_by_import_system(sandbox, args, user) == OWN_NAMESPACE_LAUNCH
    assert sandbox.leftovers() == []


@pytest.mark.root
def test_joining_a_set_up_job_is_preloaded_too(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    assert sandbox.run(["setup", "--job-id", "bc-j", "--user", alice.name]).returncode == 0
    try:
        args = ["run", "--job-id", "bc-j", "--", "true"]
        assert imported_by_import_system(sandbox, args, alice) == OWN_NAMESPACE_LAUNCH[:3]
    finally:
        assert sandbox.run(["teardown", "--job-id", "bc-j"]).returncode == 0
