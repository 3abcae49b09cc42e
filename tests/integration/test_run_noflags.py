"""`jobns run -- CMD` outside Slurm with no --job-id: a job of that one command, with a
made-up id (run-PID-HEX), exactly as if the id had been passed with --job-id."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts

pytestmark = pytest.mark.root

MADE_UP = re.compile(r"run-[0-9]+-[0-9a-f]{12}")

# argv: DIR NAME: write NAME into the job's /tmp, /var/tmp and /dev/shm, say which
# scratch entries of the host's /tmp show inside, report the id, wait for DIR/gate.
TASK = r"""
dir=$1; name=$2
for d in /tmp /var/tmp /dev/shm; do echo "$name" > "$d/mine"; done
ls -A /tmp > "$dir/$name.ls.tmp"
echo "$JOBNS_JOB_ID $TMPDIR" > "$dir/$name.id.tmp"
mv "$dir/$name.ls.tmp" "$dir/$name.ls"; mv "$dir/$name.id.tmp" "$dir/$name.id"
while [ ! -e "$dir/gate" ]; do sleep 0.05; done
cat /tmp/mine /var/tmp/mine /dev/shm/mine
"""


def wait_for(path: Path, p: subprocess.Popen[str], timeout: float = 30) -> str:
    """path's text once the task wrote it; the run's output if it ended first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if p.poll() is not None:
            raise AssertionError(f"jobns run ended ({p.returncode}): {p.communicate()}")
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.02)
    return path.read_text()


def state_entries(box: Sandbox) -> list[str]:
    return sorted(str(p.relative_to(box.state)) for p in box.state.rglob("*"))


def start(box: Sandbox, user: OsUser | None, name: str, w: Path) -> subprocess.Popen[str]:
    """A no-flag `jobns run` of TASK (no SLURM_JOB_ID in its environment: Sandbox.env)."""
    return box.popen(
        ["run", "--", "sh", "-c", TASK, "task", str(w), name],
        user=user,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def scratch(box: Sandbox) -> Path:
    w = box.root / "w"
    w.mkdir()
    w.chmod(0o1777)
    return w


@pytest.mark.parametrize("who", ["alice", "root"])
def test_no_flag_run_is_a_private_job_of_its_own(
    sandbox: Sandbox, users: list[OsUser], who: str
) -> None:
    user = users[0] if who == "alice" else None
    w = scratch(sandbox)
    host = Path("/tmp") / f"jobns-host-marker-{os.getpid()}"
    host.write_text("host\n")
    state_before, mounts_before = state_entries(sandbox), job_mounts(sandbox)
    try:
        p = start(sandbox, user, "a", w)
        job_id, tmpdir = wait_for(w / "a.id", p).split()
        assert MADE_UP.fullmatch(job_id), job_id
        assert tmpdir == "/tmp"
        # The host's /tmp is hidden inside, and what the job writes stays in its trees.
        assert host.name not in wait_for(w / "a.ls", p).split()
        assert not (Path("/tmp") / "mine").exists()
        tree = sandbox.local / f"job-{job_id}"
        assert (tree / "tmp/mine").read_text() == "a\n"
        assert (tree / "var_tmp/mine").read_text() == "a\n"
        assert (sandbox.shm / f"job-{job_id}/mine").read_text() == "a\n"
        owner = users[0].uid if user else 0
        assert tree.stat().st_uid == owner
        (w / "gate").touch()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.split() == ["a", "a", "a"]
    finally:
        host.unlink()
    # Torn down like any job a `jobns run --job-id` set up for itself: nothing left.
    assert sandbox.leftovers() == []
    assert state_entries(sandbox) == state_before
    assert job_mounts(sandbox) == mounts_before


def test_two_concurrent_no_flag_runs_are_two_jobs(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    w = scratch(sandbox)
    procs = {name: start(sandbox, alice, name, w) for name in ("one", "two")}
    ids = {name: wait_for(w / f"{name}.id", procs[name]).split()[0] for name in procs}
    assert ids["one"] != ids["two"], ids
    for name in procs:
        # Each sees only its own /tmp: the other's file is not there.
        assert wait_for(w / f"{name}.ls", procs[name]).split() == ["mine", "pmix"], name
        assert (sandbox.local / f"job-{ids[name]}/tmp/mine").read_text() == f"{name}\n"
    (w / "gate").touch()
    for name, p in procs.items():
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.split() == [name] * 3
    assert sandbox.leftovers() == []


def test_slurm_job_id_still_names_the_job(sandbox: Sandbox, users: list[OsUser]) -> None:
    r = sandbox.run(
        ["run", "--", "sh", "-c", "echo $JOBNS_JOB_ID"], user=users[0], env={"SLURM_JOB_ID": "42"}
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "42"
    r = sandbox.run(["run", "--", "true"], user=users[0], env={"SLURM_JOB_ID": ""})
    assert r.returncode == 125 and "job id is empty" in r.stderr, r.stderr


@pytest.mark.parametrize("verb", ["setup", "teardown", "env"])
def test_prolog_epilog_and_env_without_a_job_id_still_refuse(sandbox: Sandbox, verb: str) -> None:
    """A prolog or epilog without a job id is a bug of the site's: never a made-up job."""
    r = sandbox.run([verb])
    assert r.returncode == 125, (r.stdout, r.stderr)
    assert "no job id" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sandbox.leftovers() == []
    assert not (sandbox.state / "jobs").exists() or not any((sandbox.state / "jobs").iterdir())


def test_a_killed_no_flag_run_is_a_leftover_gc_removes(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """SIGKILL of jobns itself (the task dies with it: parent-death signal): nothing
    removes its trees then; status shows them as a leftover of its made-up id, and gc,
    which never asks Slurm about an id that is no Slurm job id, removes them."""
    w = scratch(sandbox)
    p = start(sandbox, users[0], "k", w)
    job_id = wait_for(w / "k.id", p).split()[0]
    p.kill()
    p.communicate(timeout=30)
    status = sandbox.run(["status", "--json"])
    assert job_id in status.stdout and "leftover" in status.stdout, status.stdout
    r = sandbox.run(["gc"])
    assert r.returncode == 0, r.stderr
    assert "squeue" not in r.stderr, r.stderr
    assert sandbox.leftovers() == []
