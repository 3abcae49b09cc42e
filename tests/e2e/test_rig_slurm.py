"""A Slurm 22.05 cluster in the rig (controller ctl, computes node1 and node2).

Here jobns is only the task wrapper (`srun jobns run -- ...`), run by alice's own
tasks: the unprivileged mode. Prolog/epilog integration (`jobns setup/teardown`)
is a follow-up on top of this fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from containers.rig import Rig
from containers.slurm import SlurmCluster, render_conf

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def slurm(docker_client: Any, rig_image: str) -> Iterator[SlurmCluster]:
    with Rig(rig_image, hostnames=["ctl", "node1", "node2"], client=docker_client) as rig:
        cluster = SlurmCluster(rig, "ctl", ["node1", "node2"])
        cluster.start()
        yield cluster


def test_render_conf_lists_controller_nodes_and_extra() -> None:
    conf = render_conf("ctl", ["node1", "node2"], extra={"PrologFlags": "Alloc"})
    assert "SlurmctldHost=ctl\n" in conf
    assert "NodeName=node1 NodeHostname=node1 " in conf and "NodeName=node2 " in conf
    assert "PartitionName=rig Nodes=node1,node2 Default=YES" in conf
    assert "PrologFlags=Alloc\n" in conf


def test_srun_runs_on_both_nodes_as_alice(slurm: SlurmCluster) -> None:
    r = slurm.controller.exec(["su", "alice", "-c", "srun -N2 sh -c 'echo $(id -u) $(hostname)'"])
    assert sorted(r.check("srun as alice").stdout.splitlines()) == ["1001 node1", "1001 node2"]


def test_srun_jobns_per_node_uses_the_slurm_job_id(slurm: SlurmCluster) -> None:
    script = ('touch /tmp/from-$(hostname) && '
              'test -e /lustre/jobns/job-$SLURM_JOB_ID/$(hostname)/tmp/from-$(hostname) && '
              'echo $SLURM_JOB_ID')
    cmd = f"srun -N2 jobns run --use-shared-tmpdir=per-node -- sh -c '{script}'"
    r = slurm.controller.exec(["su", "alice", "-c", cmd]).check("srun jobns run")
    ids = set(r.stdout.split())
    assert len(ids) == 1, r.stdout
    job_id = ids.pop()
    left = slurm.controller.exec(["ls", "-A", "/lustre/jobns"]).check("ls").stdout.split()
    assert [n for n in left if f"job-{job_id}" in n] == []
