"""`jobns status --format prometheus` text (no root): launcher.lifecycle.metrics.render."""

from __future__ import annotations

from jobns.launcher.lifecycle.metrics import render
from jobns.launcher.protocol.state import STATES
from tests.metrics_format import parse

JOBS: list[dict[str, object]] = [
    {
        "job_id": "1",
        "state": "running",
        "user": {"name": "alice", "uid": 1000},
        "bytes": 8192,
        "trees": [{"role": "local", "capacity": 1 << 30}, {"role": "shm", "capacity": None}],
        "teardown_failures": 0,
    },
    {
        "job_id": "2",
        "state": "teardown-fail",
        "user": {"name": 'b"o\\b', "uid": 1001},
        "bytes": None,
        "trees": [],
        "teardown_failures": 2,
    },
    {"job_id": "3", "state": "leftover", "user": {"name": "carol", "uid": 1002}, "bytes": 0},
    {"job_id": "4", "state": "unreadable", "error": "bad"},
]
GC = {"time": 1700000000.5, "dead_jobs": 2, "unknown_to_slurm": 1, "leftovers": 3, "problems": 0}


def test_every_metric_parses_and_says_what_it_should() -> None:
    m = parse(render(JOBS, GC, ""))
    assert m["jobns_job_used_bytes"] == [
        ({"job_id": "1", "user": "alice", "state": "running"}, 8192.0),
        ({"job_id": "3", "user": "carol", "state": "leftover"}, 0.0),
    ]
    assert m["jobns_job_capacity_bytes"] == [
        ({"job_id": "1", "user": "alice", "fs": "tmp"}, float(1 << 30))
    ]
    by_state = {labels["state"]: v for labels, v in m["jobns_jobs"]}
    assert set(STATES) <= set(by_state)
    assert by_state["running"] == 1 and by_state["teardown-fail"] == 1
    assert by_state["leftover"] == 1 and by_state["unreadable"] == 1 and by_state["pending"] == 0
    assert m["jobns_job_teardown_failures"] == [({"job_id": "2", "user": 'b"o\\b'}, 2.0)]
    assert m["jobns_teardown_failures"] == [({}, 2.0)]
    assert m["jobns_host_root_shared"] == [({}, 1.0)]
    assert m["jobns_gc_leftovers"] == [({}, 3.0)]
    assert m["jobns_gc_unknown_to_slurm"] == [({}, 1.0)]
    assert m["jobns_gc_last_run_timestamp_seconds"] == [({}, 1700000000.5)]


def test_no_jobs_no_gc_yet_and_a_private_root() -> None:
    m = parse(render([], None, "/ is a private mount"))
    assert m["jobns_job_used_bytes"] == [] and m["jobns_host_root_shared"] == [({}, 0.0)]
    assert not any(k.startswith("jobns_gc_") for k in m)
    assert {v for _, v in m["jobns_jobs"]} == {0.0}
