"""Attacks through staging: stage_in/stage_out paths and ARC session directories that
lead, through symlinks or someone else's ownership, to files the job user may not read
or places she may not write. Copies run as the job user, so they fail; root never reads
or writes for her; her outputs are never lost; a failure fails her job, never the node
(contract point 3c)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import OsUser
from tests.security.conftest import World, no_crash, refused, snapshot

pytestmark = pytest.mark.root


def stage_root(world: World) -> Path:
    """[staging] stage_roots = [<sandbox>/stage], with a directory for each user."""
    stage = world.box.root / "stage"
    stage.mkdir(mode=0o755)
    for u in (world.alice, world.bob):
        d = stage / u.name
        d.mkdir(mode=0o700)
        os.chown(d, u.uid, u.gid)
    world.box.write_config(f'[staging]\nstage_roots = ["{stage}"]\n')
    return stage


def owned(path: Path, user: OsUser, mode: int) -> Path:
    os.lchown(path, user.uid, user.gid)
    if not path.is_symlink():
        path.chmod(mode)
    return path


def job_files(world: World, job: str) -> list[str]:
    out = []
    for top in (world.box.local / f"job-{job}", world.box.shm / f"job-{job}"):
        for root, _, names in os.walk(top):
            out += [str(Path(root) / n) for n in names]
    return out


# ------------------------------------------------------------------- contract 3c


def test_stage_out_to_a_place_she_cannot_write_keeps_her_outputs(world: World) -> None:
    """Attack/mistake: a stage_out destination in a root-owned directory she cannot write.
    Defence: teardown exits 0; the output is not lost (still in the job's tree); the job's
    record stays in staging-out with its errors (jobns status); a second teardown after
    the destination became writable completes the stage-out and leaves nothing."""
    stage = stage_root(world)
    locked = stage / "locked"
    locked.mkdir(mode=0o755)
    r = world.setup("80", "--directives", f"stage_out source=/tmp/out destination={locked}/out")
    assert r.returncode == 0, r.stderr
    assert world.run("80", "echo result > /tmp/out", user=world.alice).returncode == 0
    r = world.teardown("80")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert not (locked / "out").exists()
    assert (world.box.local / "job-80/tmp/out").read_text() == "result\n"
    (job,) = [j for j in world.status()["jobs"] if j["job_id"] == "80"]
    assert job["state"] == "staging-out", job
    assert job.get("errors"), job
    os.chown(locked, world.alice.uid, world.alice.gid)
    r = world.teardown("80")
    assert r.returncode == 0, r.stderr
    assert (locked / "out").read_text() == "result\n"
    assert (locked / "out").stat().st_uid == world.alice.uid
    world.assert_clean()


def test_stage_out_destination_symlinked_to_a_root_directory(world: World) -> None:
    """Attack: alice's stage_out destination goes through a symlink of hers to a
    root-owned directory. Defence: nothing is ever written there (the copy runs as her);
    teardown exits 0, her output is kept; --hurry then discards it and leaves nothing."""
    stage = stage_root(world)
    decoy = world.decoy()
    before = snapshot(decoy)
    link = stage / world.alice.name / "out"
    link.symlink_to(decoy)
    os.lchown(link, world.alice.uid, world.alice.gid)
    assert (
        world.setup(
            "81", "--directives", f"stage_out source=/tmp/o destination={link}/planted"
        ).returncode
        == 0
    )
    assert world.run("81", "echo o > /tmp/o", user=world.alice).returncode == 0
    r = world.teardown("81")
    assert r.returncode == 0, r.stderr
    assert snapshot(decoy) == before
    assert (world.box.local / "job-81/tmp/o").read_text() == "o\n"
    assert world.teardown("81", "--hurry").returncode == 0
    assert snapshot(decoy) == before
    world.assert_clean()


def test_stage_out_source_symlinked_to_etc_shadow(world: World) -> None:
    """Attack: alice's job makes its stage_out source a symlink to /etc/shadow, hoping the
    epilog copies it into her directory. Defence: the copy runs as alice and cannot read
    it: no byte of /etc/shadow reaches her; teardown exits 0."""
    stage = stage_root(world)
    dest = stage / world.alice.name / "loot"
    assert (
        world.setup("82", "--directives", f"stage_out source=/tmp/s destination={dest}").returncode
        == 0
    )
    assert world.run("82", "ln -s /etc/shadow /tmp/s", user=world.alice).returncode == 0
    r = world.teardown("82")
    assert r.returncode == 0, r.stderr
    shadow = Path("/etc/shadow").read_bytes()
    assert not dest.exists() or dest.read_bytes() != shadow
    assert not dest.exists() or b"root:" not in dest.read_bytes()
    if world.jobs_left():
        assert world.teardown("82", "--hurry").returncode == 0
    world.assert_clean()


@pytest.mark.parametrize("target", ["shadow", "bobs"])
def test_stage_in_symlink_to_a_file_she_cannot_read(world: World, target: str) -> None:
    """Attack: alice's stage_in source is her symlink (inside the stage root) to a file
    she may not read: /etc/shadow, or bob's private file. Defence: setup exits 0, the job
    is refused, nothing of the file is copied into the job, bob's file is untouched."""
    stage = stage_root(world)
    secret = Path("/etc/shadow")
    if target == "bobs":
        secret = stage / world.bob.name / "secret"
        secret.write_text("bob's secret\n")
        owned(secret, world.bob, 0o600)
    before = secret.read_bytes()
    link = stage / world.alice.name / "innocent"
    link.symlink_to(secret)
    os.lchown(link, world.alice.uid, world.alice.gid)
    r = world.setup("83", "--directives", f"stage_in source={link} destination=/tmp/loot")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    loot = [f for f in job_files(world, "83") if Path(f).name.startswith(("loot", ".jobns"))]
    assert loot == []
    refused(world.run("83", "cat /tmp/loot", user=world.alice))
    assert secret.read_bytes() == before
    assert world.teardown("83").returncode == 0
    world.assert_clean()


def test_stage_in_directory_with_links_to_secrets_copies_links_only(world: World) -> None:
    """Attack: alice stages in a directory of hers that holds symlinks to /etc/shadow and
    to a root-only directory. Defence: links inside are copied as links (never followed),
    so no secret content reaches the job; the job runs; teardown leaves nothing."""
    stage = stage_root(world)
    decoy = world.decoy(mode=0o700)
    src = stage / world.alice.name / "tree"
    src.mkdir()
    (src / "shadow").symlink_to("/etc/shadow")
    (src / "dir").symlink_to(decoy)
    (src / "real").write_text("real\n")
    for p in (src, src / "shadow", src / "dir", src / "real"):
        os.lchown(p, world.alice.uid, world.alice.gid)
    r = world.setup("84", "--directives", f"stage_in source={src} destination=/tmp/in")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    r = world.run("84", "cat /tmp/in/real; readlink /tmp/in/shadow /tmp/in/dir", user=world.alice)
    if r.returncode == 0:
        assert r.stdout.split() == ["real", "/etc/shadow", str(decoy)], r.stdout
    else:
        refused(r)
    for f in job_files(world, "84"):
        p = Path(f)
        if not p.is_symlink():
            assert b"root:" not in p.read_bytes(), f
    assert world.teardown("84").returncode == 0
    world.assert_clean()


# -------------------------------------------------------------- session dirs


def arc_site(world: World) -> tuple[Path, Path]:
    sessions, scratch = world.box.root / "sessions", world.box.root / "scratch"
    for d in (sessions, scratch):
        d.mkdir(mode=0o755)
    world.box.write_config(
        f'[arc]\nshared_filesystem = true\nscratchdir = "{scratch}"\n'
        f'[staging]\nsession_roots = ["{sessions}"]\n'
    )
    return sessions, scratch


def bobs_session(world: World, sessions: Path) -> Path:
    d = sessions / "ARCbob"
    d.mkdir(mode=0o700)
    (d / "input.dat").write_text("bob's input\n")
    (d / "stdout").write_text("")
    for p in (d, d / "input.dat", d / "stdout"):
        os.chown(p, world.bob.uid, world.bob.gid)
    return d


@pytest.mark.parametrize("how", ["symlink", "owned-by-bob"])
def test_session_dir_of_someone_else_is_never_staged(world: World, how: str) -> None:
    """Attack: alice's job's session directory is a symlink to bob's session directory, or
    a directory owned by bob. Defence: the job is refused (setup exits 0 with the job
    refused, or 125 with one line); bob's files are not moved, read, chowned or
    deleted; nothing is left."""
    sessions, scratch = arc_site(world)
    bob_dir = bobs_session(world, sessions)
    if how == "symlink":
        session = sessions / "ARCalice"
        session.symlink_to(bob_dir)
        os.lchown(session, world.alice.uid, world.alice.gid)
    else:
        session = bob_dir
    before = snapshot(bob_dir)
    r = world.setup("85", "--session-dir", str(session))
    no_crash(r)
    if r.returncode == 0:
        refused(world.run("85", "true", user=world.alice))
    else:
        assert r.returncode == 125 and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(bob_dir) == before
    assert list(scratch.iterdir()) == []
    assert world.teardown("85").returncode == 0
    assert snapshot(bob_dir) == before
    world.assert_clean()


def test_session_dir_swapped_for_a_link_before_teardown(world: World) -> None:
    """Attack: after a normal stage-in, alice replaces her session directory (hers, in a
    root-owned session root she cannot write: so only its content) with a symlink named
    like an output that points to bob's session directory, hoping the epilog moves
    outputs through it. Defence: outputs are moved as alice, a link is moved as a link;
    bob's directory is untouched; teardown exits 0."""
    sessions, scratch = arc_site(world)
    bob_dir = bobs_session(world, sessions)
    before = snapshot(bob_dir)
    mine = sessions / "ARCalice"
    mine.mkdir(mode=0o700)
    (mine / "in.txt").write_text("in\n")
    for p in (mine, mine / "in.txt"):
        os.chown(p, world.alice.uid, world.alice.gid)
    r = world.setup("86", "--session-dir", str(mine))
    assert r.returncode == 0, r.stderr
    r = world.run(
        "86",
        f"echo out > {scratch}/ARCalice/out.txt; ln -s {bob_dir} {scratch}/ARCalice/results",
        user=world.alice,
    )
    assert r.returncode == 0, r.stderr
    r = world.teardown("86")
    assert r.returncode == 0, r.stderr
    assert snapshot(bob_dir) == before
    assert (mine / "out.txt").read_text() == "out\n"
    assert (mine / "results").is_symlink()
    world.assert_clean()
