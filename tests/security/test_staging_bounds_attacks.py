"""Attacks on what staging reports (issue 20): the stage-out worker runs as the job user,
and the errors it reports are copied into the job's record in state_dir (/run: memory
of the node), printed by the epilog and logged. Their number, length and content are
hers to choose: thousands of files that fail to copy, a path 40 KB long (a walk by fds
has no PATH_MAX), names with a newline or an escape sequence. Defence: the errors kept
are bounded in number, length and total (one more line says how many were dropped),
each one printable line; her outputs are still kept for the next teardown."""

from __future__ import annotations

import json
import os

import pytest

from tests.security.conftest import World, no_crash

pytestmark = pytest.mark.root

# argv: TOP N DEPTH file|dir: under TOP, N entries with 206-character names, two with a
# newline and an escape sequence in their names, and a chain of DEPTH directories of
# 250-character names ending in "leaf" (these three first in sorted order); each entry a
# file, or (dir) a directory: at a stage-out destination, a directory where the job has
# a file makes that copy fail.
MAKE = r"""
import os, sys
top, n, depth, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def make(name, dir_fd):
    if kind == "dir":
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    else:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd))
os.makedirs(top, exist_ok=True)
fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
for i in range(n):
    make(f"{i:05d}-" + "n" * 200, fd)
make("!evil\njobns: forged line", fd)
make("!esc\x1b[2J", fd)
for _ in range(depth):
    try:
        os.mkdir("!" + "d" * 249, dir_fd=fd)
    except FileExistsError:
        pass
    sub = os.open("!" + "d" * 249, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = sub
make("leaf", fd)
print("made")
"""
FILES = 3000
DEPTH = 160
MAX_LINES = 50  # launcher.staging.transfer.MAX_LINES
MAX_LINE = 2500  # launcher.staging.transfer.MAX_LINE
RECORD_LIMIT = 128 * 1024


def test_thousands_of_huge_stage_out_errors_keep_the_record_small(world: World) -> None:
    """Attack: alice's job writes 3000 outputs and a 40 KB deep path into a stage_out
    directory, and before the epilog puts a directory at each of their names in the
    destination (hers), so every copy fails. Defence: teardown exits 0 (her job's
    problem), the record stays small and lists at most 50 one-line errors of bounded
    length plus how many more there were; her outputs are kept; --hurry then clears."""
    stage = world.box.root / "stage"
    mine = stage / world.alice.name
    mine.mkdir(parents=True)
    stage.chmod(0o755)
    os.chown(mine, world.alice.uid, world.alice.gid)
    world.box.write_config(f'[staging]\nstage_roots = ["{stage}"]\n')
    make = world.w / "make.py"
    make.write_text(MAKE)
    make.chmod(0o644)
    dest = mine / "out"
    r = world.setup("91", "--directives", f"stage_out source=/tmp/out destination={dest}")
    assert r.returncode == 0, r.stderr
    cmd = f"/usr/bin/python3 {make} /tmp/out {FILES} {DEPTH} file"
    r = world.run("91", cmd, user=world.alice, timeout=120)
    assert r.returncode == 0 and "made" in r.stdout, r.stderr
    r = world.python(world.alice, MAKE, str(dest), str(FILES), str(DEPTH), "dir", timeout=120)
    assert r.returncode == 0, r.stderr

    r = world.teardown("91", timeout=300)
    no_crash(r)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stderr) < RECORD_LIMIT, len(r.stderr)
    for line in r.stderr.splitlines():
        assert line.startswith("jobns: ") and line.isprintable(), line[:200]
    record = world.box.state / "jobs" / "91" / "state.json"
    assert record.stat().st_size < RECORD_LIMIT, record.stat().st_size
    errors = json.loads(record.read_text())["errors"]
    assert len(errors) <= MAX_LINES + 1, len(errors)
    assert all(len(e) <= MAX_LINE and e.isprintable() for e in errors)
    assert "more errors not listed" in errors[-1], errors[-1]
    assert any("characters cut" in e and "/leaf" in e for e in errors), errors[:3]
    assert any("!evil\\njobns: forged line" in e for e in errors), errors[:3]
    assert any("!esc\\x1b[2J" in e for e in errors), errors[:3]
    dropped = int(errors[-1].split()[2])
    assert dropped + len(errors) - 1 >= FILES + 3  # every failure is counted
    (job,) = [j for j in world.status()["jobs"] if j["job_id"] == "91"]
    assert job["state"] == "staging-out", job

    # Her outputs were kept in the job's tree; the next teardown may drop them.
    kept = world.box.local / "job-91" / "tmp" / "out"
    assert len(os.listdir(kept)) == FILES + 3
    r = world.teardown("91", "--hurry", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    world.assert_clean()
