"""The epilog's release process (launcher.lifecycle.release), for real (root).

`jobns teardown` returns once the job's trees are out of its way (sealed, renamed
<name>~removing-<hex>, capacities emptied and detached); a process of its own removes them. These
tests stop that process at each of its steps (JOBNS_TEST_PAUSE_IN, inherited from the
epilog) and SIGKILL it there: `jobns recover` or `jobns gc` finishes what it left, and
nothing of the job remains. A requeued job (the same id) set up while the old release
still runs gets fresh directories, and neither loses anything.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts
from tests.integration.test_setup import assert_clean, setup, teardown

pytestmark = pytest.mark.root

STEPS = ["release", "release-namespaces", "release-tree", "release-done"]
# Files in the shm capacity (the epilog empties and detaches it itself, whatever its size)
# and a tree in /tmp and /var/tmp (the release process removes them).
FILES = (
    "set -e; for i in $(seq 300); do echo $i > /dev/shm/s$i; done; "
    "mkdir -p /tmp/a/b /var/tmp/c; for i in $(seq 50); do echo $i > /tmp/a/b/f$i; done; "
    "echo v > /var/tmp/c/v"
)


def release_of(box: Sandbox, job: str, timeout: float = 30) -> int:
    """The pid of the job's release process once it has stopped itself (SIGSTOP) at its
    pause point: the only stopped `jobns teardown --config BOX ... --job-id JOB` left (the
    epilog itself has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{name}/stat") as f:
                    stopped = f.read().rsplit(") ", 1)[1][0] == "T"
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            mine = str(box.config).encode() in argv and job.encode() in argv
            if stopped and mine and b"teardown" in argv:
                return int(name)
        time.sleep(0.02)
    raise AssertionError(f"no stopped release process of job {job}")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"{pid} outlived SIGKILL"
        time.sleep(0.02)


def releases(box: Sandbox) -> list[str]:
    where = box.state / "releases"
    return sorted(os.listdir(where)) if where.is_dir() else []


def epilog_done(box: Sandbox, job: str) -> None:
    """What the epilog itself finishes before it returns: no tree under the job's names,
    no mount of the job's, no record."""
    assert not os.path.lexists(box.local / f"job-{job}")
    assert not os.path.lexists(box.shm / f"job-{job}")
    assert job_mounts(box) == []
    assert sorted(os.listdir(box.state / "jobs")) == []


@pytest.mark.parametrize("finisher", ["recover", "gc"])
@pytest.mark.parametrize("step", STEPS)
def test_sigkill_of_the_release_at_each_step_is_finished(
    sandbox: Sandbox, users: list[OsUser], step: str, finisher: str
) -> None:
    alice = users[0]
    setup(sandbox, "R1", "--user", alice.name, "--directives", "shm capacity=64MiB")
    r = sandbox.run(["run", "--job-id", "R1", "--", "sh", "-c", FILES], user=alice)
    assert r.returncode == 0, r.stderr
    r = sandbox.run(["teardown", "--job-id", "R1"], env={"JOBNS_TEST_PAUSE_IN": step})
    assert r.returncode == 0, r.stderr
    pid = release_of(sandbox, "R1")
    epilog_done(sandbox, "R1")
    kill(pid)
    assert len(releases(sandbox)) == 1  # what the killed process did not finish
    args = ["recover"] if finisher == "recover" else ["gc", "--no-slurm"]
    r = sandbox.run(args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "finished the interrupted release of job R1" in r.stdout, r.stdout
    assert releases(sandbox) == []
    assert_clean(sandbox)


@pytest.mark.parametrize("layout", ["local", "per-node"])
def test_a_requeued_job_set_up_while_its_old_release_runs_gets_fresh_directories(
    sandbox: Sandbox, users: list[OsUser], layout: str
) -> None:
    alice = users[0]
    opts = ["--user", alice.name] + (["--use-shared-tmpdir=per-node"] if layout != "local" else [])
    setup(sandbox, "R2", *opts)
    old = "echo old > /tmp/f; echo old > /var/tmp/g; echo old > /dev/shm/h"
    assert sandbox.run(["run", "--job-id", "R2", "--", "sh", "-c", old], user=alice).returncode == 0
    r = sandbox.run(["teardown", "--job-id", "R2"], env={"JOBNS_TEST_PAUSE_IN": "release"})
    assert r.returncode == 0, r.stderr
    pid = release_of(sandbox, "R2")
    try:
        # The requeued job: set up again while the old one's trees still await removal.
        setup(sandbox, "R2", *opts)  # no squatter moved aside, no warning at all
        new = (
            "ls -A /tmp /var/tmp /dev/shm | grep -qx -e f -e g -e h && exit 9; "
            "echo new > /tmp/f; echo new > /var/tmp/g; echo new > /dev/shm/h"
        )
        r = sandbox.run(["run", "--job-id", "R2", "--", "sh", "-c", new], user=alice)
        assert r.returncode == 0, (r.returncode, r.stderr)  # 9: an old file showed
    finally:
        os.kill(pid, signal.SIGCONT)
    sandbox.wait_released()
    assert releases(sandbox) == []
    r = sandbox.run(
        ["run", "--job-id", "R2", "--", "cat", "/tmp/f", "/var/tmp/g", "/dev/shm/h"], user=alice
    )
    assert r.returncode == 0 and r.stdout == "new\nnew\nnew\n", (r.stdout, r.stderr)
    teardown(sandbox, "R2")
    assert_clean(sandbox)
    assert os.listdir(sandbox.shared) == []  # per-node: job-R2/ pruned with the last tree


def test_a_tree_the_release_cannot_remove_is_reported_by_gc_until_it_can(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """An immutable file (only root can set the flag: a node fault) in the job's tree:
    the epilog is done with the job all the same (exit 0: the tree is out of the job's
    way), the release keeps its record, and every `jobns gc` reports it (exit 125)
    until the administrator clears the flag; then gc removes it."""
    setup(sandbox, "R3", "--user", users[0].name)
    stuck = sandbox.local / "job-R3/tmp/stuck"
    stuck.write_text("immutable")
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    moved: list[str] = []
    try:
        teardown(sandbox, "R3")
        sandbox.wait_released()
        moved = glob.glob(f"{sandbox.local}/job-R3~removing-*/tmp/stuck")
        assert len(moved) == 1 and len(releases(sandbox)) == 1
        r = sandbox.run(["gc", "--no-slurm"])
        assert r.returncode == 125 and "Operation not permitted" in r.stdout, r.stdout
        assert len(releases(sandbox)) == 1
    finally:
        for path in moved or [str(stuck)]:
            subprocess.run(["chattr", "-i", path], check=False)
    r = sandbox.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert releases(sandbox) == []
    assert_clean(sandbox)


def test_gc_leaves_the_trees_of_a_live_release_alone(sandbox: Sandbox, users: list[OsUser]) -> None:
    """A release at work owns its renamed trees: gc (which removes root's
    job-*~removing-* entries it finds) neither removes them under it nor finishes it."""
    setup(sandbox, "R4", "--user", users[0].name)
    r = sandbox.run(["teardown", "--job-id", "R4"], env={"JOBNS_TEST_PAUSE_IN": "release-tree"})
    assert r.returncode == 0, r.stderr
    pid = release_of(sandbox, "R4")
    try:
        left = [Path(p).name for p in glob.glob(f"{sandbox.shm}/job-R4~removing-*")]
        left += [Path(p).name for p in glob.glob(f"{sandbox.local}/job-R4~removing-*")]
        assert len(left) == 1  # one tree removed, the other waits
        r = sandbox.run(["gc", "--no-slurm"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "R4" not in r.stdout and len(releases(sandbox)) == 1
        again = [p.name for base in (sandbox.local, sandbox.shm) for p in base.iterdir()]
        assert again == left
    finally:
        os.kill(pid, signal.SIGCONT)
    assert_clean(sandbox)


def test_slurmd_killing_the_epilogs_process_group_spares_the_release(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """slurmd kills the epilog's process group as soon as the epilog exits (seen on
    Slurm 26.05: a plain child of the epilog dies, a setsid one lives). The release
    process leaves that group first thing; the epilog must not exit before it has, or
    on a loaded node the release dies in the epilog's group and the job's trees stay
    (the rig's Slurm tests failed so under CI's load). Here the release stops itself
    before it leaves the group: the epilog must still be waiting for it."""
    alice = users[0]
    setup(sandbox, "R9", "--user", alice.name)
    r = sandbox.run(["run", "--job-id", "R9", "--", "sh", "-c", FILES], user=alice)
    assert r.returncode == 0, r.stderr
    epilog = subprocess.Popen(
        sandbox.cmd(["teardown", "--job-id", "R9"]),
        env={**os.environ, "JOBNS_TEST_PAUSE_IN": "release-fork"},
        process_group=0,  # as slurmd starts it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    child = release_of(sandbox, "R9")
    try:
        early = epilog.wait(timeout=2)  # must time out: the release is still in the group
    except subprocess.TimeoutExpired:
        early = None
    os.kill(child, signal.SIGCONT)
    code = epilog.wait(timeout=60) if early is None else early
    try:
        os.killpg(epilog.pid, signal.SIGKILL)  # what slurmd does after the epilog
    except ProcessLookupError:
        pass
    assert early is None, "the epilog exited while its release was still in its group"
    assert code == 0
    sandbox.wait_released()
    assert releases(sandbox) == []
    assert_clean(sandbox)
