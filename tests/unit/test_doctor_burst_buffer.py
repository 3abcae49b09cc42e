"""`jobns doctor`'s burst-buffer checks (doctor/burst_buffer.py) on files in a temporary
directory: a packaged-looking burst_buffer.lua, pools.json, the records directory.
What needs root (a records directory of root's) is in tests/integration/test_doctor.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobns.launcher.commands.doctor import burst_buffer as bbdoc
from jobns.launcher.model.config import Config
from jobns.launcher.model.config import parse as parse_config
from tests.conftest import REPO

LUA_SRC = REPO / "jobns/slurm/lua/burst_buffer.lua"


def config(tmp_path: Path, enabled: bool = True) -> Config:
    text = (
        f'shared_base = "{tmp_path}/shared"\nstate_dir = "{tmp_path}/state"\n'
        f"[burst_buffer]\nenabled = {'true' if enabled else 'false'}\n"
    )
    return Config(parse_config(text, "/f"), "/f")


def install_lua(tmp_path: Path, pools: str | None = None, jobns: str = "/bin/true") -> str:
    """burst_buffer.lua beside a slurm.conf in tmp_path/etc, as the package relocates it."""
    conf = tmp_path / "etc"
    conf.mkdir(exist_ok=True)
    text = LUA_SRC.read_text()
    text = text.replace('local JOBNS = "/opt/jobns/venv/bin/jobns"', f'local JOBNS = "{jobns}"')
    pools = pools or f"{tmp_path}/state/bb/pools.json"
    text = text.replace(
        'local POOLS_FILE = "/run/jobns/bb/pools.json"', f'local POOLS_FILE = "{pools}"'
    )
    (conf / "burst_buffer.lua").write_text(text)
    return str(conf)


def controller(**more: str) -> dict[str, str]:
    return {"burstbuffertype": "burst_buffer/lua", "slurmctldhost": "ctl(10.0.0.1)", **more}


@pytest.fixture
def posix_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where lua-posix would be: the machine running the unit tests need not have it."""
    (tmp_path / "lua/5.1/posix").mkdir(parents=True)
    (tmp_path / "lua/5.1/posix/init.lua").write_text("")
    monkeypatch.setattr(bbdoc, "POSIX_MODULES", (f"{tmp_path}/lua/5.*/posix/init.lua",))


def fresh_pools(tmp_path: Path) -> None:
    (tmp_path / "state/bb").mkdir(parents=True)
    (tmp_path / "state/bb/pools.json").write_text('{"pools":[]}')


def problems(found: list[tuple[str, str]]) -> list[str]:
    return [text for kind, text in found if kind == "problem"]


def test_the_lua_checks_its_markers_are_in_the_packaged_file() -> None:
    text = LUA_SRC.read_text()
    assert bbdoc._lua_value(text, "JOBNS_LUA_DIR") == "/usr/share/jobns/slurm/lua"
    assert bbdoc._lua_value(text, "POOLS_FILE") == "/run/jobns/bb/pools.json"
    assert bbdoc._lua_value(text, "JOBNS") == "/opt/jobns/venv/bin/jobns"


def test_nothing_said_where_neither_is_used(tmp_path: Path) -> None:
    assert (
        bbdoc.burst_buffer_findings(config(tmp_path, enabled=False), {}, str(tmp_path), "n1") == []
    )


def test_the_submission_check_alone_is_a_note(tmp_path: Path) -> None:
    conf = install_lua(tmp_path)
    found = bbdoc.burst_buffer_findings(config(tmp_path, enabled=False), controller(), conf, "ctl")
    assert [k for k, _ in found] == ["note"], found
    assert "[burst_buffer] enabled is not true" in found[0][1]


def test_enabled_without_burst_buffer_lua_in_slurm_conf(tmp_path: Path) -> None:
    found = bbdoc.burst_buffer_findings(
        config(tmp_path), {"burstbuffertype": "burst_buffer/datawarp"}, str(tmp_path), "n1"
    )
    assert problems(found) == [
        "[burst_buffer] enabled, but slurm.conf's BurstBufferType is burst_buffer/datawarp: "
        "Slurm runs no jobns bb step, so no job gets a burst buffer; fix: "
        'BurstBufferType=burst_buffer/lua in slurm.conf (docs/admin.md "The burst buffer")'
    ]


def test_a_compute_node_checks_no_controller_part(tmp_path: Path) -> None:
    found = bbdoc.burst_buffer_findings(config(tmp_path), controller(), str(tmp_path), "node1")
    assert problems(found) == [], found
    assert any("no " in t and ".jobns-bb yet" in t for _, t in found), found


def test_a_users_records_directory_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "shared/.jobns-bb").mkdir(parents=True, mode=0o755)
    found = bbdoc.burst_buffer_findings(config(tmp_path), controller(), str(tmp_path), "node1")
    [p] = problems(found)
    assert "is not root's private directory" in p and "fix: remove it" in p


def test_a_ready_controller(tmp_path: Path, posix_module: None) -> None:
    conf = install_lua(tmp_path)
    fresh_pools(tmp_path)
    found = bbdoc.burst_buffer_findings(config(tmp_path), controller(), conf, "ctl.example.org")
    assert problems(found) == [], found
    assert [t for _, t in found if "is jobns's, runs /bin/true" in t] == [
        f"burst buffer: {conf}/burst_buffer.lua is jobns's, runs /bin/true, reads "
        f"{tmp_path}/state/bb/pools.json"
    ], found
    assert any("the pool measured" in t for _, t in found), found


def test_the_controller_without_jobns_lua(tmp_path: Path, posix_module: None) -> None:
    found = bbdoc.burst_buffer_findings(config(tmp_path), controller(), str(tmp_path), "ctl")
    [p] = problems(found)
    assert f"{tmp_path}/burst_buffer.lua is not jobns's; fix: cp {bbdoc.PACKAGED_LUA}" in p


def test_the_controller_lua_pointing_elsewhere(tmp_path: Path, posix_module: None) -> None:
    conf = install_lua(tmp_path, pools="/run/jobns/bb/pools.json", jobns="/nonexistent/jobns")
    fresh_pools(tmp_path)
    found = problems(bbdoc.burst_buffer_findings(config(tmp_path), controller(), conf, "ctl"))
    assert len(found) == 2, found
    assert "reads the pool from /run/jobns/bb/pools.json" in found[0]
    assert (
        f"set POOLS_FILE in {conf}/burst_buffer.lua to {tmp_path}/state/bb/pools.json" in found[0]
    )
    assert "runs /nonexistent/jobns, which is not an executable" in found[1]


def test_the_controller_without_lua_posix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bbdoc, "POSIX_MODULES", (f"{tmp_path}/none/5.*/posix/init.lua",))
    conf = install_lua(tmp_path)
    fresh_pools(tmp_path)
    [p] = problems(bbdoc.burst_buffer_findings(config(tmp_path), controller(), conf, "ctl"))
    assert "fix: apt-get install lua-posix" in p


def test_a_stale_or_missing_pool(tmp_path: Path, posix_module: None) -> None:
    conf = install_lua(tmp_path)
    [p] = problems(bbdoc.burst_buffer_findings(config(tmp_path), controller(), conf, "ctl"))
    assert "pools.json is missing" in p and "jobns-bb-pools.timer" in p
    fresh_pools(tmp_path)
    old = os.stat(tmp_path / "state/bb/pools.json").st_mtime - 3600
    os.utime(tmp_path / "state/bb/pools.json", (old, old))
    [p] = problems(bbdoc.burst_buffer_findings(config(tmp_path), controller(), conf, "ctl"))
    assert "was last written 36" in p


def test_a_slurm_user_sudo_does_not_let_run_jobns(tmp_path: Path, posix_module: None) -> None:
    """SlurmUser slurm, and no sudoers line for it (or no sudo at all): a problem naming
    the exact sudoers line."""
    conf = install_lua(tmp_path)
    fresh_pools(tmp_path)
    found = problems(
        bbdoc.burst_buffer_findings(config(tmp_path), controller(slurmuser="slurm"), conf, "ctl")
    )
    assert len(found) == 1 and "slurm ALL=(root) NOPASSWD: /bin/true bb *" in found[0], found


def test_the_controller_named_by_its_older_key() -> None:
    assert bbdoc._is_controller({"controlmachine": "head"}, "head.cluster")
    assert not bbdoc._is_controller({"slurmctldhost": "head"}, "node1")
    assert not bbdoc._is_controller({}, "node1")
