"""The command-line front (no root): options, help, errors, and what the task path imports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobns.launcher.commands.cli import COMMANDS, command_help, dispatch, parse
from jobns.launcher.system.errors import JobnsError

RUN = COMMANDS["run"]
REPO = Path(__file__).resolve().parents[2]


def test_run_options_and_trailing_command() -> None:
    opts, cmd = parse(
        RUN,
        [
            "--job-id",
            "5",
            "--use-shared-tmpdir=per-node",
            "--no-rm-tmpdir",
            "--kill-wait=3",
            "--",
            "ls",
            "-l",
            "--job-id",
        ],
    )
    assert opts["job_id"] == "5" and opts["use_shared_tmpdir"] == "per-node"
    assert opts["no_rm_tmpdir"] is True and opts["kill_wait"] == "3"
    assert cmd == ["ls", "-l", "--job-id"]


def test_command_may_start_without_double_dash() -> None:
    opts, cmd = parse(RUN, ["--use-shared-tmpdir", "env", "-h"])
    assert opts["use_shared_tmpdir"] == "" and cmd == ["env", "-h"]
    assert not opts.get("help")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--job-id"], "needs a value"),
        (["--frob"], "unknown option"),
        (["--no-rm-tmpdir=yes"], "takes no value"),
    ],
)
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
    """docs/speed.md 'What jobns costs': the task-launch path never imports jsonschema, pyroute2,
    docker,
    argparse, tomllib (without a config file), typing or dataclasses; nor the Python faces of
    ctypes, signal and prctl (their C modules serve)."""
    code = (
        "import sys; "
        "from jobns.launcher.commands import cli, run; "
        "from jobns.launcher.system import supervise; "
        "from jobns.launcher.mountns import namespace; "
        "from jobns.launcher.backing import fs; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[2]),
    ).stdout.split()
    heavy = {
        "jsonschema",
        "pyroute2",
        "docker",
        "argparse",
        "tomllib",
        "typing",
        "dataclasses",
        "json",
        "re",
        "subprocess",
        "enum",
        "ctypes",
        "signal",
        "prctl",
    }
    assert sorted(heavy & set(out)) == []


def test_a_word_before_the_double_dash_is_an_error_with_a_hint() -> None:
    """`--use-shared-tmpdir per-node -- true` must not run `per-node` (issue 14)."""
    with pytest.raises(JobnsError, match=r"did you mean --use-shared-tmpdir=per-node\?"):
        parse(RUN, ["--use-shared-tmpdir", "per-node", "--", "true"])
    with pytest.raises(JobnsError, match="unexpected argument 'x' before '--'"):
        parse(RUN, ["--job-id", "1", "x", "--", "true"])
    opts, cmd = parse(RUN, ["--use-shared-tmpdir=per-node", "--", "true"])
    assert opts["use_shared_tmpdir"] == "per-node" and cmd == ["true"]


def test_every_failure_is_one_line_and_125(capsys: pytest.CaptureFixture[str]) -> None:
    """No doubled prefix, and a bug is an `internal error`, never a traceback."""
    assert dispatch(["run"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("jobns: run: no command given") and err.count("\n") == 1
    assert dispatch(["run", "--frob"]) == 125
    assert capsys.readouterr().err == "jobns: run: unknown option '--frob' (see jobns run --help)\n"
    assert dispatch(["status", "--config", "/proc/self/nonexistent/x.toml"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("jobns: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_bug_is_an_internal_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import jobns.launcher.commands.report

    def broken(opts: object, command: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(jobns.launcher.commands.report, "status_main", broken)
    monkeypatch.delenv("JOBNS_DEBUG", raising=False)
    assert dispatch(["status"]) == 125
    err = capsys.readouterr().err
    assert (
        err.startswith("jobns: internal error in jobns status: KeyError") and err.count("\n") == 1
    )
    monkeypatch.setenv("JOBNS_DEBUG", "1")
    assert dispatch(["status"]) == 125
    assert "Traceback" in capsys.readouterr().err


def test_a_closed_pipe_is_quiet() -> None:
    """`jobns run -h | head -0`: the reader is gone before jobns writes."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                "from jobns.launcher.commands.cli import main; main()",
                "run",
                "-h",
            ],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    finally:
        os.close(w)
    assert p.stderr == "" and p.returncode == 125


def test_the_documented_synopsis_lists_every_option_help_lists() -> None:
    """docs/command-line.md "Subcommands" and --help tell the same story (issue 14)."""
    text = (REPO / "docs" / "command-line.md").read_text()
    synopsis = text[text.index("jobns run      [") :]
    synopsis = synopsis[: synopsis.index("```")]
    blocks: dict[str, str] = {}
    name = ""
    for line in synopsis.splitlines():
        if line.startswith("jobns "):
            name = line.split()[1]
            blocks[name] = ""
        blocks[name] += line + "\n"
    for cmd in COMMANDS.values():
        assert cmd.name in blocks, f"docs/command-line.md synopsis lacks jobns {cmd.name}"
        for opt in cmd.opts.values():
            assert opt.name in blocks[cmd.name], (
                f"docs/command-line.md synopsis of jobns {cmd.name} lacks {opt.name}"
            )
