"""ssh into a node where jobns is enforced (issue 22): pam_slurm_adopt adopts the login
into the user's job, pam_jobns puts it in the job's namespace. On each Slurm release the
rig tests (the `release` fixture: bookworm 22.05, trixie 24.11, forky 26.05;
JOBNS_RIG_RELEASES picks fewer), a node of that release's image, configured as a site
would (tests/e2e/sshnode.py): real sshd, real Slurm with PrologFlags=Contain, the jobns
SPANK plugin, users logging in with keys. The attacks (a forged SLURM_JOB_ID, a namespace
its user owns) are in tests/security/test_pam_attacks.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import Release
from tests.e2e.sshnode import STATE, SshCluster, ssh_cluster
from tests.e2e.test_rig_slurm import mountpoints

pytestmark = pytest.mark.docker
STATE_DIR = "/run/jobns"  # jobns makes it a private bind mount of itself, for good
# Who logs in where a test needs pam_slurm_adopt to adopt into one given job: a user with
# no other job on node1 then (alice's alice_job runs through the module). Among several
# jobs of one user it picks by its own rules, which differ by release: with no cgroup
# plugin (the rig's) 22.05 and 24.11 took the newest job, 26.05 the oldest (seen here).
LONE = "bob"


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release_image: str) -> Iterator[SshCluster]:
    with ssh_cluster(docker_client, release_image) as c:
        before = mountpoints(c.node)
        yield c
        assert leftovers(c, before) == [], "on node1 after every job of the module ended"


@pytest.fixture(scope="module")
def alice_job(cluster: SshCluster) -> Iterator[str]:
    job = cluster.allocate("alice")
    yield job
    cluster.end(job)


def leftovers(cluster: SshCluster, before: dict[str, str]) -> list[str]:
    """What a job may leave on node1 that must be gone once no job runs there: its trees,
    its state, a mount (a namespace pin, a tmpfs of its), a process of a job's user."""
    r = cluster.host(
        f"ls -d /tmp/job-* /var/tmp/job-* /dev/shm/job-* {STATE}/* 2>/dev/null; "
        "pgrep -a -u alice,bob,carol; true"
    )
    found = r.stdout.split("\n")
    found += [
        f"mount {point} ({fstype})"
        for point, fstype in mountpoints(cluster.node).items()
        if fstype == "nsfs" or (point not in before and point != STATE_DIR)
    ]
    return [line for line in found if line.strip()]


def mnt_ns(result_stdout: str) -> str:
    found = re.findall(r"mnt:\[\d+\]", result_stdout)
    assert found, result_stdout
    return str(found[0])


def env_of(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_the_node_runs_the_releases_slurm_and_pam_slurm_adopt(
    cluster: SshCluster, release: Release
) -> None:
    assert cluster.slurm.version().startswith(release.slurm + "."), cluster.slurm.version()
    r = cluster.host("dpkg-query -W -f '${Version} ' libpam-slurm-adopt; pgrep -x sshd")
    assert r.exit_code == 0 and r.stdout.startswith(release.slurm + "."), r


def test_an_ssh_session_lands_in_the_jobs_namespace_with_its_environment(
    cluster: SshCluster, alice_job: str
) -> None:
    step = cluster.step(
        "alice",
        alice_job,
        "echo step > /tmp/from-step; echo shm > /dev/shm/from-step; readlink /proc/self/ns/mnt",
    )
    assert step.exit_code == 0, step
    r = cluster.ssh(
        "alice", "cat /tmp/from-step /dev/shm/from-step; readlink /proc/self/ns/mnt; env"
    )
    assert r.exit_code == 0, r
    assert r.stdout.startswith("step\nshm\n"), r
    assert mnt_ns(r.stdout) == mnt_ns(step.stdout)
    env = env_of(r.stdout)
    assert env["TMPDIR"] == "/tmp" and env["JOBNS_JOB_ID"] == alice_job
    assert env["SLURM_JOB_ID"] == alice_job and env["JOBNS_JOINED"].startswith(f"{alice_job}:")
    # the node's own /tmp and /dev/shm have none of it
    host = cluster.host("ls /tmp/from-step /dev/shm/from-step 2>&1; readlink /proc/self/ns/mnt")
    assert "No such file" in host.stdout and mnt_ns(host.stdout) != mnt_ns(r.stdout)


def test_an_ssh_session_and_an_overlap_step_share_files(
    cluster: SshCluster, alice_job: str
) -> None:
    r = cluster.ssh("alice", "echo ssh > /tmp/from-ssh && echo ssh > /dev/shm/from-ssh")
    assert r.exit_code == 0, r
    step = cluster.step("alice", alice_job, "cat /tmp/from-ssh /dev/shm/from-ssh")
    assert step.exit_code == 0 and step.stdout == "ssh\nssh\n", step


def test_a_user_with_no_job_on_the_node_is_refused(cluster: SshCluster) -> None:
    r = cluster.ssh("bob", "echo in")
    assert r.exit_code == 255 and "in\n" not in r.stdout, r
    assert "you have no active jobs on this node" in r.stderr, r


def test_another_users_job_stays_invisible(cluster: SshCluster, alice_job: str) -> None:
    """bob's own job on the node: his ssh session lands in his job's namespace, not in
    alice's, and neither sees the other's files."""
    mine = cluster.step(
        "alice", alice_job, "echo alice > /tmp/alice-only; readlink /proc/self/ns/mnt"
    )
    assert mine.exit_code == 0, mine
    job = cluster.allocate("bob")
    try:
        r = cluster.ssh(
            "bob", "echo bob > /tmp/bob-only; ls -A /tmp; readlink /proc/self/ns/mnt; env"
        )
        assert r.exit_code == 0, r
        assert env_of(r.stdout)["SLURM_JOB_ID"] == job, r
        assert "alice-only" not in r.stdout and "bob-only" in r.stdout, r
        assert mnt_ns(r.stdout) != mnt_ns(mine.stdout), r
        theirs = cluster.ssh("alice", "ls -A /tmp; readlink /proc/self/ns/mnt")
        assert theirs.exit_code == 0 and mnt_ns(theirs.stdout) == mnt_ns(mine.stdout), theirs
        assert "alice-only" in theirs.stdout and "bob-only" not in theirs.stdout, theirs
    finally:
        cluster.end(job)


def test_a_job_refused_by_setup_refuses_the_login_with_one_line(cluster: SshCluster) -> None:
    job = cluster.allocate(LONE, "--comment=jobns: shm capacity=2gib")  # a bad size
    try:
        r = cluster.ssh(LONE, "echo in")
        assert r.exit_code == 255 and "in\n" not in r.stdout, r
        lines = [ln for ln in r.stderr.splitlines() if "jobns" in ln]
        assert len(lines) == 1, r.stderr
        assert f"job {job} was refused by jobns setup on this node" in lines[0], r.stderr
    finally:
        cluster.end(job)


def test_root_and_the_admin_group_log_in_unjoined(cluster: SshCluster) -> None:
    cluster.host("echo node > /tmp/node-marker").check("marker")
    job = cluster.allocate("carol")  # in jobnsadmin (pam_jobns admin_group=)
    try:
        for user, login in (("carol", ""), ("alice", "root")):
            r = cluster.ssh(user, "cat /tmp/node-marker; env", login=login)
            assert r.exit_code == 0 and r.stdout.startswith("node\n"), (login or user, r)
            assert "JOBNS_JOINED" not in env_of(r.stdout), r
    finally:
        cluster.end(job)


def test_a_session_open_when_the_job_ends_is_ended_and_leaves_nothing(
    cluster: SshCluster,
) -> None:
    job = cluster.allocate(LONE, "--comment=jobns: shm capacity=64MiB")
    log = f"/var/tmp/held-{job}.log"
    cluster.ssh_background(
        LONE,
        "dd if=/dev/zero of=/dev/shm/big bs=1M count=32 2>/dev/null; stat -c %d /dev/shm; "
        "readlink /proc/self/ns/mnt; echo job=$SLURM_JOB_ID; echo ready; exec sleep 600",
        log,
    )
    out = ""
    deadline = time.monotonic() + 60
    while "ready" not in out and time.monotonic() < deadline:
        time.sleep(0.3)
        out = cluster.ctl.exec(["cat", log]).stdout
    assert "ready" in out and f"job={job}\n" in out, out
    dev, ns = int(re.findall(r"^(\d+)$", out, re.M)[0]), mnt_ns(out)
    majmin = f"{dev >> 8 & 0xFFF}:{(dev & 0xFF) | (dev >> 12 & 0xFFF00)}"
    in_ns = "for p in /proc/[0-9]*; do readlink $p/ns/mnt; done 2>/dev/null | grep -cF '{}'"
    assert int(cluster.host(in_ns.format(ns)).stdout) > 0  # the session holds it now

    cluster.end(job)

    deadline = time.monotonic() + 30
    while cluster.ctl.exec(["pgrep", "-u", LONE, "-f", "exec sleep 600"]).exit_code == 0:
        assert time.monotonic() < deadline, "the ssh session outlived its job"
        time.sleep(0.3)
    assert cluster.host(in_ns.format(ns)).stdout.strip() == "0"
    held = cluster.host(f"cat /proc/[0-9]*/mountinfo 2>/dev/null | grep -c ' {majmin} ' || true")
    assert held.stdout.strip() == "0", f"the job's /dev/shm tmpfs {majmin} is still mounted"
    left = cluster.host(f"ls -d /tmp/job-{job} /dev/shm/job-{job} /run/jobns/jobs/{job} 2>&1")
    assert left.stdout.count("No such file") == 3, left


def test_doctor_checks_the_ssh_stack_and_namespace_plugins(cluster: SshCluster) -> None:
    r = cluster.host("jobns doctor")
    assert "ok: /etc/pam.d/sshd: pam_jobns follows pam_slurm_adopt" in r.stdout, r
    # No other namespace plugin; jobns's own (job_container/jobns) is only suggested.
    assert "is configured while jobns enforces" not in r.stdout, r
    assert "note: no JobContainerType=/NamespaceType= of jobns's" in r.stdout, r
    cluster.host("cp /etc/pam.d/sshd /var/tmp/sshd.pam && sed -i '$d' /etc/pam.d/sshd").check(
        "drop pam_jobns's session line"
    )
    try:
        r = cluster.host("jobns doctor")
        assert re.search(
            r"^problem: /etc/pam.d/sshd: .*'session required pam_jobns.so'", r.stdout, re.M
        ), r
        assert r.exit_code == 125
    finally:
        cluster.host("cp /var/tmp/sshd.pam /etc/pam.d/sshd").check("restore /etc/pam.d/sshd")


def test_an_ssh_session_joins_the_jobs_pid_namespace(cluster: SshCluster) -> None:
    """[namespace] pid = true (issue 24): pam_jobns joins the job's PID namespace after its
    mount namespace, so the session sheds its view of the node's processes like a step."""
    from containers.rig import CONFIG_PATH

    show = "readlink /proc/self/ns/pid; tr '\\0' _ < /proc/1/cmdline; echo"
    cluster.host(f"printf '[namespace]\\npid = true\\n' >> {CONFIG_PATH}")
    try:
        job = cluster.allocate(LONE)
        try:
            step = cluster.step(LONE, job, show)
            r = cluster.ssh(LONE, show)
            assert r.exit_code == 0 and step.exit_code == 0, (r, step)
            assert r.stdout.split()[-1] == "jobns-init_infinity_", r
            assert r.stdout.split()[-2:] == step.stdout.split()[-2:], (r, step)
            node = cluster.host("readlink /proc/self/ns/pid").stdout.strip()
            assert r.stdout.split()[-2] != node, r
        finally:
            cluster.end(job)
    finally:
        cluster.host(f"sed -i '/^\\[namespace\\]/,$d' {CONFIG_PATH}")
