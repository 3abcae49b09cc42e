"""Job identity: every value that becomes a path component is validated (no root)."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.model.job import (
    job_id_from,
    layout_from,
    made_up_job_id,
    safe_component,
    user_from,
)
from jobns.launcher.system.errors import JobnsError


@pytest.mark.parametrize("good", ["8451", "job_1.2-3", "a" * 128, "..a", "A"])
def test_safe_ids(good: str) -> None:
    assert job_id_from(good, {}) == good


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "a/b", "/abs", "a b", "x\n", "a" * 129, "é", "a\x00b", "$(id)", "*"]
)
def test_unsafe_ids(bad: str) -> None:
    with pytest.raises(JobnsError, match="job id"):
        job_id_from(bad, {})


@given(st.text(max_size=200))
def test_safe_component_never_returns_a_path_escape(value: str) -> None:
    try:
        out = safe_component(value, "x", "fix")
    except JobnsError:
        return
    assert "/" not in out and out not in (".", "..") and "\x00" not in out and len(out) <= 128


def test_job_id_from_slurm_and_flag_precedence() -> None:
    assert job_id_from(None, {"SLURM_JOB_ID": "12"}) == "12"
    assert job_id_from("7", {"SLURM_JOB_ID": "12"}) == "7"
    with pytest.raises(JobnsError, match="no job id"):
        job_id_from(None, {})


# A Slurm job id: JOBID, JOBID_TASK (array), JOBID+OFFSET (het job).
SLURM_ID = re.compile(r"[0-9]+([_+][0-9]+)?")


def test_made_up_ids_are_safe_unique_and_never_slurm_ids() -> None:
    ids = {made_up_job_id() for _ in range(1000)}
    assert len(ids) == 1000
    for job_id in ids:
        assert re.fullmatch(rf"run-{os.getpid()}-[0-9a-f]{{12}}", job_id), job_id
        assert job_id_from(job_id, {}) == job_id
        assert not SLURM_ID.fullmatch(job_id) and not job_id.isdigit()


def test_layouts() -> None:
    assert layout_from(None) == "local"
    assert layout_from("") == "shared"
    assert layout_from("per-node") == "per-node"
    with pytest.raises(JobnsError):
        layout_from("pernode")


def test_user_defaults_to_caller() -> None:
    assert user_from(None, {}).uid == os.getuid()


def test_unknown_user() -> None:
    with pytest.raises(JobnsError, match="no such user"):
        user_from("no-such-user-jobns", {})
