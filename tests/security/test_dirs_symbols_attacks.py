"""Attacks through the job's symbols in a [[dirs]] path (%j, %u): bob steers the job id
of his own standalone runs (--job-id, SLURM_JOB_ID are his to set there) to move the
expanded path out of its one component, and plants a link where alice's expanded mount
point will be. An id or a name is only ever one safe component under the part every job
shares; nothing is bound through a link; only the job is refused."""

from __future__ import annotations

import pytest

from tests.conftest import job_mounts
from tests.security.conftest import World, mounts, no_crash, one_line, refused, snapshot

pytestmark = pytest.mark.root

HOSTILE = ["..", ".", "../../etc", "a/b", "%u", "job/../..", "", "x" * 129, "a\nb"]


class Site:
    """<root>/mnt/users/%u and <root>/mnt/jobs/job_%j, bases sticky and world-writable
    (like /tmp: standalone users make their trees there); mnt/users/ with the given mode."""

    def __init__(self, world: World, users_mode: int = 0o755) -> None:
        root = world.box.root
        self.world = world
        self.users, self.jobs = root / "mnt" / "users", root / "mnt" / "jobs"
        self.bases = [root / "xu", root / "xj"]
        for d in (self.users, self.jobs, *self.bases):
            d.mkdir(parents=True)
        self.users.chmod(users_mode)
        for b in self.bases:
            b.chmod(0o1777)
        world.box.write_config(
            f'[[dirs]]\npath = "{self.users}/%u"\nbase = "{self.bases[0]}"\n'
            f'[[dirs]]\npath = "{self.jobs}/job_%j"\nbase = "{self.bases[1]}"\n'
        )

    def left(self) -> list[str]:
        self.world.box.wait_released()
        return [str(p) for b in self.bases for p in b.iterdir()] + job_mounts(self.world.box)


def test_bobs_job_id_never_moves_the_expanded_path(world: World) -> None:
    """Attack: bob's standalone run names a job id meant to climb out of job_%j, or to
    add components ('..', 'a/b', '%u' for a second expansion, a newline). Defence: the
    id is one safe component before it is ever expanded: each run is refused in one
    line, nothing is made or mounted anywhere. A plain id binds exactly
    <mnt>/jobs/job_<id>, nothing above or beside it."""
    bob, box = world.bob, world.box
    site = Site(world)
    before = snapshot(box.root)
    mounts_before = job_mounts(box)
    for job_id in HOSTILE:
        for args, env in ((["--job-id", job_id], None), ([], {"SLURM_JOB_ID": job_id})):
            r = box.run(["run", *args, "--", "true"], user=bob, env=env)
            assert r.returncode == 125, (job_id, r.stdout, r.stderr)
            one_line(r)
            assert "job id" in r.stderr, r.stderr
    assert snapshot(box.root) == before
    assert job_mounts(box) == mounts_before
    # A plain id: bound at the one place its expansion names, in his own namespace only.
    (site.users / bob.name).mkdir()
    (site.jobs / "job_etc").mkdir()
    r = box.run(["run", "--job-id", "etc", "--", "sh", "-c", "cat /proc/self/mountinfo"], user=bob)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    points = {ln.split()[4]: ln.split()[3] for ln in r.stdout.splitlines()}
    assert points[f"{site.jobs}/job_etc"] == f"{site.bases[1]}/job-etc"
    assert points[f"{site.users}/{bob.name}"] == f"{site.bases[0]}/job-etc"
    assert not any(p.startswith("/etc") for p in points), points
    assert site.left() == []


def test_a_link_bob_plants_at_alices_expanded_path_is_never_bound_through(
    world: World,
) -> None:
    """Attack: mnt/users/ is sticky and world-writable (a misconfiguration jobns doctor
    reports); before alice's job bob creates mnt/users/jobnsalice as a link to a root
    directory (a decoy for /etc), so that %u would put her tree over it. Defence: setup
    never binds through a link: her job is refused naming bob's uid (setup exits 0: the
    node stays up), the decoy is untouched, teardown leaves nothing."""
    alice, bob = world.alice, world.bob
    site = Site(world, users_mode=0o1777)
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    (site.jobs / "job_64").mkdir()
    r = world.as_user(bob, ["ln", "-s", str(decoy), str(site.users / alice.name)])
    assert r.returncode == 0, r.stderr
    r = world.setup("64")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert f"belongs to uid {bob.uid}, not root" in r.stderr and "refused" in r.stderr, r.stderr
    assert [t for t, _, _ in mounts() if t.startswith(str(decoy))] == []
    refused(world.run("64", "true", user=alice))
    assert world.teardown("64").returncode == 0
    assert snapshot(decoy) == decoy_before
    assert site.left() == []
