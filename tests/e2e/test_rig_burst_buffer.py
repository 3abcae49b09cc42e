"""The burst buffer's lifecycle through Slurm's real burst_buffer/lua plugin (issue 34):
jobns's burst_buffer.lua on the controller, `jobns bb` run by slurmscriptd, the prolog
on the nodes reading what it did; on every release the rig runs, as the ordinary user
alice (Slurm refuses root's burst-buffer jobs).

Deployed as docs/admin.md "The burst buffer" says: BurstBufferType=burst_buffer/lua,
burst_buffer.lua and burst_buffer.conf (Flags=TeardownFailure) beside slurm.conf,
`[burst_buffer] enabled` and shared_base (the cluster file system, /lustre here) in
every jobns.toml, `jobns bb pools` once before slurmctld starts.

What is proved:
- a job whose stage-in is slow starts only after it, while its nodes run other jobs;
- the per-node prolog does not stage again (the source is gone by the time it runs);
- a pool too small for two jobs makes the second wait (BurstBufferResources), then run;
- stage-out after the job, then nothing of the job left anywhere;
- slurmctld killed during stage-in and during stage-out, restarted: the job finishes,
  nothing lost;
- a failed stage-in holds that job only, with jobns's message as its reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers.errors import RigError
from containers.images import Release
from containers.rig import Rig
from containers.slurm import SlurmCluster
from tests.e2e.rig.burst_buffer import (
    ALICE,
    BOB,
    DATA,
    LIFE,
    PAUSE,
    POOL_MIB,
    SAVE_INTERVAL,
    SHARED,
    bb_state,
    buffer_done,
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


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(release_image, hostnames=["ctl", "node1", "node2"], client=docker_client) as rig:
        c = deployed(rig, ["node1", "node2"])
        c.start()
        yield c


def start_controller(cluster: SlurmCluster, pause: str = "") -> None:
    """(Re)start slurmctld, with jobns's test pause point set in its environment (every
    `jobns bb` it runs inherits it) or not."""
    ctl = cluster.controller
    # SIGTERM: slurmctld saves its state and stops (kill_controller is the crash).
    ctl.sh("pkill -x slurmctld; while pgrep -x slurmctld >/dev/null; do sleep 0.2; done")
    ctl.exec(["slurmctld"], env={PAUSE: pause} if pause else None).check("start slurmctld")
    deadline = time.monotonic() + 60
    while ctl.exec(["scontrol", "ping"], timeout=10).exit_code != 0:
        if time.monotonic() > deadline:
            raise RigError(f"slurmctld does not answer after a restart\n{cluster.logs()}")
        time.sleep(0.5)


def kill_controller(cluster: SlurmCluster, paused: str) -> None:
    """SIGKILL slurmctld while a `jobns bb` step is paused, once it has saved the state it
    is in (a crash loses what it had not saved: Slurm's own limit, not jobns's);
    slurmscriptd then kills the step's process group too (or, if it outlived it, the
    step runs on, as it would)."""
    ctl = cluster.controller
    # slurmctld writes its burst-buffer state every 30 s (AGENT_INTERVAL), its job state
    # within seconds of a change.
    time.sleep(SAVE_INTERVAL)
    ctl.sh("pkill -KILL -x slurmctld; while pgrep -x slurmctld >/dev/null; do sleep 0.2; done")
    ctl.sh('kill -CONT "$1" 2>/dev/null; true', paused)


def paused_step(cluster: SlurmCluster, job_id: str, step: str, timeout: float = 120) -> str:
    """The pid of `jobns bb --job-id JOB STEP` once it stopped itself at the pause point."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = cluster.controller.sh(
            'for p in $(pgrep -f "bb --job-id $1 $2"); do '
            '[ "$(ps -o stat= -p "$p" | cut -c1)" = T ] && echo "$p"; done; true',
            job_id,
            step,
        )
        if r.stdout.strip():
            return r.stdout.split()[0]
        time.sleep(0.5)
    raise RigError(f"jobns bb {step} of job {job_id} never paused\n{cluster.logs()}")


def test_a_slow_stage_in_holds_no_node_and_the_prolog_stages_nothing_again(
    cluster: SlurmCluster,
) -> None:
    start_controller(cluster, pause="bb-data-in")
    try:
        src = put_input(cluster, "slow-in", "staged by the burst buffer\n")
        job_id = submit(
            cluster,
            "#!/bin/sh\n#SBATCH -N2\n#BB_LUA pool=shared capacity=10M\n#JOBNS shared_tmpdir\n"
            f"#JOBNS stage_in source={src} destination=/tmp/in\n"
            "srun -N2 jobns run -- cat /tmp/in/f\n",
        )
        pid = paused_step(cluster, job_id, "data-in")
        # Copied, not yet staged-in: the job waits without nodes, which run other jobs.
        job = show(cluster, "job", job_id)
        burst = show(cluster, "burst")
        print(f"--- during stage-in: scontrol show burst\n{burst}")
        assert field(job, "JobState") == "PENDING", job
        assert field(job, "Reason") == "BurstBufferStageIn", job
        assert field(job, "BurstBufferState") == "staging-in", job
        assert field(job, "NodeList") in ("", "(null)"), job
        bbstat = show(cluster, "bbstat")
        assert "jobns burst buffer: pool shared:" in bbstat, bbstat
        assert f"job {job_id} user alice: set-up, layout shared" in bbstat, bbstat
        other = cluster.sbatch(BOB, "#!/bin/sh\n#SBATCH -N2\nsrun -N2 hostname\n")
        assert sorted(cluster.output(other).split()) == ["node1", "node2"]
        # The source goes away before any prolog runs: a prolog that staged again fails.
        cluster.controller.exec(["rm", "-rf", src]).check("remove the source")
        cluster.controller.exec(["kill", "-CONT", pid]).check("resume the stage-in")
        state, code = cluster.wait_done(job_id, 180)
        assert (state, code) == ("COMPLETED", "0:0"), cluster.output(job_id) + cluster.logs()
        assert cluster.output(job_id).splitlines() == ["staged by the burst buffer"] * 2
        wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
        gone(cluster, job_id)
    finally:
        start_controller(cluster)


def test_a_pool_too_small_makes_a_job_wait_then_run(cluster: SlurmCluster) -> None:
    big = submit(
        cluster,
        f"#!/bin/sh\n#BB_LUA pool=shared capacity={POOL_MIB * 7 // 10}M\n"
        "#JOBNS shared_tmpdir\nsleep 10\necho first\n",
    )
    wait_for("the first job to run", lambda: cluster.job_state(big)[0] == "RUNNING", cluster)
    second = submit(
        cluster,
        f"#!/bin/sh\n#BB_LUA pool=shared capacity={POOL_MIB // 2}M\n"
        "#JOBNS shared_tmpdir\necho second\n",
    )
    # node2 is free: only the pool keeps the second job waiting.
    wait_for(
        "the second job to wait for the pool",
        lambda: field(show(cluster, "job", second), "Reason") == "BurstBufferResources",
        cluster,
        60,
    )
    assert cluster.job_state(big)[0] == "RUNNING"
    for job_id in (big, second):
        assert cluster.wait_done(job_id, 240) == ("COMPLETED", "0:0"), cluster.logs()
    assert cluster.output(second).split() == ["second"]


def test_stage_out_after_the_job_leaves_nothing(cluster: SlurmCluster) -> None:
    cluster.controller.sh(f"rm -rf {DATA}/out-*").check("clean")
    job_id = submit(
        cluster,
        "#!/bin/sh\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_out source=/tmp/out destination={DATA}/out-%j\n"
        "srun jobns run -- sh -c 'mkdir /tmp/out && echo result >/tmp/out/r'\n",
    )
    # The job's burst-buffer states as scontrol shows them, each once, in Slurm's order.
    seen: list[str] = []
    deadline = time.monotonic() + 180
    while not seen or seen[-1] != "complete":
        assert time.monotonic() < deadline, (seen, cluster.logs())
        now = bb_state(cluster, job_id)
        if now and (not seen or seen[-1] != now):
            seen.append(now)
        time.sleep(0.1)
    print(f"--- job {job_id}: BurstBufferState {' -> '.join(seen)}")
    order = list(LIFE)
    assert [order.index(s) for s in seen] == sorted(order.index(s) for s in seen), seen
    assert cluster.wait_done(job_id, 120) == ("COMPLETED", "0:0"), cluster.logs()
    r = cluster.controller.exec(["cat", f"{DATA}/out-{job_id}/r"]).check("read the output")
    assert r.stdout == "result\n"
    owner = cluster.controller.exec(["stat", "-c", "%U", f"{DATA}/out-{job_id}/r"]).stdout
    assert owner.strip() == ALICE  # copied as her, never as root
    gone(cluster, job_id)


def test_slurmctld_killed_during_stage_in_restarts_it_and_loses_nothing(
    cluster: SlurmCluster,
) -> None:
    start_controller(cluster, pause="bb-data-in")
    src = put_input(cluster, "restart-in", "survived a restart\n")
    job_id = submit(
        cluster,
        "#!/bin/sh\n#BB_LUA pool=shared capacity=5M\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_in source={src} destination=/tmp/in\n"
        "srun jobns run -- cat /tmp/in/f\n",
    )
    pid = paused_step(cluster, job_id, "data-in")
    kill_controller(cluster, pid)
    start_controller(cluster)
    # Slurm tears the half-staged buffer down and stages it in again 60 s later.
    assert cluster.wait_done(job_id, 300) == ("COMPLETED", "0:0"), cluster.logs(60)
    assert cluster.output(job_id) == "survived a restart\n"
    r = cluster.controller.exec(["cat", f"{src}/f"]).check("the source is whole")
    assert r.stdout == "survived a restart\n"
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    gone(cluster, job_id)


def test_slurmctld_killed_during_stage_out_restarts_it_and_loses_nothing(
    cluster: SlurmCluster,
) -> None:
    start_controller(cluster, pause="bb-data-out")
    try:
        job_id = submit(
            cluster,
            "#!/bin/sh\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\n"
            f"#JOBNS stage_out source=/tmp/out destination={DATA}/restart-out-%j\n"
            "srun jobns run -- sh -c 'mkdir /tmp/out && echo kept >/tmp/out/r'\n",
        )
        pid = paused_step(cluster, job_id, "data-out")
        print(f"--- during stage-out: scontrol show burst\n{show(cluster, 'burst')}")
        assert bb_state(cluster, job_id) == "staging-out"
        kill_controller(cluster, pid)
    finally:
        start_controller(cluster)
    # If slurmctld saved the job: post_run and data_out again (the copies done are not
    # repeated), then teardown. If the kill lost it: the buffer is vestigial, and its
    # teardown (not hurried) makes the copies still to make before it removes anything.
    wait_for("the buffer's teardown", lambda: buffer_done(cluster, job_id), cluster)
    r = cluster.controller.exec(["cat", f"{DATA}/restart-out-{job_id}/r"]).check("the output")
    assert r.stdout == "kept\n"
    gone(cluster, job_id)


def test_a_failed_stage_in_holds_only_that_job(cluster: SlurmCluster) -> None:
    job_id = submit(
        cluster,
        "#!/bin/sh\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_in source={DATA}/no-such-input destination=/tmp/in\necho never\n",
    )
    # Held (priority 0), jobns's line in its reason (scontrol prints the description
    # there: BurstBufferOperation's text) and in its SystemComment.
    said = f"stage_in source {DATA}/no-such-input does not exist"
    wait_for(
        "the job to be held with jobns's message",
        lambda: said in show(cluster, "job", job_id),
        cluster,
        120,
    )
    job = show(cluster, "job", job_id)
    assert field(job, "JobState") == "PENDING", job
    assert field(job, "Priority") == "0", job
    reason = job.split("Reason=", 1)[1].split()[0]  # scontrol writes its spaces as '_'
    assert said.replace(" ", "_") in reason, job
    assert said in job.split("SystemComment=", 1)[1], job
    # The rest of the cluster runs on.
    assert cluster.output(cluster.sbatch(ALICE, "#!/bin/sh\necho fine\n")) == "fine\n"
    cluster.scancel(job_id)
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    gone(cluster, job_id)


def test_scancel_during_stage_in_tears_the_buffer_down(cluster: SlurmCluster) -> None:
    """scancel of a job whose stage-in is under way: Slurm tears its buffer down in a
    hurry; the teardown waits for the copy still running (the job's steps take turns),
    then removes the shared tree. The source is untouched."""
    start_controller(cluster, pause="bb-data-in")
    try:
        src = put_input(cluster, "cancel-in", "not needed after all\n")
        job_id = submit(
            cluster,
            "#!/bin/sh\n#BB_LUA pool=shared capacity=5M\n#JOBNS shared_tmpdir\n"
            f"#JOBNS stage_in source={src} destination=/tmp/in\necho never\n",
        )
        pid = paused_step(cluster, job_id, "data-in")
        cluster.scancel(job_id)
        cluster.controller.sh('kill -CONT "$1" 2>/dev/null; true', pid)
        wait_for("the buffer's teardown", lambda: buffer_done(cluster, job_id), cluster)
    finally:
        start_controller(cluster)
    assert cluster.job_state(job_id)[0] == "CANCELLED", show(cluster, "job", job_id)
    assert cluster.output(job_id) == ""
    r = cluster.controller.exec(["cat", f"{src}/f"]).check("the source is whole")
    assert r.stdout == "not needed after all\n"
    gone(cluster, job_id)


def test_a_requeued_job_stages_out_then_in_again(cluster: SlurmCluster) -> None:
    """scontrol requeue of a running burst-buffer job: Slurm stages its outputs out,
    tears the buffer down, and sets it up and stages in again before the job's second
    run, which starts with a fresh shared /tmp holding the input again. Both runs'
    outputs end up in the destination."""
    src = put_input(cluster, "requeue-in", "staged for every run\n")
    out = f"{DATA}/requeue-out"
    cluster.controller.sh(f"rm -rf {out}-*").check("clean")
    job_id = submit(
        cluster,
        "#!/bin/sh\n#SBATCH --requeue\n#BB_LUA pool=shared capacity=1M\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_in source={src} destination=/tmp/in\n"
        f"#JOBNS stage_out source=/tmp/out destination={out}-%j\n"
        'run="run-${SLURM_RESTART_COUNT:-0}"\n'
        "srun jobns run -- sh -c "
        '\'cat /tmp/in/f && mkdir -p /tmp/out && echo "$1" >/tmp/out/"$1" && ls /tmp/out\' '
        'sh "$run"\n'
        '[ "$run" = run-0 ] && sleep 600\n'
        "exit 0\n",
    )
    first = f"{SHARED}/job-{job_id}"
    wait_for(
        "the first run's output",
        lambda: cluster.controller.sh(f"find {first} -name run-0 | grep -q .").exit_code == 0,
        cluster,
    )
    cluster.controller.exec(["scontrol", "requeue", job_id]).check("requeue")
    assert cluster.wait_done(job_id, 300) == ("COMPLETED", "0:0"), cluster.logs(60)
    # The second run: the input staged in again, a shared /tmp without the first run's file.
    assert cluster.output(job_id).splitlines() == ["staged for every run", "run-1"]
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    r = cluster.controller.sh(f"ls {out}-{job_id}").check("the outputs")
    assert r.stdout.split() == ["run-0", "run-1"]
    gone(cluster, job_id)


def test_doctor_on_the_controller_and_a_node(cluster: SlurmCluster) -> None:
    """`jobns doctor` on a deployment made as docs/admin.md says: its burst-buffer lines
    are all ok; an old pools.json (no timer measuring the pool) is one problem naming
    the timer."""
    ctl = cluster.controller
    ctl.exec(["jobns", "bb", "pools"]).check("measure the pool")
    on_ctl = doctor_lines(ctl)
    print("--- jobns doctor on the controller\n" + "\n".join(on_ctl))
    assert on_ctl and all(line.startswith("ok: ") for line in on_ctl), on_ctl
    assert any("burst_buffer.lua is jobns's, runs /usr/bin/jobns" in line for line in on_ctl)
    on_node = doctor_lines(cluster.computes[0])
    assert on_node and all(line.startswith("ok: ") for line in on_node), on_node
    assert not any("burst_buffer.lua" in line for line in on_node), on_node  # not a controller
    ctl.sh("touch -d '-1 hour' /run/jobns/bb/pools.json").check("age the pool")
    try:
        problems = [line for line in doctor_lines(ctl) if line.startswith("problem: ")]
        assert len(problems) == 1 and "jobns-bb-pools.timer" in problems[0], problems
    finally:
        ctl.exec(["jobns", "bb", "pools"]).check("measure the pool")


def test_a_percent_in_the_bb_lua_line_still_reads_the_whole_script(cluster: SlurmCluster) -> None:
    """A `%` on a #BB_LUA line makes Slurm hand setup and data_in a copy of the directive
    lines only (a /proc/PID/fd path): jobns then reads the script slurmctld saved, so
    the #JOBNS lines (the shared layout, the stage_in) still count."""
    src = put_input(cluster, "percent-in", "read from the saved script\n")
    job_id = submit(
        cluster,
        "#!/bin/sh\n#BB_LUA pool=shared capacity=1M tag=run-%j\n#JOBNS shared_tmpdir\n"
        f"#JOBNS stage_in source={src} destination=/tmp/in\n"
        "srun jobns run -- cat /tmp/in/f\n",
    )
    assert cluster.wait_done(job_id, 180) == ("COMPLETED", "0:0"), cluster.logs(60)
    assert cluster.output(job_id) == "read from the saved script\n"
    wait_for("the buffer's teardown", lambda: bb_state(cluster, job_id) == "complete", cluster)
    gone(cluster, job_id)
