"""The resident helper's requests (launcher.commands.helper): what a script writes,
read back; anything else refused before it becomes a command line."""

from __future__ import annotations

import pytest

from jobns.launcher.commands.helper import END, order, parse_request
from jobns.launcher.system.errors import JobnsError


def body(**env: str) -> bytes:
    return b"".join(f"{k}={v}\0".encode() for k, v in env.items()) + f"{END}\0".encode()


def test_a_prologs_request_becomes_the_setup_it_would_have_run() -> None:
    r = parse_request(
        "42.setup",
        body(SLURM_JOB_ID="42", SLURM_JOB_USER="alice", SLURM_JOB_COMMENT="jobns: a\nb"),
    )
    assert r is not None and r.verb == "setup" and r.job_id == "42"
    assert r.environ["SLURM_JOB_COMMENT"] == "jobns: a\nb"  # a newline is no separator
    assert r.argv("/etc/j.toml") == [
        "setup",
        "--background",
        "--job-id",
        "42",
        "--user",
        "alice",
        "--config",
        "/etc/j.toml",
    ]
    t = parse_request("42.teardown", body(SLURM_JOB_ID="42", SLURMD_NODENAME="n1"))
    assert t is not None and t.argv(None) == ["teardown", "--background", "--job-id", "42"]


def test_a_request_still_being_written_waits() -> None:
    whole = body(SLURM_JOB_ID="7")
    for cut in (0, 5, len(whole) - 1):
        assert parse_request("7.setup", whole[:cut]) is None


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        ("7.run", body(SLURM_JOB_ID="7"), "not a request name"),
        ("../7.setup", body(SLURM_JOB_ID="7"), "not a request name"),
        ("7.setup", body(SLURM_JOB_ID="8"), "SLURM_JOB_ID"),
        ("7.setup", body(PATH="/tmp", SLURM_JOB_ID="7"), "not a SLURM"),
        ("7.setup", body(LD_PRELOAD="/tmp/x.so", SLURM_JOB_ID="7"), "not a SLURM"),
        ("7.setup", b"SLURM_JOB_ID\0" + f"{END}\0".encode(), "not a SLURM"),
    ],
)
def test_anything_else_is_refused(name: str, data: bytes, why: str) -> None:
    with pytest.raises(JobnsError, match=why):
        parse_request(name, data)


def test_a_jobs_setup_is_taken_before_its_teardown() -> None:
    assert order(["9.teardown", "10.setup", "9.setup", "10.teardown"]) == [
        "9.setup",
        "9.teardown",
        "10.setup",
        "10.teardown",
    ]


def test_a_name_no_shell_could_export_is_left_out() -> None:
    r = parse_request(
        "7.setup", body(SLURM_JOB_ID="7", **{"SLURM-X": "1", "SLURM_" + "A" * 300: "2"})
    )
    assert r is not None and set(r.environ) == {"SLURM_JOB_ID"}
