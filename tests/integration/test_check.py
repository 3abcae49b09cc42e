"""`jobns check` as an ordinary user (issue 32): she checks her batch script's and
comment's directives before submitting, with no root and no access to state_dir, and gets
setup's answer: one line of what the job would get (exit 0), or its refusal (exit 125)
with the same message the prolog would record. Nothing is made anywhere."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import JOBNS, OsUser, Sandbox

pytestmark = pytest.mark.root


@pytest.fixture
def alice(sandbox: Sandbox, users: list[OsUser]) -> OsUser:
    sandbox.write_config(extra='[capacity]\nshm_max = "4GiB"\n')
    sandbox.state.chmod(0o700)  # root's alone: a check must not need it
    return users[0]


def test_a_user_checks_her_script_and_comment(sandbox: Sandbox, alice: OsUser) -> None:
    script = sandbox.root / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n"
        '#SBATCH --comment="jobns: shm capacity=2GiB; tmp capacity=1G"\n'
        "srun jobns run -- ./app\n"
    )
    script.chmod(0o644)
    before = sorted(p.name for p in sandbox.state.iterdir())
    r = sandbox.run(["check", "--script", str(script)], user=alice)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == (
        "jobns check: ok (script job.sh, its #SBATCH --comment): local layout (/tmp and "
        "/var/tmp on this node); /dev/shm 2.0 GiB; /tmp and /var/tmp 1.0 GiB\n"
    )
    r = sandbox.run(["check", "--comment", "jobns: shm capacity=8GiB"], user=alice)
    assert r.returncode == 125 and r.stdout == "", r.stdout
    assert r.stderr.startswith("jobns: check: jobns setup would refuse the job: ")
    assert "more than this site allows (shm_max" in r.stderr, r.stderr
    r = sandbox.run(["check", "--comment", " jobns: shm capcity=2GiB"], user=alice)
    assert r.returncode == 125
    assert "--comment item 1: 'shm capcity=2GiB': unknown key 'capcity'" in r.stderr
    # nothing made: no job tree, no record, no mount
    assert [p for p in sandbox.local.iterdir()] == [] and [p for p in sandbox.shm.iterdir()] == []
    assert sorted(p.name for p in sandbox.state.iterdir()) == before


def test_setup_dry_run_stays_roots(sandbox: Sandbox, alice: OsUser) -> None:
    """The prolog's dry run is not the user's tool: it says so, and check is."""
    r = sandbox.run(["setup", "--dry-run", "--job-id", "1"], user=alice)
    assert r.returncode == 125 and "must run as root" in r.stderr
    r = subprocess.run([JOBNS, "--help"], capture_output=True, text=True, check=True)
    assert "  check        check a job's #JOBNS directives before submitting it" in r.stdout
