"""`jobns status --format prometheus` on real jobs (root): bytes used and capacities,
jobs by state, failed epilogs, and what the last `jobns gc` found (issue 14)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import OsUser, Sandbox
from tests.metrics_format import parse

pytestmark = pytest.mark.root


def make_leftover(box: Sandbox, user: OsUser, job_id: str) -> None:
    """What a SIGKILLed standalone `jobns run` leaves: the job's tree, nobody holding it."""
    top = box.local / f"job-{job_id}"
    top.mkdir(mode=0o700)
    for d in (top / "tmp", top / "var_tmp"):
        d.mkdir()
        d.chmod(0o1777)
        os.chown(d, user.uid, user.gid)
    os.chown(top, user.uid, user.gid)


def test_status_prometheus_on_real_jobs(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    make_leftover(sandbox, alice, "M0")
    before = time.time()
    r = sandbox.run(["gc", "--no-slurm"])
    assert r.returncode == 0 and "job-M0" in r.stdout, r.stdout + r.stderr
    summary = sandbox.state / "gc.json"
    assert summary.stat().st_uid == 0 and summary.stat().st_mode & 0o077 == 0  # root's

    r = sandbox.run(
        ["setup", "--job-id", "M1", "--user", alice.name, "--directives", "tmp capacity=8MiB"]
    )
    assert r.returncode == 0, r.stderr
    r = sandbox.run(
        ["run", "--job-id", "M1", "--", "sh", "-c", "head -c 1048576 /dev/urandom > /tmp/data"],
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    assert sandbox.run(["setup", "--job-id", "M2", "--user", alice.name]).returncode == 0
    # An immutable base (a node fault): the epilog can neither rename the job's tree out
    # of the way (launcher.lifecycle.release) nor remove it, so it fails for real.
    stuck = sandbox.local
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        assert sandbox.run(["teardown", "--job-id", "M2"]).returncode == 125
        r = sandbox.run(["status", "--format", "prometheus"])
        assert r.returncode == 0 and r.stderr == "", r.stderr
        m = parse(r.stdout)
        used = {s["job_id"]: v for s, v in m["jobns_job_used_bytes"]}
        assert used["M1"] >= 1 << 20
        assert ({"job_id": "M1", "user": alice.name, "fs": "tmp"}, float(8 << 20)) in m[
            "jobns_job_capacity_bytes"
        ]
        by_state = {s["state"]: v for s, v in m["jobns_jobs"]}
        assert by_state["running"] == 1 and by_state["teardown-fail"] == 1
        assert m["jobns_job_teardown_failures"] == [({"job_id": "M2", "user": alice.name}, 1.0)]
        assert m["jobns_teardown_failures"] == [({}, 1.0)]
        assert m["jobns_gc_leftovers"] == [({}, 1.0)]
        assert m["jobns_gc_problems"] == [({}, 0.0)]
        ((_, when),) = m["jobns_gc_last_run_timestamp_seconds"]
        assert before <= when <= time.time()
        # An ordinary user gets her own jobs, and no gc summary (it is root's).
        r = sandbox.run(["status", "--format", "prometheus"], user=alice)
        assert r.returncode == 0, r.stderr
        mine = parse(r.stdout)
        assert {s["job_id"] for s, _ in mine["jobns_job_used_bytes"]} == {"M1"}  # M2: sealed
        mine_by_state = {s["state"]: v for s, v in mine["jobns_jobs"]}
        assert mine_by_state["running"] == 1 and mine_by_state["teardown-fail"] == 1
        assert not any(k.startswith("jobns_gc_") for k in mine)
        r = sandbox.run(["status", "--format", "yaml"])
        assert r.returncode == 125 and "expected table, json or prometheus" in r.stderr
        # --output: the same text, replaced atomically, readable by node_exporter.
        out = sandbox.root / "jobns.prom"
        r = sandbox.run(["status", "--format", "prometheus", "--output", str(out)])
        assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
        assert out.stat().st_mode & 0o777 == 0o644
        assert parse(out.read_text())["jobns_jobs"] == m["jobns_jobs"]
        r = sandbox.run(["status", "--output", str(out)])
        assert r.returncode == 125 and "--output needs --format prometheus" in r.stderr
        r = sandbox.run(
            ["status", "--format", "prometheus", "--output", str(sandbox.root / "nodir" / "x.prom")]
        )
        assert r.returncode == 125 and r.stderr.count("\n") == 1 and "x.prom" in r.stderr
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    assert sandbox.run(["teardown", "--job-id", "M2"]).returncode == 0
    assert sandbox.run(["teardown", "--job-id", "M1"]).returncode == 0
    assert sandbox.leftovers() == []
