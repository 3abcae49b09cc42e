"""Attacks on `jobns gc`: it removes only what it proved dead (DESIGN rule 8; contract
point 7). A damaged record is reported, never taken as "this job is gone"; what gc does
remove, it removes without following a link."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.security.conftest import World, alive, no_crash, snapshot

pytestmark = pytest.mark.root


DAMAGE = ["garbage", "empty", "deleted", "mode-000", "wrong-schema", "truncated"]


def damage(record: Path, how: str, original: bytes) -> None:
    if how == "garbage":
        record.write_bytes(b"\x00\xffnot json at all\n")
    elif how == "empty":
        record.write_bytes(b"")
    elif how == "deleted":
        record.unlink()
    elif how == "mode-000":
        record.chmod(0)
    elif how == "wrong-schema":
        record.write_text('{"version": 1, "job_id": "x"}\n')
    else:
        record.write_bytes(original[: len(original) // 2])


@pytest.mark.parametrize("how", DAMAGE)
def test_gc_keeps_a_live_job_whose_record_is_damaged(world: World, how: str) -> None:
    """Attack/accident: the record of a running job is unreadable (garbage, empty,
    deleted, mode 000, another schema, half written). Defence: `jobns gc --no-slurm`
    reports it (exit 125 is fine) but removes nothing of the job: alice's file survives,
    her running task goes on, and a new task of hers still joins the job."""
    box, alice = world.box, world.alice
    assert world.setup("100").returncode == 0
    ticks = box.local / "job-100/tmp/ticks"
    _, pid = world.task(
        "100", alice, "echo keep > /tmp/keep; while :; do echo t >> /tmp/ticks; sleep 0.1; done"
    )
    deadline = time.monotonic() + 10
    while not ticks.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    record = box.state / "jobs/100/state.json"
    original, mode = record.read_bytes(), record.stat().st_mode
    damage(record, how, original)
    r = box.run(["gc", "--no-slurm"])
    no_crash(r)
    assert r.returncode in (0, 125), r.stdout + r.stderr
    assert (box.local / "job-100/tmp/keep").read_text() == "keep\n"
    assert (box.shm / "job-100").is_dir()
    assert alive(pid), "gc killed the job's running task"
    size = ticks.stat().st_size
    time.sleep(0.5)
    assert ticks.stat().st_size > size, "the task stopped writing"
    run = world.run("100", "cat /tmp/keep", user=alice)
    assert run.returncode == 0 and run.stdout == "keep\n", (run.stdout, run.stderr)
    if how != "mode-000":  # root reads a mode-000 file: for gc that record is intact
        assert "100" in r.stdout + r.stderr, "gc did not report the damaged record"
    record.write_bytes(original)
    record.chmod(mode & 0o7777)
    assert world.teardown("100").returncode == 0
    assert not alive(pid)
    world.assert_clean()


def test_gc_removes_an_orphan_tree_without_following_its_links(world: World) -> None:
    """Attack: alice's standalone job dies (its jobns is SIGKILLed) leaving a tree full of
    symlinks to a root-owned directory and to its files. Defence: gc removes the orphan
    tree and only it: the links go, their targets stay."""
    box, alice = world.box, world.alice
    decoy = world.decoy()
    before = snapshot(decoy)
    pidfile = world.w / "orphan.pid"
    p = world.start_jobns(
        [
            "run",
            "--job-id",
            "101",
            "--",
            "sh",
            "-c",
            f"ln -s {decoy} /tmp/etc; ln -s {decoy}/passwd /dev/shm/pw; "
            f"ln -s / /var/tmp/root; echo $$ > {pidfile}; exec sleep 300",
        ],
        user=alice,
    )
    world.track(int(world.wait_file(pidfile)))
    p.kill()
    p.wait(timeout=10)
    time.sleep(0.3)
    assert (box.local / "job-101").is_dir()
    r = box.run(["gc", "--no-slurm"])
    no_crash(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot(decoy) == before
    world.assert_clean()


def test_gc_leaves_a_lookalike_tree_someone_holds(world: World) -> None:
    """Attack: bob makes a tree that looks exactly like an orphaned job tree in the
    shared bases and keeps a process in it. Defence: gc never removes a tree a running
    process holds (a share lock, or a working directory in it)."""
    box, bob = world.box, world.bob
    tree = box.local / "job-102"
    r = world.as_user(
        bob,
        [
            "sh",
            "-c",
            f"mkdir -m 700 {tree} && mkdir -m 1777 {tree}/tmp "
            f"{tree}/var_tmp && echo bobs > {tree}/tmp/f",
        ],
    )
    assert r.returncode == 0, r.stderr
    holder = world.start(
        bob,
        [
            "/usr/bin/python3",
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
            "os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); "
            "print('held', flush=True); time.sleep(600)",
            str(tree),
        ],
        stdout=subprocess.PIPE,
        cwd=str(tree / "tmp"),
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    r = box.run(["gc", "--no-slurm"])
    no_crash(r)
    assert (tree / "tmp/f").read_text() == "bobs\n"
    assert os.stat(tree).st_uid == bob.uid
