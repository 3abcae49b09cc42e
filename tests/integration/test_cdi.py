"""The CDI spec through a job's life on real mounts (no engine needed): written when the
job runs, gone after teardown, and right after a crash (recover, teardown, gc)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox

pytestmark = pytest.mark.root


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    (sandbox.root / "cdi").mkdir(mode=0o755)
    sandbox.write_config(f'[cdi]\ndir = "{sandbox.root / "cdi"}"\n')
    yield sandbox
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


def specs(box: Sandbox) -> list[str]:
    return sorted(os.listdir(box.root / "cdi"))


def killed_at(box: Sandbox, job: str, user: OsUser, point: str) -> None:
    """Start setup, let it stop at a pause point, SIGKILL it there."""
    p = box.popen(
        ["setup", "--job-id", job, "--user", user.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"JOBNS_TEST_PAUSE_IN": point},
    )
    deadline = time.monotonic() + 30
    while Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, "setup did not reach its pause point"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_a_setup_killed_before_the_spec_is_recovered_with_it(
    box: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    killed_at(box, "CR1", alice, "cdi")
    assert specs(box) == []  # killed before writing: nothing half-written either
    r = box.run(["recover", "--job-id", "CR1"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert specs(box) == ["jobns-CR1.json"]
    doc = json.loads((box.root / "cdi" / "jobns-CR1.json").read_text())
    assert doc["devices"][0]["name"] == "CR1"
    assert box.run(["teardown", "--job-id", "CR1"]).returncode == 0
    assert specs(box) == [] and box.leftovers() == []


def test_teardown_of_a_killed_setup_removes_the_spec(box: Sandbox, users: list[OsUser]) -> None:
    """Killed after the spec was written (at the very end of pre-run): the epilog, from
    pre-run, removes it with the trees."""
    alice = users[0]
    assert box.run(["setup", "--job-id", "CR2", "--user", alice.name]).returncode == 0
    assert specs(box) == ["jobns-CR2.json"]
    r = box.run(["teardown", "--job-id", "CR2"])
    assert r.returncode == 0, r.stderr
    assert specs(box) == [] and box.leftovers() == []


def test_gc_removes_the_spec_of_a_forgotten_job(box: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    assert box.run(["setup", "--job-id", "CR3", "--user", alice.name]).returncode == 0
    # The record forgotten by hand (--force after a failed teardown, say) without the spec.
    spec = box.root / "cdi" / "jobns-CR3.json"
    saved = spec.read_bytes()
    assert box.run(["teardown", "--job-id", "CR3"]).returncode == 0
    spec.write_bytes(saved)
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "removing the CDI spec of job CR3 (no job record)" in r.stdout
    assert specs(box) == []


def test_refused_job_gets_no_spec(box: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    r = box.run(
        ["setup", "--job-id", "CR4", "--user", alice.name],
        env={"SLURM_JOB_COMMENT": "jobns: shm capacity=nonsense"},
    )
    assert r.returncode == 0, r.stderr
    assert specs(box) == []
    assert box.run(["teardown", "--job-id", "CR4"]).returncode == 0


@pytest.mark.parametrize("layout", ["shared", "per-node"])
def test_shared_layouts_name_their_trees(box: Sandbox, users: list[OsUser], layout: str) -> None:
    """The spec names whatever the record's trees are: under shared_base for the shared
    layouts (per-node: the node's own directory), /dev/shm's always node-local."""
    alice = users[0]
    job = f"CS{layout[0]}"
    flag = "--use-shared-tmpdir" + ("=per-node" if layout == "per-node" else "")
    r = box.run(["setup", "--job-id", job, "--user", alice.name, flag])
    assert r.returncode == 0, r.stderr
    try:
        doc = json.loads((box.root / "cdi" / f"jobns-{job}.json").read_text())
        mounts = {
            m["containerPath"]: m["hostPath"] for m in doc["devices"][0]["containerEdits"]["mounts"]
        }
        assert mounts["/tmp"].startswith(f"{box.shared}/job-{job}/")
        assert mounts["/tmp"].endswith("/tmp") and mounts["/var/tmp"].endswith("/var_tmp")
        if layout == "per-node":
            assert mounts["/tmp"] != f"{box.shared}/job-{job}/tmp"  # a node directory between
        assert mounts["/dev/shm"] == f"{box.shm}/job-{job}"
        for path in mounts.values():
            assert os.stat(path).st_uid == alice.uid
    finally:
        assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert specs(box) == []
