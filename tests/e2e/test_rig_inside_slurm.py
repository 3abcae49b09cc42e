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

import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers import peers
from containers.images import Release
from containers.rig import Rig
from containers.slurm import WORK, SlurmCluster

pytestmark = pytest.mark.docker

COMPUTES = ("node1", "node2")
ALICE = "alice"


def container_conf(release: Release) -> dict[str, str]:
    """slurm.conf lines that load jobns's plugin of Slurm's own type on this release."""
    return peers.inside_conf(release.slurm)


def whole_step(release: Release) -> bool:
    """Does jobns's plugin put the whole step (slurmstepd itself) in the job's namespace?
    From 24.11, whose slurmd joins in the child that execs slurmstepd; 22.05 has no such
    hook (docs/admin.md "Inside Slurm: the job_container and namespace plugin")."""
    return tuple(int(x) for x in release.slurm.split(".")) >= (24, 11)


TASK_EPILOG = "/etc/slurm/task-epilog"
# Slurm runs it as the job's user after each task, in a child of slurmstepd: for the job
# named te-probe it says whether it saw the task's /tmp (where each task leaves a mark)
TASK_EPILOG_SH = f"""\
#!/bin/sh
[ "$SLURM_JOB_NAME" = te-probe ] || exit 0
if [ -e "/tmp/te-mark-$SLURM_JOB_ID" ]; then where=job; else where=node; fi
echo "$where $(readlink /proc/self/ns/mnt)" \\
    > "{WORK}/te-$SLURM_JOB_ID-$(hostname)-$SLURM_STEP_ID-$SLURM_PROCID"
"""


@pytest.fixture(scope="module")
def inside(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(
        release_image, hostnames=["ctl", *COMPUTES], client=docker_client, config={"kill_wait": 2}
    ) as rig:
        cluster = SlurmCluster(
            rig,
            "ctl",
            COMPUTES,
            jobns=True,
            enforce=True,
            extra={**container_conf(release), "TaskEpilog": TASK_EPILOG},
        )
        cluster.configure()
        for n in cluster.computes:
            n.put_file(TASK_EPILOG, TASK_EPILOG_SH, mode=0o755)
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
    # doctor asks for mpi.conf's PMIxCliTmpDirBase only where the step's daemon stays in
    # the node's namespace (22.05; this cluster has Slurm's default mpi.conf)
    doctor = inside.computes[0].exec(["jobns", "doctor"], timeout=60)
    assert "loads only into the exact release" not in doctor.stdout, doctor.stdout
    assert ("PMIxCliTmpDirBase=" in doctor.stdout) == (not whole_step(release)), doctor.stdout


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


STEP_JOB = """\
#!/bin/sh
#SBATCH -N2 --ntasks-per-node=1 -J te-probe
srun sh -c 'touch /tmp/te-mark-$SLURM_JOB_ID; echo task $(hostname) $(readlink /proc/self/ns/mnt)'
srun -o '/tmp/out-%j-%N' sh -c 'echo step-output-$(hostname)'
srun sh -c 'echo read-$(hostname) $(cat /tmp/out-$SLURM_JOB_ID-$(hostname) 2>&1)'
"""


def test_step_output_and_task_epilog_act_in_the_jobs_namespace(
    inside: SlurmCluster, release: Release
) -> None:
    """`srun -o /tmp/out-%j-%N` and a TaskEpilog, as alice on two nodes. From 24.11 the
    step's daemon is in the job's namespace (it opens the step's output there): each
    node's next task reads its output from the job's /tmp, and no node keeps a file of
    it. On 22.05 slurmstepd opens it in the node's /tmp (Slurm 22.05 has no whole-step
    hook: a job_container plugin is asked to join only children of slurmd and of
    slurmstepd), where the job cannot see it: docs/users.md says so. The TaskEpilog (a
    child of slurmstepd, joined on every release) sees each task's /tmp."""
    job_id = inside.sbatch(ALICE, STEP_JOB, "-N2")
    out = inside.output(job_id)
    tasks = {w[1]: w[2] for w in (line.split() for line in out.splitlines()) if w[0] == "task"}
    assert sorted(tasks) == sorted(COMPUTES), out
    reads = [line for line in out.splitlines() if line.startswith("read-")]
    assert len(reads) == 2, out
    on_nodes = host_leftovers(inside, f"/tmp/out-{job_id}-* /tmp/te-mark-{job_id}")
    if whole_step(release):
        assert sorted(reads) == [f"read-{n} step-output-{n}" for n in sorted(COMPUTES)], out
        assert on_nodes == [], on_nodes
    else:
        assert all("No such file" in r for r in reads), out
        assert sorted(on_nodes) == sorted(f"{n}: /tmp/out-{job_id}-{n}" for n in COMPUTES)
        for n in inside.computes:
            n.sh(f"rm -f /tmp/out-{job_id}-*").check("remove 22.05's step output")
    # the TaskEpilog after each task of each step: in the job's namespace, seeing its /tmp
    seen = inside.controller.sh(f"cd {WORK} && grep -H . te-{job_id}-* </dev/null")
    lines = seen.stdout.split("\n")
    reports = [line.split(":", 1)[1].split() for line in lines if line]
    assert len(reports) == 7, seen.stdout  # 3 steps x 2 nodes, and the batch step
    for node in COMPUTES:
        mine = [r for line, r in zip(lines, reports, strict=False) if f"-{node}-" in line]
        assert mine and all(r == ["job", tasks[node]] for r in mine), (node, seen.stdout)
    assert inside.unusable() == {}


COOKIE = "4a6f626e73e2809979e2809978313120"
X11_JOB = """\
xauth add "$DISPLAY" MIT-MAGIC-COOKIE-1 {cookie}
srun --x11 -N1 -w {node} sh -c 'echo "x11 display=$DISPLAY xauthority=$XAUTHORITY \
mnt=$(readlink /proc/self/ns/mnt)"; xauth -f "$XAUTHORITY" list; ls -A /tmp'
"""


@pytest.fixture(scope="module")
def x11(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    """One compute node with Slurm's X11 forwarding (PrologFlags=X11, which Slurm refuses
    beside proctrack/linuxproc: proctrack/pgid here) and jobns's plugin; before 25.11
    with X11Parameters=home_xauthority, as doctor asks."""
    extra = {**container_conf(release), "ProctrackType": "proctrack/pgid"}
    extra["PrologFlags"] = ",".join(
        sorted({*extra.get("PrologFlags", "").split(","), "Contain", "X11"} - {""})
    )
    if tuple(int(x) for x in release.slurm.split(".")) < (25, 11):
        extra["X11Parameters"] = "home_xauthority"
    with Rig(release_image, hostnames=["ctl", "node1"], client=docker_client) as rig:
        cluster = SlurmCluster(rig, "ctl", ("node1",), jobns=True, enforce=True, extra=extra)
        cluster.start()
        yield cluster


def test_x11_forwarding_sets_up_its_xauthority_where_the_task_reads_it(
    x11: SlurmCluster, release: Release
) -> None:
    """`srun --x11` as alice (a display on the submit host: a cookie in her xauth file, no
    X server needed until a client connects). 26.05 joins the extern step's xauth set-up
    to the job's namespace (any namespace plugin): XAUTHORITY is a file in the job's /tmp,
    with the cookie, and nothing of it is in the node's /tmp. Before 25.11 Slurm joins
    there only for a plugin named tmpfs, so doctor asks for home_xauthority: the cookie is
    in her ~/.Xauthority, which the task reads the same."""
    script = "#!/bin/sh\n" + X11_JOB.format(cookie=COOKIE, node="node1")
    path = f"{WORK}/x11-{time.monotonic_ns()}.sh"
    x11.controller.put_file(path, script, mode=0o755)
    r = x11.controller.exec(["env", "DISPLAY=localhost:7", "sh", path], user=ALICE, timeout=60)
    assert r.exit_code == 0, (r.stdout, r.stderr, x11.logs())
    line = next(w for w in r.stdout.splitlines() if w.startswith("x11 "))
    fields = dict(w.split("=", 1) for w in line.split()[1:])
    assert COOKIE in r.stdout, r.stdout  # xauth list of the task's XAUTHORITY
    node = x11.computes[0]
    if tuple(int(x) for x in release.slurm.split(".")) >= (25, 11):
        assert fields["xauthority"].startswith("/tmp/.Xauthority-"), line
        assert fields["xauthority"].rsplit("/", 1)[1] in r.stdout.split(), r.stdout
        own = node.exec(["readlink", "/proc/self/ns/mnt"]).stdout.strip()
        assert fields["mnt"] != own, line
        assert node.sh("ls -A /tmp").stdout.count(".Xauthority-") == 0
    else:
        assert fields["xauthority"] == "/home/alice/.Xauthority", line
    assert x11.unusable() == {}


SLOW_PRE_RUN = "#!/bin/sh\\nsleep 13\\n"  # longer than the plugin's 10 s bound
SLOW_JOB = """\
#!/bin/sh
echo batch $(readlink /proc/self/ns/mnt)
touch /tmp/from-batch
srun sh -c 'echo task $(readlink /proc/self/ns/mnt); test -e /tmp/from-batch && echo sees-batch'
"""


def test_a_setup_longer_than_the_plugins_bound_leaves_the_step_outside_and_tasks_inside(
    inside: SlurmCluster,
) -> None:
    """A background setup that takes 13 s (a slow pre-run program): the plugin waits 10 s
    in slurmd's child, then lets the step start in the node's namespace (never failing
    the launch); the SPANK plugin holds each task until the setup is done and puts it in
    the job's namespace. slurmd answers meanwhile, the job completes, no node drains."""
    node1 = inside.computes[0]
    config = "/etc/jobns/jobns.toml"
    node1.sh(
        f"printf '{SLOW_PRE_RUN}' > /usr/local/sbin/slow-pre-run && "
        "chmod 0755 /usr/local/sbin/slow-pre-run && "
        f"printf '[lifecycle]\\npre_run = \"/usr/local/sbin/slow-pre-run\"\\n' >> {config}"
    ).check("a slow pre-run program")
    try:
        t0 = time.monotonic()
        job_id = inside.sbatch(ALICE, SLOW_JOB, "-N1", "-w", node1.hostname, wait=False)
        answered = []
        while inside.job_state(job_id)[0] not in ("RUNNING", "COMPLETED", "FAILED"):
            time.sleep(0.2)
        while time.monotonic() - t0 < 11:  # while the plugin and the tasks wait
            r = node1.exec(["scontrol", "show", "slurmd"], timeout=5)
            answered.append(r.exit_code == 0)
            time.sleep(1)
        state, code = inside.wait_done(job_id, timeout=90)
        took = time.monotonic() - t0
        out = inside.output(job_id)
        assert (state, code) == ("COMPLETED", "0:0"), (out, inside.logs())
        assert took >= 13 and answered and all(answered), (took, answered)
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        own = node1.exec(["readlink", "/proc/self/ns/mnt"]).stdout.strip()
        assert lines["batch"] == lines["task"] != own, out
        assert "sees-batch" in out, out
        assert inside.unusable() == {}
    finally:
        node1.sh(f"sed -i '/^\\[lifecycle\\]/,$d' {config}").check("restore the config")
