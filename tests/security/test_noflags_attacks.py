"""Attacks on a no-flag `jobns run -- CMD` (a job of one command, id run-PID-HEX): bob
learns alice's made-up id (it is the name of her trees in the world-readable bases) and
tries to join or collide with her job by passing it as his own id."""

from __future__ import annotations

import re

import pytest

from tests.security.conftest import World, no_crash, one_line

pytestmark = pytest.mark.root

SECRET = "secret-of-alices-no-flag-run"
READ = "cat /tmp/s /var/tmp/s /dev/shm/s 2>&1; echo planted > /tmp/bobs"


def test_bob_cannot_join_or_collide_with_alices_no_flag_run(world: World) -> None:
    box, alice, bob = world.box, world.alice, world.bob
    pidfile = world.w / "alice.pid"
    world.start_jobns(
        [
            "run",
            "--",
            "sh",
            "-c",
            f"for d in /tmp /var/tmp /dev/shm; do echo {SECRET} > $d/s; done; "
            f"echo $$ > {pidfile}; exec sleep 300",
        ],
        user=alice,
    )
    world.track(int(world.wait_file(pidfile)))
    # What bob sees: her trees in the bases, named after her job's id.
    listing = world.as_user(bob, ["ls", str(box.local), str(box.shm)])
    found = sorted(set(re.findall(r"job-(run-[0-9]+-[0-9a-f]{12})", listing.stdout)))
    assert len(found) == 1, listing
    her_id = found[0]
    before = sorted(str(p) for p in box.local.rglob("*")) + sorted(
        str(p) for p in box.shm.rglob("*")
    )
    # Her id as his --job-id, or as his SLURM_JOB_ID: refused, nothing read or written.
    ways: list[tuple[list[str], dict[str, str] | None]] = [
        (["--job-id", her_id], None),
        ([], {"SLURM_JOB_ID": her_id}),
    ]
    for args, env in ways:
        r = box.run(["run", *args, "--", "sh", "-c", READ], user=bob, env=env)
        assert r.returncode == 125, (args, env, r.stdout, r.stderr)
        one_line(r)
        assert SECRET not in r.stdout + r.stderr
        assert her_id in r.stderr, r.stderr
    # His own no-flag run is a job of its own: another id, none of her files.
    r = box.run(["run", "--", "sh", "-c", f"echo $JOBNS_JOB_ID; {READ}"], user=bob)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] != her_id and SECRET not in r.stdout
    after = sorted(str(p) for p in box.local.rglob("*")) + sorted(
        str(p) for p in box.shm.rglob("*")
    )
    assert after == before  # nothing of his in or beside her trees, hers untouched
    tree = box.local / f"job-{her_id}"
    assert (tree / "tmp/s").read_text() == f"{SECRET}\n"
    assert not (tree / "tmp/bobs").exists()
    # Her job ends as usual: nothing of either run is left.
    for p in world.procs:
        p.terminate()
        p.wait(timeout=60)
    world.assert_clean()
