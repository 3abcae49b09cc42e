"""Boot-time and periodic cleanup as shipped systemd units (jobns/systemd/), and the
installed man page (issue 14). systemd is not PID 1 here: the units are checked with
`systemd-analyze verify` and their ExecStart commands are run as systemd would run them,
against a sandbox (JOBNS_CONFIG), after a simulated crash."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ON_CI, OsUser, Sandbox, require

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "jobns" / "systemd"
NAMES = (
    "jobns-boot.service",
    "jobns-helper.service",
    "jobns-gc.service",
    "jobns-gc.timer",
    "jobns-metrics.service",
    "jobns-metrics.timer",
    "jobns-bb-pools.service",
    "jobns-bb-pools.timer",
)


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    # systemd allows repeated keys (two ExecStart=): keep every value, in order.
    lines: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            lines.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        lines[section].setdefault(key, []).append(value)
    parser.read_dict({s: {k: "\n".join(v) for k, v in kv.items()} for s, kv in lines.items()})
    return parser


def test_units_pass_systemd_analyze_verify() -> None:
    tool = shutil.which("systemd-analyze")
    require(tool is not None, "systemd-analyze is missing (apt-get install systemd)")
    assert tool is not None
    # Documentation=man:jobns(1) is checked too once the man page is installed.
    man = (
        ["--man=no"]
        if subprocess.run(["man", "-w", "jobns"], capture_output=True, check=False).returncode
        else []
    )
    r = subprocess.run(
        [tool, "verify", *man, *(str(UNITS / n) for n in NAMES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_the_boot_unit_runs_before_slurmd_and_the_timer_starts_gc() -> None:
    boot = unit("jobns-boot.service")
    assert "slurmd.service" in boot["Unit"]["Before"].split()
    assert boot["Service"]["Type"] == "oneshot"
    starts = boot["Service"]["ExecStart"].splitlines()
    assert [shlex.split(s.lstrip("-"))[1:] for s in starts] == [["recover"], ["gc"]]
    assert "multi-user.target" in boot["Install"]["WantedBy"].split()
    timer = unit("jobns-gc.timer")
    assert timer["Timer"]["OnUnitActiveSec"] and timer["Install"]["WantedBy"] == "timers.target"
    assert shlex.split(unit("jobns-gc.service")["Service"]["ExecStart"])[1:] == ["gc"]


def exec_starts(name: str) -> list[list[str]]:
    return [shlex.split(s.lstrip("-")) for s in unit(name)["Service"]["ExecStart"].splitlines()]


def test_the_exec_start_commands_clean_up_after_a_crash(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    # A job whose epilog was interrupted (its record says teardown), one still running,
    # and the tree of a standalone task that died with the node.
    for job in ("B1", "B2"):
        r = sandbox.run(["setup", "--job-id", job, "--user", alice.name])
        assert r.returncode == 0, r.stderr
    record = sandbox.state / "jobs/B1/state.json"
    doc = json.loads(record.read_text())
    doc["state"] = "teardown"
    record.write_text(json.dumps(doc))
    left = sandbox.local / "job-B3"
    left.mkdir(mode=0o700)
    for d in (left / "tmp", left / "var_tmp"):
        d.mkdir()
        d.chmod(0o1777)
        os.chown(d, alice.uid, alice.gid)
    os.chown(left, alice.uid, alice.gid)
    # As systemd runs them: the unit's environment (here: the sandbox's config and a PATH
    # without Slurm, which jobns never searches; these ids are no Slurm job's, so their
    # records decide).
    env = {"JOBNS_CONFIG": str(sandbox.config), "PATH": "/usr/local/sbin:/nonexistent"}
    for name in ("jobns-boot.service", "jobns-gc.service"):
        for argv in exec_starts(name):
            r = subprocess.run(
                argv, capture_output=True, text=True, env=env, cwd="/", timeout=120, check=False
            )
            assert r.returncode == 0, (argv, r.stdout, r.stderr)
    assert not (sandbox.local / "job-B1").exists() and not left.exists()
    assert (sandbox.local / "job-B2").is_dir()  # a running job is no one's to clean
    assert [n for n in os.listdir(sandbox.state / "jobs") if not n.endswith(".lock")] == ["B2"]
    assert sandbox.run(["teardown", "--job-id", "B2"]).returncode == 0
    assert sandbox.leftovers() == []


def run_as_systemd(argv: list[str], sandbox: Sandbox) -> subprocess.CompletedProcess[str]:
    """A unit's ExecStart as systemd runs it: from /, a bare environment, the sandbox's config."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        env={"JOBNS_CONFIG": str(sandbox.config), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_the_metrics_unit_writes_the_textfile(sandbox: Sandbox) -> None:
    """jobns-metrics.service's ExecStart, with ${JOBNS_TEXTFILE} as systemd expands it."""
    from tests.metrics_format import parse

    service = unit("jobns-metrics.service")["Service"]
    env_name, _, default = service["Environment"].partition("=")
    assert env_name == "JOBNS_TEXTFILE" and default.endswith(".prom")
    (argv,) = exec_starts("jobns-metrics.service")
    target = sandbox.root / "textfile" / "jobns.prom"
    target.parent.mkdir()
    argv = [str(target) if a == "${JOBNS_TEXTFILE}" else a for a in argv]
    assert str(target) in argv
    r = run_as_systemd(argv, sandbox)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    assert target.stat().st_mode & 0o777 == 0o644
    assert "jobns_jobs" in parse(target.read_text())
    assert os.listdir(target.parent) == ["jobns.prom"]  # no temporary file left
    timer = unit("jobns-metrics.timer")
    assert timer["Timer"]["OnUnitActiveSec"] == "1min"


def test_the_bb_pools_unit_measures_the_pool(sandbox: Sandbox) -> None:
    """jobns-bb-pools.service's ExecStart (the controller's, before slurmctld and every
    30 s): the pool slurm_bb_pools reads, world-readable, integers only."""
    sandbox.write_config("[burst_buffer]\nenabled = true\ngranularity = 4096\n")
    service = unit("jobns-bb-pools.service")
    assert service["Unit"]["Before"] == "slurmctld.service"
    (argv,) = exec_starts("jobns-bb-pools.service")
    r = run_as_systemd(argv, sandbox)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    written = sandbox.state / "bb" / "pools.json"
    assert written.stat().st_mode & 0o777 == 0o644
    doc = json.loads(written.read_text())
    assert json.loads(r.stdout) == doc
    (pool,) = doc["pools"]
    assert pool["id"] == "shared" and pool["granularity"] == 4096
    assert all(type(pool[k]) is int for k in ("quantity", "free", "granularity"))
    assert 0 <= pool["free"] <= pool["quantity"]
    assert unit("jobns-bb-pools.timer")["Timer"]["OnUnitActiveSec"] == "30s"


def test_install_python_installed_the_units_and_the_man_page() -> None:
    """After ci/install-python (CI runs it first): the units in /etc/systemd/system as
    shipped, and `man jobns` showing the page made from --help."""
    installed = Path("/etc/systemd/system/jobns-boot.service")
    if not installed.exists() and not ON_CI:
        pytest.skip("ci/install-python has not installed the units on this machine")
    for name in NAMES:
        assert Path("/etc/systemd/system", name).read_text() == (UNITS / name).read_text()
    r = subprocess.run(
        ["man", "-P", "cat", "jobns"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "MANWIDTH": "100", "LANG": "C.UTF-8"},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "jobns doctor" in r.stdout and "--format" in r.stdout


def test_the_helper_unit_runs_the_helper_and_spares_what_it_started() -> None:
    """jobns-helper.service: `jobns helper`, and a restart kills the helper only (a job's
    PID namespace init and the release processes are its children's children)."""
    svc = unit("jobns-helper.service")["Service"]
    assert shlex.split(svc["ExecStart"])[1:] == ["helper"]
    assert svc["KillMode"] == "process" and svc["Type"] == "simple"
    assert "slurmd.service" in unit("jobns-helper.service")["Unit"]["Before"]
