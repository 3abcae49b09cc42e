"""A full state directory, for real (root; issue 20): state_dir is a small tmpfs (64 KiB,
or few inodes), filled up, so every writer under it (the job lock, the job's directory,
its record and join record written through `*.tmp-PID` and a rename, its pins, the
once-per-boot marker) meets ENOSPC at some step of setup or teardown.

That is the node's fault (exit 125), but it must say so plainly (the operation, the
file, "the file system of state_dir is full: free space on it"), never as an internal
error, and leave no litter: no temporary file, no empty job directory or lock. Once
space is freed, `jobns teardown` finishes whatever was begun and nothing is left."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts

pytestmark = pytest.mark.root

FULL = "the file system of state_dir is full: free space on it"
PAGE = 4096
DIRECTIVES = "tmp capacity=1MiB; shm capacity=1MiB"


def mount_state(box: Sandbox, options: str) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"mode=0755,{options}", "jobns-test", str(box.state)],
        check=True,
    )
    (box.state / "propagation-checked").touch()


def remount(box: Sandbox, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(box.state)], check=True)


@pytest.fixture
def small_state(sandbox: Sandbox) -> Iterator[Sandbox]:
    """sandbox, with state_dir a 64 KiB tmpfs (unmounted at the end)."""
    mount_state(sandbox, "size=64k")
    try:
        yield sandbox
    finally:
        subprocess.run(["umount", "-R", "-l", str(sandbox.state)], check=False)


def fill(box: Sandbox, leave_pages: int = 0) -> None:
    """Fill state_dir up, then give back leave_pages pages."""
    path = box.state / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * PAGE)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    size = path.stat().st_size
    os.truncate(path, max(size - size % PAGE - leave_pages * PAGE, 0))


def litter(box: Sandbox) -> list[str]:
    """Temporary files of jobns's atomic writes left in state_dir."""
    return [
        str(Path(root) / n) for root, _, names in os.walk(box.state) for n in names if ".tmp-" in n
    ]


def check_failure(r: subprocess.CompletedProcess[str], box: Sandbox) -> None:
    """A failure of a full state_dir: 125, the reason named, no internal error, no litter."""
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:
        assert r.returncode == 125, r.stderr
        last = r.stderr.splitlines()[-1]
        assert FULL in last and str(box.state) in last, r.stderr
    assert litter(box) == []


def assert_clean(box: Sandbox) -> None:
    assert litter(box) == []
    assert sorted(os.listdir(box.state / "jobs")) == []
    assert box.leftovers() == []
    assert [m for m in job_mounts(box) if f" {box.state} " not in m] == []


def setup(box: Sandbox, job: str, user: OsUser) -> subprocess.CompletedProcess[str]:
    return box.run(["setup", "--job-id", job, "--user", user.name, "--directives", DIRECTIVES])


def test_setup_on_a_full_state_dir_says_so_and_leaves_nothing(
    small_state: Sandbox, users: list[OsUser]
) -> None:
    box = small_state
    fill(box)
    r = setup(box, "f1", users[0])
    assert r.returncode == 125
    check_failure(r, box)
    assert "write job record" in r.stderr and "state.json" in r.stderr, r.stderr
    assert_clean(box)  # no job directory, no lock, no tree
    (box.state / "fill").unlink()
    assert setup(box, "f1", users[0]).returncode == 0
    assert box.run(["teardown", "--job-id", "f1"]).returncode == 0
    assert_clean(box)


def test_teardown_on_a_full_state_dir_says_so_and_resumes(
    small_state: Sandbox, users: list[OsUser]
) -> None:
    box = small_state
    r = setup(box, "f2", users[0])
    assert r.returncode == 0, r.stderr
    fill(box)
    r = box.run(["teardown", "--job-id", "f2"])
    assert r.returncode == 125
    check_failure(r, box)
    assert "write join record" in r.stderr and "run.env" in r.stderr, r.stderr
    assert (box.state / "jobs" / "f2" / "state.json").exists()  # kept for the next try
    (box.state / "fill").unlink()
    r = box.run(["teardown", "--job-id", "f2"])
    assert r.returncode == 0, r.stderr
    assert_clean(box)


def test_teardown_of_a_job_never_set_up_on_an_empty_state_dir(
    small_state: Sandbox,
) -> None:
    """An epilog on a node where nothing was ever set up (state_dir empty after a
    reboot): nothing to do, exit 0, nothing made."""
    r = small_state.run(["teardown", "--job-id", "f5"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(os.listdir(small_state.state)) == ["propagation-checked"]


@pytest.mark.parametrize("free_pages", range(6))
def test_every_write_on_a_filling_state_dir(
    small_state: Sandbox, users: list[OsUser], free_pages: int
) -> None:
    """Setup, a task and teardown with only a few pages free: whichever write meets
    ENOSPC, the failure is named and clean; with space back, teardown ends the job."""
    box = small_state
    fill(box, free_pages)
    check_failure(setup(box, "f3", users[0]), box)
    box.run(["run", "--job-id", "f3", "--", "true"], user=users[0])
    check_failure(box.run(["teardown", "--job-id", "f3"]), box)
    (box.state / "fill").unlink()
    r = box.run(["teardown", "--job-id", "f3"])
    assert r.returncode == 0, r.stderr
    assert_clean(box)


@pytest.mark.parametrize("backing", ["tmpfs", "disk"])
@pytest.mark.parametrize("inodes", range(3, 17))
def test_every_file_on_a_state_dir_out_of_inodes(
    sandbox: Sandbox, users: list[OsUser], inodes: int, backing: str
) -> None:
    """The same when state_dir has no inode left: the lock, the job's directory, its
    records, its pin files, a disk capacity's node lock (locks/) each fail at some
    count."""
    box = sandbox
    if backing == "disk":
        scratch = box.root / "scratch"
        box.write_config(f'[capacity]\ntmp_backing = "disk"\nscratch_base = "{scratch}"\n')
    mount_state(box, f"size=1m,nr_inodes={inodes}")
    try:
        check_failure(setup(box, "f4", users[0]), box)
        check_failure(box.run(["teardown", "--job-id", "f4"]), box)
        remount(box, "nr_inodes=1000")
        r = box.run(["teardown", "--job-id", "f4"])
        assert r.returncode == 0, r.stderr
        # A tree made just before its record could say so (the write failed: at 9 inodes
        # with a disk capacity, the shm tree) is not the record's to remove: gc's.
        r = box.run(["gc"])
        assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
        assert_clean(box)
    finally:
        subprocess.run(["umount", "-R", "-l", str(box.state)], check=False)
