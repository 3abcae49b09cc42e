"""`jobns doctor` compares the state_dir each file names: jobns.toml's, the SPANK
plugin's `state_dir=` on its plugstack.conf line (includes followed as Slurm does) and
STATE_DIR in the packaged prolog and epilog that slurm.conf names. A mismatch passed
doctor, then every job waited 60 s and failed (issue 30, finding 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobns.launcher.commands import doctor
from jobns.launcher.commands.doctor import scripts
from jobns.launcher.model.config import Config, parse
from tests.conftest import REPO

Finding = tuple[str, str]


class Node:
    """jobns.toml, slurm.conf, plugstack.conf and the scripts, all in tmp_path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.toml = root / "jobns.toml"
        self.slurm_conf = root / "slurm.conf"
        self.plugstack = root / "plugstack.conf"  # beside slurm.conf: Slurm's default
        self.prolog, self.epilog = root / "prolog", root / "epilog"
        self.plugstack.write_text("")
        self.slurm_conf.write_text(f"Prolog={self.prolog}\nEpilog={self.epilog}\n")

    def config(self, state_dir: str) -> Config:
        text = f'state_dir = "{state_dir}"\n'
        self.toml.write_text(text)
        return Config(parse(text, str(self.toml)), str(self.toml))

    def scripts(self, state_dir: str | None) -> None:
        """The packaged prolog and epilog with STATE_DIR=state_dir; None: a site's own."""
        for path, sub in ((self.prolog, "setup"), (self.epilog, "teardown")):
            line = f"STATE_DIR={state_dir} # state_dir in jobns.toml\n" if state_dir else ""
            path.write_text(
                f"#!/bin/bash\nset -euo pipefail\n{line}"
                f'exec /opt/jobns/venv/bin/jobns {sub} --job-id "$SLURM_JOB_ID"\n'
            )
            path.chmod(0o755)

    def check(self, state_dir: str) -> list[Finding]:
        return scripts.state_dir_names(self.config(state_dir), str(self.slurm_conf))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def problem(found: list[Finding]) -> str:
    (only,) = found
    assert only[0] == doctor.PROBLEM, found
    return only[1]


def test_all_agree(node: Node) -> None:
    node.scripts("/srv/jobns")
    node.plugstack.write_text("required /opt/jobns/lib/jobns_spank.so state_dir=/srv/jobns\n")
    (found,) = node.check("/srv/jobns")
    assert found[0] == doctor.OK, found
    for needle in (
        "state_dir /srv/jobns is the same in",
        f"{node.toml} (state_dir)",
        f"{node.plugstack} (the SPANK plugin's state_dir=)",
        f"{node.prolog} (STATE_DIR)",
        f"{node.epilog} (STATE_DIR)",
    ):
        assert needle in found[1], (needle, found)


def test_the_config_moved_but_not_the_scripts(node: Node) -> None:
    """The finding: state_dir changed in jobns.toml only."""
    node.scripts("/run/jobns")
    text = problem(node.check("/srv/jobns"))
    for needle in (
        f"/srv/jobns in {node.toml} (state_dir)",
        f"/run/jobns in {node.prolog} (STATE_DIR)",
        f"/run/jobns in {node.epilog} (STATE_DIR)",
        f"fix: STATE_DIR=/srv/jobns in {node.prolog} and {node.epilog}",
        # the others agree among themselves: moving the config back works too
        f'or state_dir = "/run/jobns" in {node.toml}, then restart jobns-helper',
    ):
        assert needle in text, (needle, text)


def test_the_plugin_differs(node: Node) -> None:
    node.scripts("/srv/jobns")
    node.plugstack.write_text("required /opt/jobns/lib/jobns_spank.so state_dir=/run/jobns\n")
    text = problem(node.check("/srv/jobns"))
    for needle in (
        f"/run/jobns in {node.plugstack} (the SPANK plugin's state_dir=)",
        "every task waits start_wait seconds",
        f"fix: state_dir=/srv/jobns on the jobns_spank.so line of {node.plugstack}, then "
        "restart slurmd",
    ):
        assert needle in text, (needle, text)
    assert "STATE_DIR=/srv/jobns in" not in text  # the scripts are right: not to edit
    # No state_dir= on the line: the plugin's default, /run/jobns, which differs too.
    node.plugstack.write_text("required /opt/jobns/lib/jobns_spank.so start_wait=30\n")
    text = problem(node.check("/srv/jobns"))
    assert f"/run/jobns in {node.plugstack} (the SPANK plugin's state_dir=, unset" in text
    # The last state_dir= is the one the plugin takes (parse_args).
    node.plugstack.write_text(
        "required /opt/jobns/lib/jobns_spank.so state_dir=/run/jobns state_dir=/srv/jobns\n"
    )
    assert [k for k, _ in node.check("/srv/jobns")] == [doctor.OK]


def test_the_plugin_line_in_an_included_file(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's plugstack.conf only includes plugstack.conf.d/*.conf (the jobns-slurm
    package's line is there); a relative pattern is relative to plugstack.conf's
    directory, as Slurm reads it, not to doctor's working directory."""
    node.scripts("/srv/jobns")
    snippets = node.root / "plugstack.conf.d"
    snippets.mkdir()
    (snippets / "jobns.conf").write_text(
        "# jobns-slurm\nrequired /usr/lib/x86_64-linux-gnu/slurm-wlm/jobns_spank.so "
        "state_dir=/run/jobns  # moved?\n"
    )
    (snippets / "other.conf").write_text("optional /usr/lib/other_spank.so state_dir=/x\n")
    node.plugstack.write_text("include plugstack.conf.d/*.conf\n")
    monkeypatch.chdir("/")
    text = problem(node.check("/srv/jobns"))
    assert f"/run/jobns in {snippets / 'jobns.conf'} (the SPANK plugin's" in text, text
    assert "other.conf" not in text
    # PlugStackConfig= names the file, which includes by an absolute pattern.
    moved = node.root / "etc" / "stack.conf"
    moved.parent.mkdir()
    moved.write_text(f"include {snippets}/*.conf\n")
    node.slurm_conf.write_text(
        f"Prolog={node.prolog}\nEpilog={node.epilog}\nPlugStackConfig={moved}\n"
    )
    assert f"in {snippets / 'jobns.conf'}" in problem(node.check("/srv/jobns"))
    (snippets / "jobns.conf").write_text(
        "required /opt/jobns/lib/jobns_spank.so state_dir=/srv/jobns\n"
    )
    assert [k for k, _ in node.check("/srv/jobns")] == [doctor.OK]


def test_a_sites_own_prolog_is_not_compared(node: Node) -> None:
    """A prolog that runs jobns directly has no STATE_DIR: jobns reads the config."""
    node.scripts(None)
    assert node.check("/srv/jobns") == []
    # the plugin is still compared with the config
    node.plugstack.write_text("required /opt/jobns/lib/jobns_spank.so state_dir=/run/jobns\n")
    text = problem(node.check("/srv/jobns"))
    assert str(node.prolog) not in text and str(node.plugstack) in text


def test_no_plugin(node: Node) -> None:
    """The voluntary mode: no plugin line; only the scripts are compared."""
    node.plugstack.write_text("optional /usr/lib/other_spank.so state_dir=/elsewhere\n")
    node.scripts("/srv/jobns")
    (found,) = node.check("/srv/jobns")
    assert found[0] == doctor.OK and "SPANK" not in found[1], found
    node.plugstack.unlink()  # no plugstack.conf at all
    node.scripts("/run/jobns")
    assert str(node.prolog) in problem(node.check("/srv/jobns"))
    # and with no slurm.conf there is nothing to compare (slurm() says so)
    node.slurm_conf.unlink()
    assert node.check("/srv/jobns") == []


def test_a_state_dir_doctor_cannot_read_is_a_note(node: Node) -> None:
    """doctor never runs the script: a STATE_DIR bash would expand is left to the site."""
    node.scripts("/run/jobns")
    node.prolog.write_text('#!/bin/bash\nSTATE_DIR="${JOBNS_STATE:-/run/jobns}"\n')
    node.prolog.chmod(0o755)
    found = node.check("/run/jobns")
    assert [k for k, _ in found] == [doctor.NOTE, doctor.OK], found
    assert "does not expand" in found[0][1] and f"{node.epilog} (STATE_DIR)" in found[1][1]


def test_a_script_others_may_write_is_not_read(node: Node) -> None:
    """Only root's scripts count as jobns's (slurm() calls any other a problem)."""
    node.scripts("/run/jobns")
    node.prolog.chmod(0o777)
    text = problem(node.check("/srv/jobns"))
    assert str(node.epilog) in text and str(node.prolog) not in text


def test_the_shipped_scripts_are_recognised() -> None:
    """jobns/slurm/scripts/prolog and epilog (installed as /etc/jobns/slurm/...) carry the line."""
    for name in ("prolog", "epilog"):
        text = (REPO / "jobns" / "slurm" / "scripts" / name).read_text()
        assert scripts.script_state_dir(text) == "/run/jobns", name
    assert scripts.script_state_dir("STATE_DIR='/a/b'  # quoted\n") == "/a/b"
    assert scripts.script_state_dir("    STATE_DIR=/x  # in a function\n") is None
