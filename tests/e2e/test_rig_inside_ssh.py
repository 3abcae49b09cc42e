"""ssh into a job through Slurm's own request (issue 31, item 4): with jobns's
job_container plugin (22.05, 24.11) or namespace plugin (26.05) configured,
pam_slurm_adopt asks the job's extern step for the namespace to join (join_external)
and the plugin hands it the job's pinned mount namespace, checked as the SPANK plugin
checks it. Here sshd's PAM stack has pam_slurm_adopt alone, no pam_jobns: the login
lands in the job's /tmp through Slurm's code. (pam_jobns beside it adds the job's
variables and, for a job with a PID namespace, joins it whole: tests/e2e/test_ssh.py.)
A job jobns refused hands no namespace: pam_slurm_adopt's adoption fails, and its
action_adopt_failure= decides (Slurm's default lets the login in, in the node's
namespace; pam_jobns refuses it: docs/admin.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import Release
from tests.e2e.sshnode import SshCluster, ssh_cluster
from tests.e2e.test_rig_inside_slurm import container_conf
from tests.e2e.test_ssh import mnt_ns

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release: Release, release_image: str) -> Iterator[SshCluster]:
    plugin = {k: v for k, v in container_conf(release).items() if k != "PrologFlags"}
    with ssh_cluster(docker_client, release_image, extra=plugin, pam_jobns=False) as c:
        yield c


def test_pam_slurm_adopt_puts_the_login_in_the_jobs_namespace(cluster: SshCluster) -> None:
    """alice's step leaves a file in the job's /tmp; her ssh login, adopted by
    pam_slurm_adopt alone, reads it from the same mount namespace; the node's own /tmp
    has none of it."""
    job = cluster.allocate("alice")
    try:
        step = cluster.step("alice", job, "echo step > /tmp/from-step; readlink /proc/self/ns/mnt")
        assert step.exit_code == 0, step
        r = cluster.ssh("alice", "cat /tmp/from-step; readlink /proc/self/ns/mnt")
        assert r.exit_code == 0 and r.stdout.startswith("step\n"), r
        assert mnt_ns(r.stdout) == mnt_ns(step.stdout)
        host = cluster.host("ls /tmp/from-step 2>&1; readlink /proc/self/ns/mnt")
        assert "No such file" in host.stdout and mnt_ns(host.stdout) != mnt_ns(r.stdout)
    finally:
        cluster.end(job)
