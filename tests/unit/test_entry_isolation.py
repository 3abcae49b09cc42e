"""launcher.commands.entry.isolate_root: which environments make root's jobns start again as
`python -I` (the re-exec itself runs for real in tests/integration/test_entry.py)."""

from __future__ import annotations

import os

import pytest

from jobns.launcher.commands import entry


def reexecs(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], euid: int = 0) -> bool:
    calls: list[list[str]] = []
    monkeypatch.setattr(os, "environ", env)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append(argv))
    entry.isolate_root()
    return bool(calls)


def test_ci_machines_usual_variables_cost_root_no_second_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usual = {"PATH": "/usr/bin", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    assert not reexecs(monkeypatch, usual)
    assert not reexecs(monkeypatch, {"PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"})


@pytest.mark.parametrize(
    "name", ["PYTHONPATH", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONPYCACHEPREFIX", "PYTHONX"]
)
def test_any_other_python_variable_isolates_root(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    assert reexecs(monkeypatch, {"PYTHONUNBUFFERED": "1", name: "/x"})
    assert not reexecs(monkeypatch, {name: "/x"}, euid=1000)  # her own jobns keeps it
