"""Inside Slurm (issue 31): what Slurm itself does for a job on a node lands in the job's
namespace through jobns's job_container plugin (22.05, 24.11: JobContainerType=
job_container/jobns) or namespace plugin (26.05: NamespaceType=namespace/jobns, which
Slurm runs only with PrologFlags=Contain), beside the SPANK plugin, on every release
the rig runs, two compute nodes, as the ordinary user alice.

Before it (the SPANK plugin alone), `sbcast prog /tmp/prog` wrote the node's own /tmp:
every node's task failed with "/tmp/prog: No such file", and the file stayed on the
node after the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import Release
from containers.rig import Rig
from containers.slurm import WORK, SlurmCluster

pytestmark = pytest.mark.docker

COMPUTES = ("node1", "node2")
ALICE = "alice"


def container_conf(release: Release) -> dict[str, str]:
    """slurm.conf lines that load jobns's plugin of Slurm's own type on this release."""
    if tuple(int(x) for x in release.slurm.split(".")) >= (25, 11):
        return {"NamespaceType": "namespace/jobns", "PrologFlags": "Contain"}
    # Alloc: every node's prolog runs when the job is allocated; without it a node's runs
    # at its first step, after an sbcast to it (which then has no namespace to land in)
    return {"JobContainerType": "job_container/jobns", "PrologFlags": "Alloc"}


@pytest.fixture(scope="module")
def inside(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(
        release_image, hostnames=["ctl", *COMPUTES], client=docker_client, config={"kill_wait": 2}
    ) as rig:
        cluster = SlurmCluster(
            rig, "ctl", COMPUTES, jobns=True, enforce=True, extra=container_conf(release)
        )
        cluster.start()
        yield cluster


def host_leftovers(cluster: SlurmCluster, pattern: str) -> list[str]:
    """What matches pattern in each compute node's own namespace."""
    found = []
    for n in cluster.computes:
        r = n.sh(f"ls -d {pattern} 2>/dev/null; true")
        found += [f"{n.hostname}: {p}" for p in r.stdout.split()]
    return found


def test_the_plugin_is_what_slurmd_loaded(inside: SlurmCluster, release: Release) -> None:
    """The node's slurmd runs with jobns's plugin of Slurm's own type (a plugin it cannot
    load would stop slurmd, and the cluster would not have started)."""
    kind = "namespace" if "NamespaceType" in container_conf(release) else "job_container"
    for n in inside.computes:
        n.exec(["test", "-f", f"/usr/lib/x86_64-linux-gnu/slurm-wlm/{kind}_jobns.so"]).check(
            f"{kind}_jobns.so installed by jobns-slurm"
        )
    r = inside.controller.exec(["scontrol", "show", "config"], timeout=30)
    assert f"{kind}/jobns" in r.stdout, r.stdout[-2000:]


SBCAST_JOB = """\
#!/bin/sh
#SBATCH -N2 --ntasks-per-node=1
printf '#!/bin/sh\\necho ran-from-$(dirname "$0")-on-$(hostname)\\n' > {work}/prog-{tag}
chmod 0755 {work}/prog-{tag}
sbcast {work}/prog-{tag} /tmp/prog-{tag} || exit 3
srun /tmp/prog-{tag}
srun --bcast=/tmp/bc-{tag} {work}/prog-{tag}
"""


def test_sbcast_and_srun_bcast_land_in_the_jobs_tmp(inside: SlurmCluster) -> None:
    """sbcast and `srun --bcast` of a program to /tmp: every node's task runs it from the
    job's /tmp, and nothing of it is on any node afterwards."""
    tag = f"t{id(inside) % 100000}"
    job_id = inside.sbatch(ALICE, SBCAST_JOB.format(work=WORK, tag=tag), "-N2")
    out = inside.output(job_id).split()
    for node in COMPUTES:
        assert f"ran-from-/tmp-on-{node}" in out, out
    assert out.count(f"ran-from-/tmp-on-{COMPUTES[0]}") == 2, out  # sbcast, then --bcast
    assert host_leftovers(inside, f"/tmp/prog-{tag} /tmp/bc-{tag}") == []


REFUSED_JOB = """\
#!/bin/sh
echo never-ran
"""


def test_a_refused_job_fails_with_its_reason_and_no_node_drains(inside: SlurmCluster) -> None:
    """A job jobns refused (a bad directive) fails with the reason in its output; the
    plugin lets the step's launch go on (Slurm would requeue a job whose launch failed),
    the SPANK plugin fails its task with the reason, and no node drains."""
    job_id = inside.sbatch(
        ALICE, REFUSED_JOB, "-N1", "--comment=jobns: shm capacity=2gib", wait=False
    )
    state, _ = inside.wait_done(job_id)
    out = inside.output(job_id)
    assert state == "FAILED" and "was refused by jobns setup" in out, (state, out)
    assert "never-ran" not in out, out
    assert inside.unusable() == {}
