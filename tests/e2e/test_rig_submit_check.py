"""Checked at submission (issue 34, first part): a job whose #JOBNS lines are wrong is
refused by sbatch, with jobns's one-line message naming the line, before it waits in the
queue; on every release the rig runs, as the ordinary user alice.

Two ways, as docs/admin.md "Checked at submission" deploys them:
  burst_buffer/lua   jobns's burst_buffer.lua (BurstBufferType=burst_buffer/lua): a job
                     that asks for the burst buffer (#BB_LUA) is checked by
                     slurm_bb_job_process;
  job_submit/lua     the snippet a site's job_submit.lua calls (JobSubmitPlugins=lua):
                     every batch job, also on a cluster with another burst-buffer plugin.
The message is what `jobns check` (the prolog's own parser) says about the same script.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import Release
from containers.rig import Rig
from containers.slurm import CONF, WORK, SlurmCluster

pytestmark = pytest.mark.docker

ALICE = "alice"
LUA = "/usr/share/jobns/slurm/lua"  # where the jobns package installs them
JOB_SUBMIT = """\
local jobns = dofile("/usr/share/jobns/slurm/lua/job_submit_jobns.lua")
function slurm_job_submit(job_desc, part_list, submit_uid)
    return jobns.job_submit(job_desc)
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end
"""
BAD_CAPACITY = "#!/bin/sh\n{bb}#JOBNS tmp capacity=2 GiB\necho never\n"
BAD_VERB = "#!/bin/sh\n#SBATCH -J bad\n{bb}#JOBNS tmpp capacity=1G\necho never\n"
GOOD = "#!/bin/sh\n{bb}#JOBNS shm capacity=8MiB\necho ran\n"


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(release_image, hostnames=["ctl", "node1"], client=docker_client) as rig:
        c = SlurmCluster(
            rig, "ctl", ["node1"], jobns=True, extra={"BurstBufferType": "burst_buffer/lua"}
        )
        c.configure()
        # As an administrator installs it: beside slurm.conf, from the package.
        c.controller.exec(["cp", f"{LUA}/burst_buffer.lua", "/etc/slurm/burst_buffer.lua"]).check(
            "install burst_buffer.lua"
        )
        c.start()
        yield c


def submit(cluster: SlurmCluster, script: str) -> tuple[int, str, str]:
    """sbatch `script` as alice; (exit status, stdout, stderr)."""
    path = f"{WORK}/submit-{time.monotonic_ns()}.sh"
    cluster.controller.put_file(path, script, mode=0o755)
    r = cluster.controller.exec(
        ["sbatch", "--parsable", f"--chdir={WORK}", f"--output={WORK}/slurm-%j.out", path],
        user=ALICE,
        timeout=30,
    )
    return r.exit_code, r.stdout, r.stderr


def jobns_says(cluster: SlurmCluster, script: str = "", comment: str = "") -> str:
    """What the prolog's parser (`jobns check`, on the node) says about the script or
    the job comment."""
    if comment:
        argv = ["jobns", "check", "--comment", comment]
    else:
        argv = ["jobns", "check", "--script", f"{WORK}/check-{time.monotonic_ns()}.sh"]
        cluster.controller.put_file(argv[-1], script, mode=0o644)
    r = cluster.computes[0].exec(argv, user=ALICE, timeout=30)
    assert r.exit_code == 125, r.stdout + r.stderr
    prefix = "jobns: check: jobns setup would refuse the job: "
    assert r.stderr.startswith(prefix) and r.stderr.count("\n") == 1, r.stderr
    return r.stderr[len(prefix) :].strip()


@pytest.mark.parametrize("template", [BAD_CAPACITY, BAD_VERB])
def test_the_burst_buffer_refuses_a_bad_directive_at_sbatch(
    cluster: SlurmCluster, template: str
) -> None:
    script = template.format(bb="#BB_LUA\n")
    code, out, err = submit(cluster, script)
    assert code != 0 and not out.strip(), (out, err)
    assert f"burst_buffer/lua: jobns: {jobns_says(cluster, script)}\n" in err, err
    assert "Burst Buffer request invalid" in err, err


def test_the_burst_buffer_checks_the_comment_from_24_11(
    cluster: SlurmCluster, release: Release
) -> None:
    """24.11 and later hand slurm_bb_job_process the job's record (job_info), comment
    included; 22.05 gives it only the script, so there the job_submit.lua snippet (below)
    is what checks the comment."""
    comment = "jobns: tmpp capacity=1G"
    script = f"#!/bin/sh\n#SBATCH --comment='{comment}'\n#BB_LUA\ntrue\n"
    code, out, err = submit(cluster, script)
    if tuple(int(x) for x in release.slurm.split(".")[:2]) >= (24, 11):
        says = jobns_says(cluster, comment=comment)
        assert code != 0 and f"burst_buffer/lua: jobns: {says}\n" in err, err
    else:
        assert code == 0 and out.strip().isdigit(), (out, err)
        cluster.wait_done(out.strip())


def test_a_good_burst_buffer_job_runs_and_its_buffer_completes(cluster: SlurmCluster) -> None:
    job_id = cluster.sbatch(ALICE, GOOD.format(bb="#BB_LUA\n"))
    assert cluster.output(job_id).split() == ["ran"]
    r = cluster.controller.exec(["scontrol", "show", "job", job_id], timeout=30).check("show job")
    assert "BurstBufferState=complete" in r.stdout, r.stdout
    burst = cluster.controller.exec(["scontrol", "show", "burst"], timeout=30).check("show burst")
    assert "Name=lua" in burst.stdout, burst.stdout
    status = cluster.controller.exec(["scontrol", "show", "bbstat"], user=ALICE, timeout=30)
    # [burst_buffer] is not enabled here: the check at submission only.
    assert "directives are checked at submission; [burst_buffer] enabled is not set" in (
        status.stdout
    ), status


def test_job_submit_lua_refuses_a_bad_directive_of_any_batch_job(
    cluster: SlurmCluster,
) -> None:
    """The snippet for every cluster (this one also keeps burst_buffer/lua: the snippet,
    which slurmctld runs first, refuses with its own words)."""
    ctl = cluster.controller
    ctl.put_file("/etc/slurm/job_submit.lua", JOB_SUBMIT)
    ctl.sh(f"grep -q ^JobSubmitPlugins= {CONF} || echo JobSubmitPlugins=lua >> {CONF}").check(
        "JobSubmitPlugins=lua"
    )
    restart_controller(cluster)
    for template in (BAD_CAPACITY, BAD_VERB):
        script = template.format(bb="")
        code, out, err = submit(cluster, script)
        assert code != 0 and not out.strip(), (out, err)
        assert f"sbatch: error: jobns: {jobns_says(cluster, script)}\n" in err, err
    job_id = cluster.sbatch(ALICE, GOOD.format(bb=""))
    assert cluster.output(job_id).split() == ["ran"]
    # The comment is what the prolog applies: refused at submission from every command.
    comment = "jobns: shm capacity=2 GiB"
    says = jobns_says(cluster, comment=comment)
    for argv in (["srun", "-N1", "true"], ["salloc", "-N1", "true"]):
        r = ctl.exec([argv[0], f"--comment={comment}", *argv[1:]], user=ALICE, timeout=60)
        assert r.exit_code != 0 and f"{argv[0]}: error: jobns: {says}\n" in r.stderr, r.stderr
    code, out, err = submit(cluster, f"#!/bin/sh\n#SBATCH --comment='{comment}'\ntrue\n")
    assert code != 0 and f"sbatch: error: jobns: {says}\n" in err, err


def restart_controller(cluster: SlurmCluster) -> None:
    ctl = cluster.controller
    ctl.sh("pkill -x slurmctld; while pgrep -x slurmctld >/dev/null; do sleep 0.2; done").check(
        "stop slurmctld"
    )
    ctl.exec(["slurmctld"]).check("start slurmctld")
    cluster.wait_idle(60)
