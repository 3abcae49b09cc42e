"""launcher.system.log (no root): the line format, and that the task path never loads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobns.launcher.system import log

REPO = Path(__file__).resolve().parents[2]


def test_a_line_names_the_command_job_and_user_and_stays_one_line() -> None:
    assert (
        log.line("setup", "state running", "12", "alice")
        == "setup job=12 user=alice: state running"
    )
    assert (
        log.line("gc", "removing /tmp/job-3 (no job record, unused)")
        == "gc: removing /tmp/job-3 (no job record, unused)"
    )
    text = log.line("teardown", "a\nb\tc " + "x" * 10_000, "1", None)
    assert (
        "\n" not in text
        and len(text) == log.MAX_LINE
        and text.startswith("teardown job=1: a b c x")
    )


def test_the_task_path_never_loads_the_logger() -> None:
    """`jobns run` imports nothing new: neither launcher.system.log nor syslog."""
    code = (
        "import sys; "
        "from jobns.launcher.commands import cli, run; "
        "from jobns.launcher.system import supervise; "
        "from jobns.launcher.protocol import state; "
        "from jobns.launcher.mountns import namespace; "
        "from jobns.launcher.backing import fs; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(REPO),
    ).stdout.split()
    assert "jobns.launcher.system.log" not in out and "syslog" not in out
    assert "run" not in __import__("jobns.launcher.commands.cli", fromlist=["LOGGED"]).LOGGED
