"""The command-line front (no root): options, help, errors, and what the task path imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.cli import COMMANDS, command_help, dispatch, parse
from launcher.errors import JobnsError

RUN = COMMANDS["run"]


def test_run_options_and_trailing_command() -> None:
    opts, cmd = parse(RUN, ["--job-id", "5", "--use-shared-tmpdir=per-node", "--no-rm-tmpdir",
                            "--kill-wait=3", "--", "ls", "-l", "--job-id"])
    assert opts["job_id"] == "5" and opts["use_shared_tmpdir"] == "per-node"
    assert opts["no_rm_tmpdir"] is True and opts["kill_wait"] == "3"
    assert cmd == ["ls", "-l", "--job-id"]


def test_command_may_start_without_double_dash() -> None:
    opts, cmd = parse(RUN, ["--use-shared-tmpdir", "env", "-h"])
    assert opts["use_shared_tmpdir"] == "" and cmd == ["env", "-h"]
    assert not opts.get("help")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--job-id"], "needs a value"),
    (["--frob"], "unknown option"),
    (["--no-rm-tmpdir=yes"], "takes no value"),
])
def test_usage_errors(argv: list[str], needle: str) -> None:
    with pytest.raises(JobnsError, match=needle):
        parse(RUN, argv)


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for name in RUN.opts:
        assert name in out
    assert out == command_help(RUN) + "\n"
    assert "125" in out


def test_unknown_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch(["frobnicate"]) == 125
    assert capsys.readouterr().err == "jobns: unknown subcommand 'frobnicate' (see jobns --help)\n"


def test_task_path_imports_nothing_heavy() -> None:
    """README 'Speed': the task-launch path never imports jsonschema, pyroute2, docker,
    argparse, tomllib (without a config file), typing or dataclasses; nor the Python faces of
    ctypes, signal and prctl (their C modules serve)."""
    code = ("import sys; from launcher import cli, run, supervise, namespace, fs; "
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2])
                         ).stdout.split()
    heavy = {"jsonschema", "pyroute2", "docker", "argparse", "tomllib", "typing", "dataclasses",
             "json", "re", "subprocess", "enum", "ctypes", "signal", "prctl"}
    assert sorted(heavy & set(out)) == []
