"""Attacks on pam_jobns (jobns/slurm/pam/pam_jobns.c) through a real sshd, by ordinary users.

The node (tests/e2e/sshnode.py) is installed from the Debian packages and enforces jobns
through Slurm; sshd stacks pam_slurm_adopt then pam_jobns, and is as permissive as a
site could make it: AcceptEnv passes SLURM_JOB_ID from the client, and Debian's own
/etc/pam.d/sshd reads each user's ~/.pam_environment (pam_env user_readenv=1) in the
session stack, before pam_jobns. bob (the attacker) has a job of his own on the node,
alice (the victim) too; bob tries to get into alice's job's namespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from containers.errors import RigError
from tests.conftest import require
from tests.e2e.sshnode import SshCluster, ssh_cluster

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def cluster() -> Iterator[SshCluster]:
    from containers.dockerapi import connect

    try:
        client: Any = connect()
    except RigError as e:
        require(False, f"the ssh node needs dockerd (ci/start-docker): {e}")
    with ssh_cluster(client) as c:
        yield c


def test_a_user_without_a_job_cannot_forge_his_way_in(cluster: SshCluster) -> None:
    """Runs first: bob has no job on the node yet."""
    job = cluster.allocate("alice")
    try:
        r = cluster.ssh("bob", "echo in", env={"SLURM_JOB_ID": job})
        assert r.exit_code == 255 and "in\n" not in r.stdout, r  # pam_slurm_adopt's no
    finally:
        cluster.end(job)


def test_root_never_joins_a_namespace_its_user_owns(cluster: SshCluster) -> None:
    """Without enforcement a job's namespace belongs to its user's user namespace: she can
    mount over anything there (her own libnss, /etc/passwd), and sshd's monitor is root.
    pam_jobns refuses to take root into it. (Runs before alice's other job exists.)"""
    toml = "/etc/jobns/jobns.toml"
    cluster.host(f"cp {toml} /var/tmp/jobns.toml && printf '' > {toml}").check("enforce off")
    try:
        job = cluster.allocate("alice")
    finally:
        cluster.host(f"cp /var/tmp/jobns.toml {toml}").check("enforce on")
    try:
        # her only job here: pam_slurm_adopt picks among several by its own rules
        mine = cluster.ctl.exec(["squeue", "-h", "-u", "alice", "-o", "%i"]).stdout.split()
        assert mine == [job], mine
        owner = cluster.host(
            f"cat /run/jobns/jobs/{job}/run.env | grep -c '^user_pin=/' || true"
        ).stdout
        assert owner.strip() == "1", "the job did not get a namespace of its user's"
        r = cluster.ssh("alice", "echo in")
        assert r.exit_code == 255 and "in\n" not in r.stdout, r
        assert "belongs to its user, so root will not enter it" in r.stderr, r
    finally:
        cluster.end(job)


@pytest.fixture(scope="module")
def jobs(cluster: SshCluster) -> Iterator[dict[str, str]]:
    """One running job each, and a file in alice's job's /tmp and /dev/shm."""
    found = {user: cluster.allocate(user) for user in ("alice", "bob")}
    secret = cluster.step("alice", found["alice"], "echo s > /tmp/secret; echo s > /dev/shm/secret")
    assert secret.exit_code == 0, secret
    yield found
    for job in found.values():
        cluster.end(job)


def landed_in(r: Any) -> tuple[str, str]:
    """(JOBNS_JOB_ID, what `cat /tmp/secret /dev/shm/secret` said) of a session."""
    job = re.search(r"^JOBNS_JOB_ID=(\S+)$", r.stdout, re.M)
    return (job.group(1) if job else ""), r.stdout


PROBE = "env | grep ^JOBNS_JOB_ID=; cat /tmp/secret /dev/shm/secret 2>&1; true"


def test_a_forged_slurm_job_id_from_the_client_changes_nothing(
    cluster: SshCluster, jobs: dict[str, str]
) -> None:
    r = cluster.ssh("bob", PROBE, env={"SLURM_JOB_ID": jobs["alice"]})
    assert r.exit_code == 0, r
    job, out = landed_in(r)
    assert job == jobs["bob"], r  # his own job, whatever he sent
    assert "s\n" not in out and "No such file" in out, r
    # and the client's value does not even survive into his session's environment
    env = cluster.ssh("bob", "echo $SLURM_JOB_ID", env={"SLURM_JOB_ID": jobs["alice"]})
    assert env.stdout.strip() == jobs["bob"], env


def test_slurm_job_id_in_his_pam_environment_never_picks_the_job(
    cluster: SshCluster, jobs: dict[str, str]
) -> None:
    """pam_env (user_readenv=1, Debian's default for sshd) runs in the session stack
    before pam_jobns and sets bob's ~/.pam_environment variables in the PAM environment,
    where pam_slurm_adopt put SLURM_JOB_ID: pam_jobns joins the job its account function
    checked, never what the session's PAM environment says by then."""
    home = "/home/bob/.pam_environment"
    cluster.node.put_file(home, f"SLURM_JOB_ID OVERRIDE={jobs['alice']}\n")
    cluster.node.exec(["chown", "bob:bob", home]).check("chown")
    try:
        r = cluster.ssh("bob", PROBE)
        assert r.exit_code == 0, r
        job, out = landed_in(r)
        assert job == jobs["bob"] and "s\n" not in out, r
    finally:
        cluster.node.exec(["rm", "-f", home])
