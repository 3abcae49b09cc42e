"""[[dirs]] paths with the job's symbols (%j the job id, %u the user name) for real: a
set-up job and a standalone run of an ordinary user see their directories at the
expanded paths; a missing expanded mount point refuses only that job."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, assert_refused, job_mounts

pytestmark = pytest.mark.root


class Site:
    """Two entries: <root>/mnt/users/%u (base xu) and <root>/mnt/jobs/job_%j (base xj);
    the shared parts root's 0755, the per-user and per-job mount points made by the test
    (as a site would: with the account, before the prolog)."""

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        self.users = box.root / "mnt" / "users"
        self.jobs = box.root / "mnt" / "jobs"
        self.bases = (box.root / "xu", box.root / "xj")
        for d in (self.users, self.jobs, *self.bases):
            d.mkdir(parents=True, mode=0o755)
        box.write_config(
            f'[[dirs]]\npath = "{self.users}/%u"\nbase = "{self.bases[0]}"\n'
            f'[[dirs]]\npath = "{self.jobs}/job_%j"\nbase = "{self.bases[1]}"\n'
        )

    def points(self, user: OsUser, job: str) -> tuple[Path, Path]:
        """The job's mount points, made like a site would."""
        mine, its = self.users / user.name, self.jobs / f"job_{job}"
        for d in (mine, its):
            d.mkdir(exist_ok=True)
        return mine, its

    def left(self) -> list[str]:
        self.box.wait_released()
        out = [str(p) for b in self.bases for p in b.iterdir()]
        out += [str(p) for d in (self.users, self.jobs) for p in d.glob("*/*")]
        return out + self.box.leftovers() + job_mounts(self.box)


@pytest.fixture
def site(sandbox: Sandbox) -> Site:
    return Site(sandbox)


def test_a_set_up_job_sees_its_directories_at_the_expanded_paths(
    site: Site, users: list[OsUser]
) -> None:
    alice = users[0]
    box = site.box
    mine, its = site.points(alice, "sy1")
    r = box.run(["setup", "--job-id", "sy1", "--user", alice.name])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = box.run(
        ["run", "--job-id", "sy1", "--", "sh", "-c", f"echo u > {mine}/f; echo j > {its}/f"],
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    # The job's own trees got the files; the host's mount points stay empty.
    assert (site.bases[0] / "job-sy1" / "f").read_text() == "u\n"
    assert (site.bases[1] / "job-sy1" / "f").read_text() == "j\n"
    assert list(mine.iterdir()) == [] and list(its.iterdir()) == []
    # The record keeps the expanded paths.
    status = box.run(["status", "--json"])
    assert str(its) in status.stdout and "job_%j" not in status.stdout, status.stdout
    r = box.run(["teardown", "--job-id", "sy1"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert site.left() == []


def test_a_missing_expanded_mount_point_refuses_only_that_job(
    site: Site, users: list[OsUser]
) -> None:
    alice = users[0]
    site.points(alice, "other")  # hers exists, this job's does not
    r = site.box.run(["setup", "--job-id", "sy2", "--user", alice.name])
    assert_refused(site.box, "sy2", alice, r, f"{site.jobs}/job_sy2: No such file or directory")
    assert "an administrator must create it" in r.stderr
    assert site.left() == []


def test_an_ordinary_users_standalone_run_binds_the_expanded_paths(
    site: Site, users: list[OsUser]
) -> None:
    alice = users[0]
    box = site.box
    for b in site.bases:
        b.chmod(0o1777)  # like /tmp: she makes her own trees there
    mine, its = site.points(alice, "sy3")
    script = f"echo u > {mine}/f && echo j > {its}/f && cat /proc/self/mountinfo"
    r = box.run(["run", "--job-id", "sy3", "--", "sh", "-c", script], user=alice)
    assert r.returncode == 0, r.stderr
    points = {ln.split()[4]: ln.split()[3] for ln in r.stdout.splitlines()}
    assert points[str(mine)] == f"{site.bases[0]}/job-sy3"
    assert points[str(its)] == f"{site.bases[1]}/job-sy3"
    assert list(mine.iterdir()) == [] and list(its.iterdir()) == []
    # A no-flag run: its made-up id has no mount point: that entry is left out, said once.
    r = box.run(["run", "--", "sh", "-c", f"echo u > {mine}/f; echo $JOBNS_JOB_ID"], user=alice)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split()[-1]
    assert r.stderr == (
        f"jobns: warning: {site.jobs}/job_{job_id} is not private in this task: it does "
        "not exist (its [[dirs]] path names the job or its user)\n"
    )
    assert list(mine.iterdir()) == []
    assert site.left() == []


def test_doctor_checks_the_shared_part_and_names_a_bad_symbol(site: Site) -> None:
    box = site.box
    r = box.run(["doctor", "--slurm-conf", "/nonexistent"])
    assert f"ok: [[dirs]] path {site.users}/%u (under {site.users}): a directory" in r.stdout, (
        r.stdout
    )
    assert f"note: [[dirs]] path {site.jobs}/job_%j names the job or its user" in r.stdout
    box.write_config(f'[[dirs]]\npath = "{site.users}/%x"\nbase = "{site.bases[0]}"\n')
    for verb in (["doctor", "--slurm-conf", "/nonexistent"], ["run", "--", "true"]):
        r = box.run(verb)
        assert r.returncode == 125, (verb, r.stdout, r.stderr)
        out = r.stdout + r.stderr
        assert f"[[dirs]] path = '{site.users}/%x': unknown symbol '%x'" in out, out


def test_root_standalone_run_gets_them_too(site: Site, users: list[OsUser]) -> None:
    alice = users[0]
    _, its = site.points(alice, "sy4")
    r = site.box.run(
        ["run", "--job-id", "sy4", "--user", alice.name, "--", "sh", "-c", f"touch {its}/x"],
    )
    assert r.returncode == 0, r.stderr
    assert not (its / "x").exists()
    assert site.left() == []
