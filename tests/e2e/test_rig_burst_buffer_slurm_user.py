"""The burst buffer where SlurmUser is not root, as most sites run slurmctld: Slurm's
burst_buffer/lua runs jobns's burst_buffer.lua in slurmscriptd as SlurmUser (slurm
here), which calls `sudo -n /usr/bin/jobns bb ...`, allowed by exactly the sudoers line
docs/admin.md "The burst buffer" gives. On every release the rig runs.

What is proved:
- a job's stage-in and stage-out go through sudo: the data arrives, as alice's, and the
  buffer is gone after the job;
- without the sudoers line a burst-buffer job is held with sudo's own one line as its
  reason (the node is untouched, other jobs run); with it back, `scontrol release` runs it;
- `jobns doctor` on the controller says sudo lets SlurmUser run jobns bb, or names the
  sudoers line when it does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import Release
from containers.rig import Rig
from containers.slurm import SlurmCluster
from tests.e2e.rig.burst_buffer import (
    ALICE,
    DATA,
    bb_state,
    deployed,
    doctor_lines,
    field,
    gone,
    put_input,
    show,
    submit,
    wait_for,
)

pytestmark = pytest.mark.docker

SUDOERS = "/etc/sudoers.d/jobns-bb"
SUDOERS_LINE = "slurm ALL=(root) NOPASSWD: /usr/bin/jobns bb *\n"


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(release_image, hostnames=["ctl", "node1"], client=docker_client) as rig:
        slurm_user = {
            "SlurmUser": "slurm",
            # slurmctld writes its pid file and logs as SlurmUser
            "SlurmctldPidFile": "/run/slurmctld/slurmctld.pid",
            "SlurmctldLogFile": "/var/log/slurmctld/slurmctld.log",
        }
        c = deployed(rig, ["node1"], slurm_user, before=slurm_users_directories)
        allow(c)
        c.start()
        ctl = c.controller
        r = ctl.sh("ps -o user= -C slurmctld; ps -o user= -C slurmscriptd; true")
        assert set(r.stdout.split()) == {"slurm"}, r.stdout  # not root: sudo is needed
        yield c


def slurm_users_directories(cluster: SlurmCluster) -> None:
    cluster.controller.sh(
        "install -d -o slurm -g slurm /var/spool/slurmctld /run/slurmctld /var/log/slurmctld"
    ).check("SlurmUser's directories")


def allow(cluster: SlurmCluster) -> None:
    cluster.controller.put_file(SUDOERS, SUDOERS_LINE)
    cluster.controller.exec(["chmod", "0440", SUDOERS]).check("sudoers mode")


def test_stage_in_and_out_through_sudo(cluster: SlurmCluster) -> None:
    src = put_input(cluster, "sudo-in", "staged through sudo\n")
    job_id = submit(
        cluster,
        "#!/bin/sh\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_in source={src} destination=/tmp/in\n"
        f"#JOBNS stage_out source=/tmp/out destination={DATA}/sudo-out-%j\n"
        "srun jobns run -- sh -c 'cat /tmp/in/f && mkdir /tmp/out && echo r >/tmp/out/r'\n",
    )
    assert cluster.wait_done(job_id, 180) == ("COMPLETED", "0:0"), cluster.logs(60)
    assert cluster.output(job_id) == "staged through sudo\n"
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    r = cluster.controller.exec(["stat", "-c", "%U %n", f"{DATA}/sudo-out-{job_id}/r"])
    assert r.check("the output").stdout.split()[0] == ALICE
    gone(cluster, job_id)


def test_doctor_says_sudo_lets_slurm_user_run_jobns_bb(cluster: SlurmCluster) -> None:
    lines = doctor_lines(cluster.controller)
    print("--- jobns doctor on the controller\n" + "\n".join(lines))
    assert "ok: burst buffer: sudo lets SlurmUser slurm run /usr/bin/jobns bb" in lines, lines
    assert not [line for line in lines if not line.startswith("ok: ")], lines


def test_without_the_sudoers_line_the_job_is_held_with_sudos_reason(
    cluster: SlurmCluster,
) -> None:
    ctl = cluster.controller
    ctl.exec(["rm", "-f", SUDOERS]).check("remove the sudoers line")
    try:
        problems = [
            line for line in doctor_lines(cluster.controller) if line.startswith("problem: ")
        ]
        assert len(problems) == 1 and SUDOERS_LINE.strip() in problems[0], problems
        job_id = submit(
            cluster, "#!/bin/sh\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\necho ran\n"
        )
        wait_for(
            "the job to be held with sudo's message",
            lambda: "password" in show(cluster, "job", job_id),
            cluster,
            120,
        )
        job = show(cluster, "job", job_id)
        print(f"--- held without the sudoers line\n{job}")
        assert field(job, "JobState") == "PENDING" and field(job, "Priority") == "0", job
        assert cluster.output(cluster.sbatch(ALICE, "#!/bin/sh\necho fine\n")) == "fine\n"
    finally:
        allow(cluster)
    ctl.exec(["scontrol", "release", job_id]).check("release the job")
    assert cluster.wait_done(job_id, 240) == ("COMPLETED", "0:0"), cluster.logs(60)
    assert cluster.output(job_id) == "ran\n"
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    gone(cluster, job_id)
