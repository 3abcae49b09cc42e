"""The CDI spec through a job's life on real mounts (no engine needed): written when the
job runs, gone after teardown, and right after a crash (recover, teardown, gc)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts

pytestmark = pytest.mark.root


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    (sandbox.root / "cdi").mkdir(mode=0o755)
    sandbox.write_config(f'[cdi]\ndir = "{sandbox.root / "cdi"}"\n')
    yield sandbox
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


def identity(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


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
    """The spec names root's mount points (<state_dir>/mounts/JOB/cdi/, root's all the
    way), each the record's tree bound there: under shared_base for the shared layouts
    (per-node: the node's own directory), /dev/shm's always node-local."""
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
        points = box.state / "mounts" / job / "cdi"
        assert mounts == {
            "/tmp": f"{points}/0-tmp",
            "/var/tmp": f"{points}/1-var-tmp",
            "/dev/shm": f"{points}/2-dev-shm",
        }
        tree = box.shared / f"job-{job}"
        if layout == "per-node":
            (node,) = os.listdir(tree)  # a node directory between
            tree = tree / node
        sources = {"/tmp": tree / "tmp", "/var/tmp": tree / "var_tmp"}
        sources["/dev/shm"] = box.shm / f"job-{job}"
        for target, path in mounts.items():
            assert identity(path) == identity(sources[target]), target
            assert os.stat(path).st_uid == alice.uid
        for p in (box.state / "mounts", points.parent, points):
            st = os.lstat(p)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700), p
    finally:
        assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert specs(box) == []


def test_the_spec_mount_points_reach_no_namespace_made_before_or_a_job(
    box: Sandbox, users: list[OsUser]
) -> None:
    """The mount points are made under state_dir, a private mount: a namespace that is a
    slave of the host's and was made before (like a job's, which also hides state_dir)
    never gets them; they are private themselves (nothing mounted later in a tree
    reaches them, nor the other way)."""
    alice = users[0]
    assert box.run(["setup", "--job-id", "CP1", "--user", alice.name]).returncode == 0
    slave = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "slave", "sleep", "120"], cwd="/"
    )
    try:
        time.sleep(0.2)
        assert box.run(["setup", "--job-id", "CP2", "--user", alice.name]).returncode == 0
        points = f"{box.state}/mounts/CP2/cdi/"
        host = [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if points in ln]
        assert len(host) == 3, host
        assert not [ln for ln in host if "shared:" in ln or "master:" in ln], host
        assert points not in Path(f"/proc/{slave.pid}/mountinfo").read_text()
        r = box.run(["run", "--job-id", "CP1", "--", "cat", "/proc/self/mountinfo"], user=alice)
        assert r.returncode == 0 and f"{box.state}/mounts" not in r.stdout, r.stdout
    finally:
        slave.kill()
        slave.wait()
        for job in ("CP1", "CP2"):
            assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert specs(box) == [] and box.leftovers() == []
    assert not (box.state / "mounts" / "CP2").exists()


def test_gc_detaches_the_mount_points_of_a_job_whose_record_is_gone(
    box: Sandbox, users: list[OsUser]
) -> None:
    """A node that lost a job's record and spec (its state directory removed by hand)
    keeps the spec's mount points, which hold the job's trees: gc detaches them (no
    record, so not a live job's), then removes the trees."""
    alice = users[0]
    assert box.run(["setup", "--job-id", "CR6", "--user", alice.name]).returncode == 0
    jobdir = box.state / "jobs" / "CR6"
    for pin in ("ns/mnt", "ns/user"):
        subprocess.run(["umount", "-l", str(jobdir / pin)], capture_output=True, check=False)
    shutil.rmtree(jobdir)
    (box.state / "jobs" / "CR6.lock").unlink(missing_ok=True)
    (box.root / "cdi" / "jobns-CR6.json").unlink()  # the spec gone too (gc found it earlier)
    assert (box.state / "mounts" / "CR6").is_dir()
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "detaching root's mount points of job CR6 (no job record)" in r.stdout, r.stdout
    assert not (box.state / "mounts" / "CR6").exists()
    assert specs(box) == [] and box.leftovers() == [] and job_mounts(box) == []
