"""Attacks on staging through file systems the job user serves (issue 30, finding 3).

Her running job B serves a FUSE mount; she links a stage_in source of job A to it through
/proc/<server>/root/..., stops the server (SIGSTOP), and job A's setup used to sit in
staging-in forever: root blocked on the pipe to its worker, the worker in the FUSE
request. Defences: a stage path is opened without /proc magic links and must stay on the
file systems its own path passes through (refused at once, her error); and every staging
worker has a deadline ([staging] timeout), after which root kills it (its process group)
without ever touching her files, and fails her job."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import assert_refused
from tests.security.conftest import Fuse, World, alive, euid_of, no_crash

pytestmark = pytest.mark.root

MAGIC = "/proc magic link"
LATE = "did not finish within 3 s ([staging] timeout)"


def site(world: World, timeout: int) -> tuple[Path, Path, Path]:
    """[staging] stage_roots = [<sandbox>/stage] (alice's directory in it), an ARC
    session root and scratchdir; (alice's stage directory, sessions, scratch)."""
    stage, sessions, scratch = (world.box.root / n for n in ("stage", "sessions", "scratch"))
    for d in (stage, sessions, scratch):
        d.mkdir(mode=0o755)
        d.chmod(0o755)
    mine = stage / world.alice.name
    mine.mkdir(mode=0o700)
    os.chown(mine, world.alice.uid, world.alice.gid)
    world.box.write_config(
        f'[arc]\nscratchdir = "{scratch}"\n'
        f'[staging]\nsession_roots = ["{sessions}"]\nstage_roots = ["{stage}"]\n'
        f"timeout = {timeout}\n"
    )
    return mine, sessions, scratch


def hers(path: Path, world: World) -> Path:
    os.lchown(path, world.alice.uid, world.alice.gid)
    return path


def stop_and_unmount(server: subprocess.Popen[str], mountpoint: Path) -> None:
    """End her FUSE server (stopped or not) and detach what it served."""
    os.killpg(server.pid, signal.SIGKILL)
    os.killpg(server.pid, signal.SIGCONT)
    server.wait(timeout=30)
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


def jobns_processes(world: World) -> list[int]:
    """Processes running jobns with this test's config (setup and its workers)."""
    config = str(world.box.config).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if config in argv and alive(int(name)):
            out.append(int(name))
    return out


@pytest.mark.parametrize("through", ["root", "cwd"])
def test_stage_in_source_linked_through_proc_pid_root_is_refused_at_once(
    world: World, fuse: Fuse, through: str
) -> None:
    """Attack (issue 30, 3): a stage_in source that is her link to
    /proc/<her FUSE server>/root/<mount>/inside (or .../cwd/...), the server stopped.
    Defence: the link is never followed (openat2 RESOLVE_NO_MAGICLINKS): setup refuses
    the job at once as her error, naming the directive, the path and the fix; nothing of
    the job is left. (Before, setup followed it and hung in the stalled FUSE request.)"""
    mine, _, _ = site(world, timeout=600)
    mnt = world.w / "mnt"
    mnt.mkdir()
    hers(mnt, world)
    server = fuse.mount(world.alice, mnt)
    try:
        # squashfuse runs with cwd "/": .../cwd{mnt} is the same place as .../root{mnt}.
        link = mine / "lnk"
        link.symlink_to(f"/proc/{server.pid}/{through}{mnt}/inside")
        hers(link, world)
        os.killpg(server.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        r = world.setup("301", "--directives", f"stage_in source={link} destination=/tmp/in")
        elapsed = time.monotonic() - t0
        no_crash(r)
        assert elapsed < 15, elapsed
        assert r.returncode == 0 and "refused" in r.stderr, r.stderr
        assert MAGIC in r.stderr and str(link) in r.stderr and "stage_in source" in r.stderr
        assert "name the file's own path below an allowed root" in r.stderr
    finally:
        stop_and_unmount(server, mnt)
    assert_refused(world.box, "301", world.alice, r, MAGIC)
    world.assert_clean()


def test_stage_in_source_linked_onto_her_fuse_mount_elsewhere_is_refused_at_once(
    world: World, fuse: Fuse
) -> None:
    """Attack: her FUSE mount made from the host in a directory of hers outside the
    stage roots (as in another job's tree), and a plain symbolic link to it below the
    stage root. Defence: the path opens (no magic link in it), but what it names lies on
    a file system its own path does not pass through: nothing is copied, the job is
    refused as her error, naming the mount. (Before, the link was followed and copied.)"""
    mine, _, _ = site(world, timeout=600)
    mnt = world.w / "elsewhere"
    mnt.mkdir()
    hers(mnt, world)
    server = fuse.mount(world.alice, mnt)
    try:
        link = mine / "lnk"
        link.symlink_to(f"{mnt}/inside")
        hers(link, world)
        # The worker's lookups would reach the server; leave it running so only the
        # confinement decides (the deadline test covers a stopped one).
        r = world.setup("302", "--directives", f"stage_in source={link} destination=/tmp/in")
        no_crash(r)
        assert r.returncode == 0 and "refused" in r.stderr, r.stderr
        assert f"the file system mounted at {mnt}" in r.stderr, r.stderr
        assert "a file system its path does not pass through" in r.stderr
    finally:
        stop_and_unmount(server, mnt)
    assert_refused(world.box, "302", world.alice, r, "does not pass through")
    world.assert_clean()


def test_stalled_fuse_on_a_stage_in_path_ends_at_the_deadline(world: World, fuse: Fuse) -> None:
    """Attack: her FUSE mount on a directory of hers below the stage root (the path
    passes through it, so confinement allows it), the server stopped; the job also has
    an ARC session directory and a first stage_in that works. Defence: after [staging]
    timeout (3 s here) root kills the worker's process group and refuses the job as her
    error with the deadline message; setup returns within a bound; nothing of the job is
    left (the first copy removed, the session directory's inputs where they were, no
    scratch, no mount); no root process of jobns is left waiting on her server.
    (Before, setup never returned.)"""
    mine, sessions, scratch = site(world, timeout=3)
    session = sessions / "ARCfuse1"
    session.mkdir(mode=0o700)
    inputs = {"script.sh": b"#!/bin/sh\n", "in.dat": os.urandom(5000)}
    for name, data in inputs.items():
        (session / name).write_bytes(data)
        hers(session / name, world)
    hers(session, world)
    ok = mine / "ok"
    ok.write_text("fine\n")
    hers(ok, world)
    mnt = mine / "mnt"
    mnt.mkdir()
    hers(mnt, world)
    server = fuse.mount(world.alice, mnt)
    try:
        os.killpg(server.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        r = world.setup(
            "303",
            "--session-dir",
            str(session),
            "--directives",
            f"stage_in source={ok} destination=/tmp/ok; "
            f"stage_in source={mnt}/inside destination=/tmp/in",
            timeout=120,
        )
        elapsed = time.monotonic() - t0
        no_crash(r)
        assert elapsed < 30, elapsed
        assert r.returncode == 0 and "refused" in r.stderr, r.stderr
        assert f"stage-in of job 303 {LATE}" in r.stderr, r.stderr
        world.box.wait_released()
        # No root process of jobns is left (the worker, hers, was killed and reaped).
        left = jobns_processes(world)
        assert [p for p in left if euid_of(p) == 0] == [], left
        assert left == [], [(p, euid_of(p)) for p in left]
        # The session's inputs are where they were; no scratch; no trace of the job.
        for name, data in inputs.items():
            assert (session / name).read_bytes() == data
        assert sorted(os.listdir(scratch)) == []
    finally:
        stop_and_unmount(server, mnt)
    assert_refused(world.box, "303", world.alice, r, LATE)
    world.assert_clean()


def test_stalled_fuse_on_a_stage_out_path_ends_at_the_deadline(world: World, fuse: Fuse) -> None:
    """Attack: the job's stage_out destination lies in her FUSE mount below the stage
    root, whose server she stops before the epilog. Defence: teardown returns after
    [staging] timeout with her job kept in staging-out (the deadline message in its
    record, her output whole in the job's tree), the node unharmed; once the mount is
    gone a second teardown stages out and leaves nothing."""
    mine, _, _ = site(world, timeout=3)
    mnt = mine / "mnt"
    mnt.mkdir()
    hers(mnt, world)
    dest = mnt / "dir" / "out"
    r = world.setup("304", "--directives", f"stage_out source=/tmp/out destination={dest}")
    assert r.returncode == 0, r.stderr
    assert world.run("304", "echo result > /tmp/out", user=world.alice).returncode == 0
    server = fuse.mount(world.alice, mnt)
    try:
        os.killpg(server.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        r = world.teardown("304", timeout=120)
        elapsed = time.monotonic() - t0
        no_crash(r)
        assert elapsed < 30, elapsed
        assert r.returncode == 0, r.stderr
        assert "stage-out of job 304 did not finish within 3 s ([staging] timeout)" in r.stderr
        (job,) = [j for j in world.status()["jobs"] if j["job_id"] == "304"]
        assert job["state"] == "staging-out", job
        assert (world.box.local / "job-304/tmp/out").read_text() == "result\n"
        assert [p for p in jobns_processes(world) if euid_of(p) == 0] == []
    finally:
        stop_and_unmount(server, mnt)
    # Her mount gone, the destination is her directory again: the stage-out finishes.
    r = world.teardown("304")
    assert r.returncode == 0, r.stderr
    assert dest.read_text() == "result\n"
    world.assert_clean()
