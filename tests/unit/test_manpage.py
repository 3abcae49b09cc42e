"""jobns(1) is made from launcher.commands.cli's help text (no root): every option `--help` lists
is in it, and groff formats it without a warning."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobns.launcher.commands.cli import COMMANDS, command_help, dispatch
from jobns.launcher.commands.manpage import render
from tests.conftest import require


def formatted(tmp_path: Path) -> str:
    page = tmp_path / "jobns.1"
    page.write_text(render())
    require(shutil.which("groff") is not None, "groff is not installed (ci/install-system)")
    r = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = subprocess.run(
        ["groff", "-man", "-Tascii", "-P", "-cbou", str(page)],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout


def sections(text: str) -> dict[str, str]:
    """The formatted page's subcommand sections, by name."""
    body = text.split("SUBCOMMANDS", 1)[1].split("EXIT STATUS", 1)[0]
    parts = re.split(r"^   (\S+)\n", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_option_help_lists_is_in_the_man_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = formatted(tmp_path)
    found = sections(text)
    assert sorted(found) == sorted(COMMANDS)
    for name, cmd in COMMANDS.items():
        # What `jobns NAME --help` prints.
        assert dispatch([name, "--help"]) == 0
        out = capsys.readouterr().out
        assert out.strip() == command_help(cmd)
        listed = re.findall(r"^  (--?[a-z][\w-]*)", out, flags=re.M)
        assert listed, out
        for opt in listed:
            assert re.search(rf"(^|\s){re.escape(opt)}\b", found[name]), (name, opt)
        assert cmd.summary.split(":")[0] in " ".join(found[name].split())


def test_the_page_names_the_version_and_exit_statuses(tmp_path: Path) -> None:
    from jobns.launcher.commands.cli import VERSION

    text = formatted(tmp_path)
    assert f"jobns {VERSION}" in text
    for code in ("125", "126", "127", "128+N"):
        assert code in text
