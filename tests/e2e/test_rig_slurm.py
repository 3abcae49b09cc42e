"""jobns deployed on a Slurm cluster in the rig: controller ctl, computes node1, node2, once
per Slurm release (the `release` fixture: Debian bookworm's 22.05, trixie's 24.11, forky's
26.05; JOBNS_RIG_RELEASES chooses fewer).

Deployed as docs/admin.md "Deploying on a Slurm cluster" says (containers/slurm.py, jobns=True):
Prolog=/etc/jobns/slurm/prolog (`jobns setup`), Epilog=/etc/jobns/slurm/epilog (`jobns
teardown`), no PrologFlags, the scripts byte for byte from jobns/slurm/scripts/; every task is
`srun jobns run -- CMD`; per-job options travel in `sbatch --comment "jobns: ..."`. All
jobs are submitted by the ordinary user alice. After every job, no node keeps anything of
it: no /tmp/job-*, /dev/shm/job-*, nothing under /run/jobns/jobs, no new mount (no nsfs
pin, no bind) in the node's mount table, and the node is idle again, not drained (a
failed prolog or epilog drains it). slurmd itself starts the prolog and epilog, with its
own environment (no PATH), as on a site's node.

The voluntary cluster (`slurm`) also has `[capacity] tmp_backing = "disk"` (the host's
loop devices in each node) and jobns/slurm/oci.conf for `srun --container`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from containers.images import JOBNS, Release, spank_plugin
from containers.privileges import ROOTLESS_RUNC
from containers.rig import CONFIG_PATH, Node, Rig
from containers.slurm import FINAL, SHIPPED_SLURM, WORK, SlurmCluster, render_conf

pytestmark = pytest.mark.docker

COMPUTES = ("node1", "node2")
STATE = "/run/jobns"  # jobns' state_dir (the default)
JOBS = f"{STATE}/jobs"
SHARED = "/lustre/jobns"  # shared_base in the rig's jobns.toml
ALICE = "alice"
ALICE_UID = "1001"
SCRATCH = "/var/lib/jobns/scratch"  # the disk capacities' images (scratch_base's default)
# each compute node's mount table before any job (by container name: a rig's nodes have
# their own): jobns may add only its state_dir bind
BASELINE: dict[str, dict[str, str]] = {}


def mountpoints(node: Node) -> dict[str, str]:
    """Mount point -> file system type, from the node's (and slurmd's) mount table."""
    text = node.exec(["cat", "/proc/self/mountinfo"]).check("read mountinfo").stdout
    found = {}
    for line in text.splitlines():
        fields, _, rest = line.partition(" - ")
        found[fields.split()[4]] = rest.split()[0]
    return found


@pytest.fixture(scope="module")
def slurm(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    t0 = time.monotonic()
    # kill_wait 2 (jobns) matches KillWait=2 (Slurm): a task ignoring SIGTERM dies in 2 s
    with Rig(
        release_image,
        hostnames=["ctl", *COMPUTES],
        client=docker_client,
        config={"kill_wait": 2, "capacity": {"tmp_backing": "disk"}},
        loop=True,
        privileges=ROOTLESS_RUNC,  # srun --container
    ) as rig:
        # the example the jobns package ships (/usr/share/doc/jobns/examples/oci.conf)
        oci = (SHIPPED_SLURM / "oci.conf").read_text().replace("/opt/jobns/venv/bin/jobns", JOBNS)
        cluster = SlurmCluster(rig, "ctl", COMPUTES, jobns=True, files={"/etc/slurm/oci.conf": oci})
        cluster.start()
        cluster.timings["up"] = time.monotonic() - t0
        rig.log(
            f"slurm {release.suite} rig up in {cluster.timings['up']:.1f}s (nodes "
            f"{rig.timings['start']:.1f}s, Slurm {cluster.timings['start']:.1f}s)"
        )
        BASELINE.update({n.container.name: mountpoints(n) for n in cluster.computes})
        yield cluster


@pytest.fixture(autouse=True)
def nodes_usable(request: pytest.FixtureRequest) -> None:
    """A node drained by an earlier test's job fails the next test at once (naming the
    reason Slurm recorded) instead of letting its job wait for the node until a timeout."""
    if "slurm" not in request.fixturenames:
        return
    cluster: SlurmCluster = request.getfixturevalue("slurm")
    bad = cluster.unusable()
    if bad:
        pytest.fail(
            f"Slurm does not use {bad} (an earlier job's prolog or epilog failed; "
            f"see the first failure)\n{cluster.logs()}",
            pytrace=False,
        )


def leftovers(
    cluster: SlurmCluster, job_id: str | None = None, *, keep_shared: bool = False
) -> list[str]:
    """What any job left on a node, and job_id's (any job's) tree on the shared volume;
    [] when clean."""
    found: list[str] = []
    for n in cluster.computes:
        r = n.sh(
            f"ls -d /tmp/job-* /var/tmp/job-* /dev/shm/job-* /tmp/who {JOBS}/* {SCRATCH}/* "
            "2>/dev/null; true"
        )
        found += [f"{n.hostname}: {p}" for p in r.stdout.split()]
        before = BASELINE[n.container.name]
        for point, fstype in mountpoints(n).items():
            if fstype == "nsfs" or (point not in before and point != STATE):
                found.append(f"{n.hostname}: mount {point} ({fstype})")
    if not keep_shared:
        pattern = f"{SHARED}/job-{job_id}" if job_id else f"{SHARED}/*"
        r = cluster.controller.sh(f"ls -d {pattern} 2>/dev/null; true")
        found += [f"shared volume: {p}" for p in r.stdout.split()]
    states = cluster.node_states()
    found += [f"{h}: Slurm state {states.get(h)}" for h in COMPUTES if states.get(h) != "idle"]
    return found


def assert_no_trace(
    cluster: SlurmCluster, job_id: str, *, keep_shared: bool = False, timeout: float = 60
) -> None:
    """Wait until Slurm is done with the job (epilogs included) and its state is gone on
    every node, then check that nothing of it is left anywhere."""
    deadline = time.monotonic() + timeout
    while True:
        queued = cluster.in_queue(job_id)
        state = [
            n.hostname
            for n in cluster.computes
            if n.exec(["test", "-e", f"{JOBS}/{job_id}"]).exit_code == 0
        ]
        left = [] if queued or state else leftovers(cluster, job_id, keep_shared=keep_shared)
        if not (queued or state or left):
            return
        if time.monotonic() > deadline or (not queued and cluster.unusable()):
            what = (
                (["still in squeue"] if queued else [])
                + [f"{h}: {JOBS}/{job_id}" for h in state]
                + left
            )
            pytest.fail(
                f"job {job_id}: after {timeout:g}s: {what}\n"
                f"--- job output\n{cluster.output(job_id)}{cluster.logs()}",
                pytrace=False,
            )
        time.sleep(0.25)


def by_step(output: str) -> dict[tuple[str, str], list[str]]:
    """Lines `STEP HOST WORDS...` -> {(STEP, HOST): WORDS}."""
    lines = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].startswith("step"):
            lines[(words[0], words[1])] = words[2:]
    return lines


def test_render_conf_lists_controller_nodes_and_extra() -> None:
    conf = render_conf("ctl", ["node1", "node2"], extra={"PrologFlags": "Alloc"})
    assert "SlurmctldHost=ctl\n" in conf
    assert "NodeName=node1 NodeHostname=node1 " in conf and "NodeName=node2 " in conf
    assert "PartitionName=rig Nodes=node1,node2 Default=YES" in conf
    assert "PrologFlags=Alloc\n" in conf


def test_jobns_is_deployed_as_prolog_and_epilog(slurm: SlurmCluster, release: Release) -> None:
    assert slurm.version().startswith(release.slurm + "."), slurm.version()
    conf = slurm.controller.exec(["scontrol", "show", "config"]).check("scontrol").stdout
    # 24.11+ lists each of several scripts: "Prolog[0] = ..."
    settings = {
        k.strip().removesuffix("[0]"): v.strip()
        for k, _, v in (ln.partition("=") for ln in conf.splitlines())
    }
    assert settings["Prolog"] == "/etc/jobns/slurm/prolog"
    assert settings["Epilog"] == "/etc/jobns/slurm/epilog"
    assert "Alloc" not in settings.get("PrologFlags", "")  # a node sets up at its first step
    for n in slurm.computes:
        for name in ("prolog", "epilog"):
            path = f"/etc/jobns/slurm/{name}"
            r = n.exec(["stat", "-c", "%U %a", path]).check(f"stat {path}")
            assert r.stdout.strip() == "root 755", (n, path)
            # the jobns package's: jobns/slurm/scripts, naming /usr/bin/jobns
            text = n.exec(["cat", path]).check(f"cat {path}").stdout
            dev = (SHIPPED_SLURM / "scripts" / name).read_text()
            assert text == dev.replace("/opt/jobns/venv/bin/jobns", JOBNS), (n, path)


def test_srun_runs_on_both_nodes_as_alice(slurm: SlurmCluster) -> None:
    r = slurm.controller.exec(
        ["su", ALICE, "-c", f"cd {WORK} && srun -N2 sh -c 'echo $(id -u) $(hostname)'"]
    )
    assert sorted(r.check("srun as alice").stdout.splitlines()) == [
        f"{ALICE_UID} node1",
        f"{ALICE_UID} node2",
    ]


def test_srun_comment_per_node_uses_the_slurm_job_id(slurm: SlurmCluster) -> None:
    """An interactive srun gets its own allocation: the prolog sets it up from the
    comment, the tasks see $SLURM_JOB_ID's per-node tree; the epilog removes it."""
    script = (
        "touch /tmp/from-$(hostname) && "
        "test -e /lustre/jobns/job-$SLURM_JOB_ID/$(hostname)/tmp/from-$(hostname) && "
        "echo $SLURM_JOB_ID"
    )
    cmd = (
        f"cd {WORK} && srun -N2 --comment='jobns: shared_tmpdir=per-node' "
        f"jobns run -- sh -c '{script}'"
    )
    r = slurm.controller.exec(["su", ALICE, "-c", cmd]).check("srun jobns run")
    ids = set(r.stdout.split())
    assert len(ids) == 1, r.stdout
    assert_no_trace(slurm, ids.pop())


TWO_STEPS = """\
#!/bin/sh
#SBATCH -N2
# step 1 writes its node's name into the job's /tmp; step 2 (a new srun) reads it back
srun -N2 jobns run -- sh -c 'hostname > /tmp/who; \
echo step1 $(hostname) $(id -u) $(readlink /proc/self/ns/mnt) $TMPDIR'
srun -N2 jobns run -- sh -c 'echo step2 $(hostname) $(cat /tmp/who) $(readlink /proc/self/ns/mnt)'
"""


def check_two_steps(slurm: SlurmCluster, job_id: str) -> None:
    out = slurm.output(job_id)
    steps = by_step(out)
    assert set(steps) == {(s, h) for h in COMPUTES for s in ("step1", "step2")}, out
    namespaces = set()
    for host in COMPUTES:
        uid, ns1, tmpdir = steps[("step1", host)]
        who, ns2 = steps[("step2", host)]
        assert uid == ALICE_UID, out  # slurmstepd ran alice's task as alice
        assert who == host, out  # each node's task sees ITS node's /tmp
        assert ns1 == ns2, out  # both steps on a node: one namespace
        assert tmpdir == "/tmp", out
        node_ns = slurm.rig.node(host).exec(["readlink", "/proc/1/ns/mnt"]).stdout.strip()
        assert ns1 != node_ns, out  # ... which is not the node's own
        namespaces.add(ns1)
    assert len(namespaces) == len(COMPUTES), out


def test_two_node_job_each_node_keeps_its_own_tmp_across_steps(slurm: SlurmCluster) -> None:
    job_id = slurm.sbatch(ALICE, TWO_STEPS)
    check_two_steps(slurm, job_id)
    assert_no_trace(slurm, job_id)


def test_comment_per_node_no_rm_keeps_each_nodes_tmp_on_the_volume(slurm: SlurmCluster) -> None:
    job_id = slurm.sbatch(ALICE, TWO_STEPS, "--comment=jobns: shared_tmpdir=per-node; no_rm_tmpdir")
    check_two_steps(slurm, job_id)
    assert_no_trace(slurm, job_id, keep_shared=True)
    top = f"{SHARED}/job-{job_id}"
    try:
        for host in COMPUTES:
            r = slurm.controller.exec(["stat", "-c", "%u", f"{top}/{host}/tmp/who"])
            assert r.stdout.strip() == ALICE_UID, r
            who = slurm.controller.exec(["cat", f"{top}/{host}/tmp/who"]).check("cat who")
            assert who.stdout.strip() == host
        listing = slurm.controller.exec(["ls", "-A", top]).check(f"ls {top}").stdout.split()
        assert sorted(listing) == sorted(COMPUTES)
    finally:
        slurm.controller.exec(["rm", "-rf", "--one-file-system", top])


# A task that ignores SIGTERM, plus an escapee (double fork + setsid, re-parented to the
# node's init) that proctrack/linuxproc (descendants of slurmstepd) no longer finds;
# jobns finds processes by the job's mount namespace and SIGKILLs them after kill_wait.
# (The same script without jobns leaves the job COMPLETING for more than 30 s.)
STUBBORN = """\
#!/bin/sh
trap '' TERM
f=/lustre/slurm/pids-$SLURM_JOB_ID-$(hostname)
( setsid sh -c 'echo $$ >> "$1"; exec sleep 600' sh "$f" & )
echo $$ >> "$f"
while :; do sleep 0.2; done
"""


def test_scancel_cleans_up_a_two_node_job_ignoring_sigterm(slurm: SlurmCluster) -> None:
    slurm.controller.put_file(f"{WORK}/stubborn.sh", STUBBORN, mode=0o755)
    job_id = slurm.sbatch(
        ALICE, f"#!/bin/sh\n#SBATCH -N2\nsrun -N2 jobns run -- {WORK}/stubborn.sh\n", wait=False
    )
    pids: dict[str, list[str]] = {}
    deadline = time.monotonic() + 60
    while len(pids) < len(COMPUTES):
        for host in COMPUTES:
            r = slurm.controller.exec(["cat", f"{WORK}/pids-{job_id}-{host}"])
            if len(r.stdout.split()) == 2:
                pids[host] = r.stdout.split()
        bad = slurm.unusable()
        if bad or time.monotonic() > deadline or slurm.job_state(job_id)[0] in FINAL:
            slurm.scancel(job_id)
            pytest.fail(
                f"job {job_id}: tasks did not start on both nodes: {pids}; Slurm "
                f"does not use {bad}\n{slurm.output(job_id)}{slurm.logs()}",
                pytrace=False,
            )
        time.sleep(0.2)
    for host, ps in pids.items():
        n = slurm.rig.node(host)
        # both processes live in the namespace the prolog pinned on this node
        pin = n.exec(["stat", "-L", "-c", "%i", f"{JOBS}/{job_id}/ns/mnt"]).check("pin")
        for pid in ps:
            ns = n.exec(["readlink", f"/proc/{pid}/ns/mnt"]).check(f"ns of {pid}")
            assert ns.stdout.strip() == f"mnt:[{pin.stdout.strip()}]", (host, pid)
    t0 = time.monotonic()
    slurm.scancel(job_id)
    assert_no_trace(slurm, job_id)
    took = time.monotonic() - t0
    for host, ps in pids.items():
        # gone, not even a zombie: the node's init (docker-init) reaps the escapee
        alive = slurm.rig.node(host).sh(
            'for i in $(seq 50); do left=""; for p; do [ ! -e /proc/$p ] || left="$left $p"; '
            'done; [ -z "$left" ] && exit 0; sleep 0.1; done; echo $left',
            *ps,
        )
        assert alive.stdout.split() == [], f"{host}: survived scancel: {alive.stdout}"
    assert took < 30, f"scancel to clean took {took:.1f}s"


# What a site's node has: the release's python3 and Debian's packages of jobns's runtime
# dependencies (pyroute2, jsonschema), jobns from the project's packages (Debian's
# dist-packages); no test tool, and no prctl (once jobns's dependency: it runs without it).
SITE_INSTALL = """\
import importlib.util, sys, jsonschema, pyroute2, jobns.launcher
print(".".join(map(str, sys.version_info[:2])))
print(*(m.__file__.startswith("/usr/lib/python3/dist-packages/") for m in (pyroute2,
      jsonschema, jobns.launcher)))
print(*(importlib.util.find_spec(m) is not None for m in ("pytest", "mypy", "docker",
      "hypothesis", "ruff", "prctl")))
"""
NOT_FROM_A_CHECKOUT = ("/opt/jobns", "/usr/local/bin/jobns", "/usr/local/lib/python3")


def test_each_node_has_jobns_as_a_site_installs_it(slurm: SlurmCluster, release: Release) -> None:
    n = slurm.computes[0]
    # the two packages, installed (dpkg -s: status "install ok installed")
    r = n.exec(["dpkg-query", "-W", "-f=${Package} ${Status}\\n", "jobns", "jobns-slurm"])
    assert r.check("dpkg-query").stdout.splitlines() == [
        f"{p} install ok installed" for p in ("jobns", "jobns-slurm")
    ]
    n.exec(["dpkg", "-s", "jobns", "jobns-slurm"]).check("dpkg -s jobns jobns-slurm")
    # jobns-slurm depends on exactly this release's Slurm major.minor.micro (its
    # job_container/namespace plugin loads in no other)
    dep = n.exec(["dpkg-query", "-W", "-f=${Depends}", "jobns-slurm"]).check("Depends").stdout
    slurmd = n.exec(["slurmd", "-V"]).check("slurmd -V").stdout.split()[-1]
    assert slurmd.startswith(f"{release.slurm}."), slurmd
    assert f"slurm-wlm-basic-plugins (>= {slurmd})" in dep, dep
    # the system python3 (as root and as alice) imports the packaged jobns and its
    # dependencies from Debian, and none of the test tools
    out = n.exec(["/usr/bin/python3", "-P", "-c", SITE_INSTALL]).check("python").stdout.split()
    assert out == [release.python] + ["True"] * 3 + ["False"] * 6, out
    for user in ("root", ALICE):
        r = n.exec(["sh", "-c", "command -v jobns"], user=user)
        assert r.check(f"jobns on {user}'s PATH").stdout.strip() == JOBNS, (user, r)
    # the plugin where the package puts it, and jobns's files are all the package's
    owners = n.exec(["dpkg", "-S", JOBNS, spank_plugin()]).check("dpkg -S").stdout
    assert owners.split()[0::2] == ["jobns:", "jobns-slurm:"], owners
    r = n.sh("ls -d /opt/jobns/* /usr/local/bin/* /usr/local/lib/python3*/*/* 2>/dev/null")
    left = [p for p in r.stdout.split() if not p.startswith("/opt/jobns/debs")]
    assert not any(p.startswith(NOT_FROM_A_CHECKOUT) for p in left), left


def test_disk_capacity_from_the_comment(slurm: SlurmCluster) -> None:
    """`[capacity] tmp_backing = "disk"`: a tmp capacity asked in the comment is an ext4
    image on a loop device of the node, the job's size, ENOSPC past it; gone after."""
    script = (
        "#!/bin/sh\n"
        'srun jobns run -- sh -c \'grep " /tmp " /proc/self/mountinfo | sed "s/.* - //"; '
        "df -B1 --output=size /tmp | tail -1; "
        "dd if=/dev/zero of=/tmp/big bs=1M count=300 2>/dev/null; echo dd-exit=$?'\n"
    )
    job_id = slurm.sbatch(ALICE, script, "--comment=jobns: tmp capacity=256MiB")
    out = slurm.output(job_id).split()
    fstype, source, size, dd = out[0], out[1], int(out[3]), out[4]
    assert fstype == "ext4" and source.startswith("/dev/loop"), out
    assert 200 << 20 < size <= 256 << 20, out  # the job's size, less ext4's own metadata
    assert dd == "dd-exit=1", out  # no space left past the capacity
    assert_no_trace(slurm, job_id)


GATED = """\
#!/bin/sh
#SBATCH -w node1
touch {work}/ready-$SLURM_JOB_ID
while [ ! -e {work}/gate-$SLURM_JOB_ID ]; do sleep 0.1; done
srun jobns run -- true
"""


def test_gc_asks_the_controller_and_keeps_running_jobs(slurm: SlurmCluster) -> None:
    """`jobns gc` on a compute asks slurmctld (squeue) about the jobs recorded on the
    node: it keeps a running job and removes one the controller never knew."""
    node = slurm.computes[0]
    stray = "987654"  # never a job of this cluster: as if left by a crash before a reboot
    node.exec(["jobns", "setup", "--job-id", stray, "--user", ALICE]).check("jobns setup")
    job_id = slurm.sbatch(ALICE, GATED.format(work=WORK), wait=False)
    try:
        deadline = time.monotonic() + 60
        while slurm.controller.exec(["test", "-e", f"{WORK}/ready-{job_id}"]).exit_code:
            assert time.monotonic() < deadline and not slurm.unusable(), slurm.logs()
            time.sleep(0.2)
        r = node.exec(["jobns", "gc"]).check("jobns gc")
        assert f"Slurm does not know job {stray}" in r.stdout + r.stderr, r
        listing = node.exec(["ls", JOBS]).check(f"ls {JOBS}").stdout.split()
        assert [j for j in listing if not j.endswith(".lock")] == [job_id], (listing, r)
        assert node.exec(["test", "-e", f"/tmp/job-{stray}"]).exit_code == 1, r
    finally:
        slurm.controller.exec(["touch", f"{WORK}/gate-{job_id}"])
    assert slurm.wait_done(job_id) == ("COMPLETED", "0:0"), slurm.output(job_id)
    assert_no_trace(slurm, job_id)


# A rootless bundle of alice's on the shared volume: busybox, /proc bound from the node
# (a fresh procfs is refused inside a container whose /proc has docker's masked paths).
BUNDLE = """\
set -e
rm -rf "$1"; mkdir -p "$1/rootfs/bin" "$1/rootfs/proc" "$1/rootfs/dev" "$1/rootfs/sys" \
    "$1/rootfs/tmp" "$1/rootfs/var/tmp"
cp /bin/busybox "$1/rootfs/bin/"
for c in sh cat echo grep cut; do ln -s busybox "$1/rootfs/bin/$c"; done
mkdir "$1/rootfs/usr"; ln -s ../bin "$1/rootfs/usr/bin"  # 24.11+ run srun's resolved path
cd "$1" && runc spec --rootless
python3 -c '
import json
doc = json.load(open("config.json"))
doc["process"]["terminal"] = False
for m in doc["mounts"]:
    if m["destination"] == "/proc":
        m.update(type="none", source="/proc", options=["rbind", "nosuid", "nodev", "noexec"])
doc["linux"]["namespaces"] = [n for n in doc["linux"]["namespaces"] if n["type"] != "pid"]
json.dump(doc, open("config.json", "w"), indent=1)
'
"""


def test_srun_container_gets_the_jobs_directories(slurm: SlurmCluster, release: Release) -> None:
    bundle = f"{WORK}/bundle-{release.suite}"
    for n in slurm.computes:
        n.exec(["install", "-d", "-o", ALICE, "-g", ALICE, "-m", "0700", f"/run/user/{ALICE_UID}"])
    slurm.computes[0].exec(["sh", "-c", BUNDLE, "sh", bundle], user=ALICE).check("make bundle")
    show = 'grep -E " /(tmp|var/tmp|dev/shm) " /proc/self/mountinfo | cut -d" " -f4,5'
    script = (
        "#!/bin/sh\n"
        f"srun --container={bundle} sh -c 'echo $TMPDIR $JOBNS_JOB_ID; "
        f"echo one > /tmp/f; echo seg > /dev/shm/s; {show}'\n"
        f"srun --container={bundle} sh -c 'cat /tmp/f /dev/shm/s'\n"
        # The batch script itself runs on the node: the job's tree has the file.
        "cat /tmp/job-$SLURM_JOB_ID/tmp/f\n"
    )
    job_id = slurm.sbatch(ALICE, script)
    # (without cgroups in the node, runc warns on stderr: 'time="..." level=warning ...')
    out = [ln for ln in slurm.output(job_id).splitlines() if not ln.startswith("time=")]
    assert out[0] == f"/tmp {job_id}", out
    assert sorted(out[1:4]) == sorted(
        [
            f"/job-{job_id} /dev/shm",
            f"/tmp/job-{job_id}/tmp /tmp",
            f"/tmp/job-{job_id}/var_tmp /var/tmp",
        ]
    ), out
    assert out[4:] == ["one", "seg", "one"], out
    assert_no_trace(slurm, job_id)


def test_finally_no_node_keeps_anything_of_any_job(slurm: SlurmCluster) -> None:
    """After all the jobs above (this module runs in file order)."""
    assert leftovers(slurm) == []
    assert slurm.controller.exec(["squeue", "-h"]).check("squeue").stdout.strip() == ""


# Linux 6.18 gives mount namespaces ids from per-CPU batches (gen_cookie_next) and
# still refuses, as a "mount namespace loop", to bind-mount /proc/PID/ns/mnt when the
# caller's mount namespace id is >= the target's (fs/namespace.c mnt_ns_loop). A
# namespace made later on another CPU can have the smaller id, so `jobns setup` run
# from any mount namespace but the host's first one (slurmd in a container, a systemd
# unit with PrivateTmp=...) fails at random with EINVAL pinning the job's namespace.
# Made deterministic here: CPU 1 is driven onto a fresh batch of ids (4200 unshares >
# the batch of 4096), a mount namespace made there (like a container's) runs `jobns
# setup` on CPU 0, whose batch is older, so the holder's namespace gets the smaller id.
BURN = """\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for _ in range(4200):
    if libc.unshare(0x00020000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
"""
SETUP_ON_CPU0 = """\
taskset -p -c 0 $$ >/dev/null
jobns setup --job-id 7 --user alice; echo "setup exit $?"
grep -c nsfs /proc/self/mountinfo | sed 's/^/pins while set up: /'
jobns teardown --job-id 7; echo "teardown exit $?"
grep nsfs /proc/self/mountinfo | sed 's/^/left: /'
ls -A /run/jobns/jobs | sed 's/^/left: /'
"""


def test_setup_pins_the_job_whatever_cpu_made_its_namespace(
    docker_client: Any, rig_image: str
) -> None:
    with Rig(rig_image, 1, client=docker_client) as rig:
        node = rig.nodes[0]
        cpus = node.exec(["nproc"]).check("nproc").stdout.strip()
        assert int(cpus) >= 2, f"needs two CPUs to make two batches of ids, not {cpus}"
        node.exec(["taskset", "-c", "1", "/usr/bin/python3", "-c", BURN]).check("burn ids")
        r = node.exec(
            [
                "taskset",
                "-c",
                "1",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                SETUP_ON_CPU0,
            ]
        )
        out = r.stdout + r.stderr
        assert "setup exit 0" in r.stdout and "teardown exit 0" in r.stdout, out
        assert "left: " not in r.stdout, out
        assert "pins while set up: 2" in r.stdout, out  # the user and the mount pin


# ---------------------------------------------------------------- enforced (issue 11)
# The same cluster deployed as docs/admin.md "Enforced by Slurm": the jobns SPANK plugin in
# PlugStackConfig and `[slurm] enforce = true`. Nothing is wrapped in `jobns run` unless
# said so: the batch script, an unwrapped step and an interactive `srun --pty` step all
# land in the job's namespace on each node.


@pytest.fixture(scope="module")
def enforced(docker_client: Any, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(
        release_image, hostnames=["ctl", *COMPUTES], client=docker_client, config={"kill_wait": 2}
    ) as rig:
        cluster = SlurmCluster(rig, "ctl", COMPUTES, jobns=True, enforce=True)
        cluster.start()
        BASELINE.update({n.container.name: mountpoints(n) for n in cluster.computes})
        yield cluster
        assert enforced_leftovers(cluster) == []


def enforced_leftovers(cluster: SlurmCluster) -> list[str]:
    found = []
    for n in cluster.computes:
        r = n.sh(
            f"ls -d /tmp/job-* /var/tmp/job-* /dev/shm/job-* /tmp/*-from-* "
            f"/dev/shm/*-from-* {JOBS}/* 2>/dev/null; true"
        )
        found += [f"{n.hostname}: {p}" for p in r.stdout.split()]
        before = BASELINE[n.container.name]
        for point, fstype in mountpoints(n).items():
            if fstype == "nsfs" or (point not in before and point != STATE):
                found.append(f"{n.hostname}: mount {point} ({fstype})")
    states = cluster.node_states()
    found += [f"{h}: Slurm state {states.get(h)}" for h in COMPUTES if states.get(h) != "idle"]
    return found


EVERY_PATH = """\
#!/bin/sh
#SBATCH -N2
# the batch script (on the first node), an unwrapped step, a wrapped one, an interactive one
echo batch $(hostname) $(readlink /proc/self/ns/mnt) $TMPDIR
echo a > /tmp/batch-from-$(hostname)
srun -N2 sh -c 'h=$(hostname); echo p > /tmp/plain-from-$h; echo s > /dev/shm/shm-from-$h; \
echo plain $h $(readlink /proc/self/ns/mnt) $(df -B1 --output=size /dev/shm | tail -1) $(ls /tmp)'
srun -N2 jobns run -- sh -c 'echo wrapped $(hostname) $(readlink /proc/self/ns/mnt) \
$PMIX_SERVER_TMPDIR'
script -qec "srun -N2 sh -c 'echo pty \\$(hostname) \\$(readlink /proc/self/ns/mnt); \
echo t > /tmp/pty-from-\\$(hostname)'" /dev/null
"""


def test_enforced_two_node_job_every_process_in_each_nodes_namespace(
    enforced: SlurmCluster,
) -> None:
    job_id = enforced.sbatch(
        ALICE,
        EVERY_PATH,
        "--comment=jobns: shared_tmpdir=per-node; no_rm_tmpdir; shm capacity=64MiB",
    )
    out = enforced.output(job_id)
    lines = [ln.replace("^@", "").split() for ln in out.splitlines()]
    seen: dict[tuple[str, str], list[str]] = {(w[0], w[1]): w[2:] for w in lines if len(w) > 2}
    first = next(h for (kind, h) in seen if kind == "batch")
    for host in COMPUTES:
        ns = {seen[(kind, host)][0] for kind in ("plain", "wrapped", "pty")}
        if host == first:
            ns.add(seen[("batch", host)][0])
        assert len(ns) == 1, out  # one namespace per node, whatever started the process
        node_ns = enforced.rig.node(host).exec(["readlink", "/proc/self/ns/mnt"]).stdout
        assert ns != {node_ns.strip()}, out
        assert seen[("plain", host)][1] == str(64 << 20), out  # the shm capacity
        assert seen[("wrapped", host)][1] == "/tmp/pmix", out
        listing = seen[("plain", host)][2:]
        assert f"plain-from-{host}" in listing and not any(
            f.endswith(f"-from-{other}") for other in COMPUTES if other != host for f in listing
        ), out  # each node's /tmp is its own
    assert seen[("batch", first)][1] == "/tmp", out
    assert_no_trace(enforced, job_id, keep_shared=True)
    top = f"{SHARED}/job-{job_id}"
    try:
        for host in COMPUTES:
            files = enforced.controller.exec(["ls", "-A", f"{top}/{host}/tmp"]).check("ls")
            want = {f"plain-from-{host}", f"pty-from-{host}", "pmix"}
            if host == first:
                want.add(f"batch-from-{host}")
            assert set(files.stdout.split()) == want, (host, files.stdout)
    finally:
        enforced.controller.exec(["rm", "-rf", "--one-file-system", top])


PID_JOB = """\
#!/bin/sh
#SBATCH -N2
echo batch $(hostname) $(readlink /proc/self/ns/pid) $(tr '\\0' _ < /proc/1/cmdline) \
$(ls -d /proc/[0-9]* | wc -l)
srun -N2 sh -c 'echo step $(hostname) $(readlink /proc/self/ns/pid) \
$(tr "\\0" _ < /proc/1/cmdline) $(ls -d /proc/[0-9]* | wc -l)'
srun -N1 sh -c 'exit 3'; echo exit $?
"""


def test_enforced_pid_namespace_per_job(enforced: SlurmCluster) -> None:
    """[namespace] pid = true (issue 24): the SPANK plugin joins the job's PID namespace in
    slurmstepd before it forks the tasks, so the batch script and every step's task on a
    node are in that node's PID namespace of the job, whose PID 1 is jobns-init, and
    /proc lists only the job's processes; the epilog leaves nothing."""
    nodes = enforced.computes
    for n in nodes:
        n.sh(f"printf '[namespace]\\npid = true\\n' >> {CONFIG_PATH}").check("set pid")
    try:
        job_id = enforced.sbatch(ALICE, PID_JOB)
        out = enforced.output(job_id)
        seen = [ln.replace("^@", "").split() for ln in out.splitlines()]
        rows = {(w[0], w[1]): w[2:] for w in seen if len(w) == 5}
        first = next(h for (kind, h) in rows if kind == "batch")
        for host in COMPUTES:
            step = rows[("step", host)]
            node_ns = enforced.rig.node(host).exec(["readlink", "/proc/self/ns/pid"]).stdout
            assert step[0] != node_ns.strip() and step[1] == "jobns-init_infinity_", out
            assert int(step[2]) < 12, out  # the init, the step's few processes: not the node's
            if host == first:
                assert rows[("batch", host)][:2] == step[:2], out  # one namespace per node
        assert ["exit", "3"] in seen, out  # the task's exit code, through the plugin's fork
        assert_no_trace(enforced, job_id)
    finally:
        for n in nodes:
            n.sh(f"sed -i '/^\\[namespace\\]/,$d' {CONFIG_PATH}").check("unset pid")


def test_enforced_refused_job_fails_on_both_nodes_and_they_stay_idle(
    enforced: SlurmCluster,
) -> None:
    job_id = enforced.sbatch(
        ALICE,
        "#!/bin/sh\n#SBATCH -N2\necho batch-ran\nsrun -N2 true\n",
        "--comment=jobns: shm capacity=2gib",
        wait=False,
    )
    state, code = enforced.wait_done(job_id)
    out = enforced.output(job_id)
    assert state == "FAILED" and code == "1:0", (state, code, out)
    assert "batch-ran" not in out and "was refused by jobns setup" in out, out
    assert_no_trace(enforced, job_id)
    assert enforced.node_states() == {h: "idle" for h in COMPUTES}


SLOW_PRE_RUN = "#!/bin/sh\nsleep 2\n"
SLOW_JOB = """\
#!/bin/sh
#SBATCH -N1 -w node1
readlink /proc/self/ns/mnt
srun -N1 sh -c 'readlink /proc/self/ns/mnt; echo $TMPDIR'
"""


# What a job's tasks are told when the node failed its background setup (the job is
# then "requeued", or "failed" when Slurm would not requeue it)
# lifecycle.node_failed_reason's words
NODE_FAILED = "the node failed to set the job up; it is drained, and the job is requeued where "


def requeued(cluster: SlurmCluster, job_id: str) -> bool:
    """Slurm ran the job once and put it back in the queue."""
    r = cluster.controller.exec(["scontrol", "-o", "show", "job", job_id], timeout=10)
    return "JobState=PENDING" in r.stdout and "Restarts=0" not in r.stdout


def test_enforced_prolog_returns_at_once_and_tasks_wait_for_setup(
    enforced: SlurmCluster,
) -> None:
    """docs/admin.md "What the prolog and epilog wait for": slurmd made tasks-wait when it
    loaded the plugin, so the prolog left setup running on its own. A setup made slow by
    a 2 s pre-run program still has every task of the job in its namespace (the plugin
    waited). A setup that the node fails (pre-run fails) drains only that node, through
    scontrol, with the reason, and requeues the batch job with the reason in its
    AdminComment (a job Slurm will not requeue, or one whose batch task ended first,
    fails instead, its tasks saying why)."""
    node1 = enforced.rig.node("node1")
    for n in enforced.computes:
        n.exec(["test", "-f", "/run/jobns/tasks-wait"]).check("slurmd made tasks-wait")
    node1.sh(
        f"printf '{SLOW_PRE_RUN}' > /usr/local/sbin/slow-pre-run && "
        "chmod 0755 /usr/local/sbin/slow-pre-run && "
        f"printf '[lifecycle]\\npre_run = \"/usr/local/sbin/slow-pre-run\"\\n' >> {CONFIG_PATH}"
    ).check("a slow pre-run program")
    try:
        job_id = enforced.sbatch(ALICE, SLOW_JOB)
        out = enforced.output(job_id).split()
        node_ns = node1.exec(["readlink", "/proc/self/ns/mnt"]).stdout.strip()
        assert len(out) == 3 and out[0] == out[1] != node_ns and out[2] == "/tmp", out
        assert_no_trace(enforced, job_id)

        node1.sh(f"sed -i 's|slow-pre-run|false-pre-run|' {CONFIG_PATH}").check("edit")
        node1.sh(
            "printf '#!/bin/sh\\nexit 3\\n' > /usr/local/sbin/false-pre-run && "
            "chmod 0755 /usr/local/sbin/false-pre-run"
        ).check("a failing pre-run program")
        failed = enforced.sbatch(ALICE, SLOW_JOB, wait=False)
        try:
            check_node_failed_setup(enforced, failed)
        finally:
            # whatever the verdict, the tests after this one find node1 clean: what jobns
            # left of the job (nothing, when the test passed) is gc's to end
            enforced.controller.exec(["scancel", failed], timeout=30)
            deadline = time.monotonic() + 30
            while enforced.in_queue(failed) and time.monotonic() < deadline:
                time.sleep(0.2)
            node1.exec(["jobns", "gc"])
    finally:
        node1.sh(f"sed -i '/^\\[lifecycle\\]/,$d' {CONFIG_PATH}").check("restore the config")
        enforced.controller.exec(["scontrol", "update", "NodeName=node1", "State=RESUME"])
    deadline = time.monotonic() + 30
    while left := enforced_leftovers(enforced):  # node1 idle again, nothing left anywhere
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def check_node_failed_setup(enforced: SlurmCluster, job_id: str) -> None:
    """The job's setup on node1 failed by the node's fault: node1 (only) is drained with
    the reason; the job is requeued with the reason in its AdminComment, or FAILED with
    its tasks saying the node is at fault; and, once it is cancelled, nothing of it is
    left on any node with no gc."""
    node1 = enforced.rig.node("node1")
    deadline = time.monotonic() + 60
    while (state := enforced.job_state(job_id)[0]) != "FAILED" and not requeued(enforced, job_id):
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    text = enforced.output(job_id)
    helper_log = node1.sh("tail -n 40 /var/log/jobns-helper.log").stdout
    if state == "FAILED":
        # the reason reached the batch task before the requeue did (or Slurm did not
        # requeue it): the tasks say the node is at fault
        assert NODE_FAILED in text and "(not a problem of the job's)" in text, (text, helper_log)
    else:
        # jobns drained node1, then requeued the job: it waits for node1 (-w node1) with
        # the reason in its AdminComment. Its tasks, if they saw the failure at all
        # before Slurm killed them, saw the node's fault, never "not set up" (which
        # says the prolog did not run).
        show = enforced.controller.exec(["scontrol", "-o", "show", "job", job_id])
        admin = show.check("scontrol show job").stdout
        assert "AdminComment=jobns on node1: node failed to set it up: " in admin, admin
        assert "is not set up on this node" not in text, (text, helper_log)
        enforced.scancel(job_id)
        while enforced.job_state(job_id)[0] != "CANCELLED":
            assert time.monotonic() < deadline, enforced.job_state(job_id)
            time.sleep(0.2)
    deadline = time.monotonic() + 30
    while "node1" not in (bad := enforced.unusable()):
        assert time.monotonic() < deadline, (enforced.node_states(), helper_log)
        time.sleep(0.2)
    assert "jobns setup" in bad["node1"] and "node2" not in bad, bad
    # The run on node1 is over: its epilog tore it down (no gc), drained node or not.
    deadline = time.monotonic() + 60
    while left := [ln for ln in enforced_leftovers(enforced) if "Slurm state" not in ln]:
        assert time.monotonic() < deadline, (
            left,
            node1.sh("tail -n 40 /var/log/jobns-helper.log").stdout,
            enforced.logs(),
        )
        time.sleep(0.25)


# ------------------------------------------------------- runs of a job (issue 30)
# The host's Slurm 22.05 has the same tests (tests/e2e/test_slurm_enforced.py); here they
# run on every release, on two nodes with the resident helper.


def in_state_dir(cluster: SlurmCluster, job_ids: list[str]) -> list[str]:
    """`host: name` of each job directory of job_ids under JOBS on a compute node (the
    scripts' marks and the locks aside)."""
    found = []
    for n in cluster.computes:
        r = n.sh(f'cd {JOBS} 2>/dev/null && for f in *; do [ -d "$f" ] && echo "$f"; done')
        found += [f"{n.hostname}: {name}" for name in r.stdout.split() if name in job_ids]
    return found


def job_mounts(cluster: SlurmCluster, job_ids: list[str]) -> list[str]:
    """`host: mount point` of each mount of job_ids' in a compute node's mount table."""
    return [
        f"{n.hostname}: {point}"
        for n in cluster.computes
        for point in mountpoints(n)
        if any(f"job-{j}" in point.split("/") or point.startswith(f"{JOBS}/{j}/") for j in job_ids)
    ]


def wait_file(cluster: SlurmCluster, path: str, job_id: str, timeout: float = 120) -> None:
    """Until path exists on the shared volume; fails at once when the job ended or a node
    is drained meanwhile."""
    deadline = time.monotonic() + timeout
    while cluster.controller.exec(["test", "-e", path]).exit_code != 0:
        state = cluster.job_state(job_id)[0]
        bad = cluster.unusable()
        if time.monotonic() > deadline or state in FINAL or bad:
            pytest.fail(
                f"job {job_id} ({state}): no {path} after {timeout:g}s; Slurm does not use "
                f"{bad}\n--- job output\n{cluster.output(job_id)}{cluster.logs()}",
                pytrace=False,
            )
        time.sleep(0.2)


# squeue's states of a job between its runs
BETWEEN_RUNS = ("COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


def eligible_now(cluster: SlurmCluster, job_id: str, timeout: float = 150) -> None:
    """Until a requeued job runs again (or ended). Slurm lets it start once its last
    credential expired (the rig's cred_expire=30); an administrator's StartTime=now
    would let it start sooner, but slurmd then may skip its prolog (it still holds the
    job id), which no user can cause."""
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.controller.exec(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=10)
        q = r.stdout.strip()
        if r.exit_code == 0 and q not in ("PENDING", *BETWEEN_RUNS):
            return
        assert time.monotonic() < deadline, f"job {job_id} still {q}\n{cluster.logs()}"
        time.sleep(0.5)


def scontrol(cluster: SlurmCluster, *args: str, user: str = "root") -> None:
    cluster.controller.exec(["scontrol", *args], user=user, timeout=30).check(
        f"scontrol {' '.join(args)} as {user}"
    )


def test_enforced_jobs_that_end_at_once_leave_nothing_set_up(enforced: SlurmCluster) -> None:
    """Ten jobs whose launch fails at once (their output file cannot be opened): slurmd
    runs each epilog right after its prolog returned, before the setup the prolog handed
    on has run. None may stay set up once Slurm ended it (no job directory, no /dev/shm
    capacity mounted), and no node drains."""
    argv = [
        "sbatch",
        "--parsable",
        f"--chdir={WORK}",
        "-o",
        "/nonexistent/x.out",
        "--comment=jobns: shm capacity=64MiB",
        "--wrap",
        "true",
    ]
    ids = []
    for _ in range(10):
        r = enforced.controller.exec(argv, user=ALICE, timeout=30).check("sbatch as alice")
        ids.append(r.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 120
    while [j for j in ids if enforced.in_queue(j)] or in_state_dir(enforced, ids):
        bad = enforced.unusable()
        assert not bad and time.monotonic() < deadline, (
            [j for j in ids if enforced.in_queue(j)],
            in_state_dir(enforced, ids),
            bad,
            enforced.logs(),
        )
        time.sleep(0.25)
    time.sleep(1)  # a late setup would have set a job up again by now
    assert in_state_dir(enforced, ids) == []
    assert job_mounts(enforced, ids) == []
    assert enforced.unusable() == {}
    for job_id in ids:
        state = enforced.job_state(job_id)[0]
        assert state in FINAL and state != "COMPLETED", (job_id, state)  # its launch failed
    deadline = time.monotonic() + 30
    while left := enforced_leftovers(enforced):
        assert time.monotonic() < deadline, (left, enforced.logs())
        time.sleep(0.25)


SHM_RUNS = """\
#!/bin/sh
#SBATCH -N1 -w node1
df -k --output=size /dev/shm | tail -1 >> {work}/shm-{tag}
touch {work}/ready-{tag}-${{SLURM_RESTART_COUNT:-0}}
while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done
"""


def test_enforced_requeue_with_other_options_never_drains_the_node(
    enforced: SlurmCluster,
) -> None:
    """requeuehold, a new comment, release: the job's second run (Slurm's restart count)
    on the same node asks for other options than its first. The last run is ended and
    the new one set up as asked: a 32 MiB /dev/shm after a 64 MiB one; no node drains."""
    tag = uuid.uuid4().hex[:8]
    script = SHM_RUNS.format(work=WORK, tag=tag)
    job_id = enforced.sbatch(ALICE, script, "--comment=jobns: shm capacity=64MiB", wait=False)
    try:
        wait_file(enforced, f"{WORK}/ready-{tag}-0", job_id)
        scontrol(enforced, "requeuehold", job_id)
        scontrol(enforced, "update", f"JobId={job_id}", "Comment=jobns: shm capacity=32MiB")
        scontrol(enforced, "release", job_id)
        eligible_now(enforced, job_id)
        wait_file(enforced, f"{WORK}/ready-{tag}-1", job_id)
    finally:
        enforced.controller.exec(["touch", f"{WORK}/gate-{tag}"])
    state, code = enforced.wait_done(job_id)
    out = enforced.output(job_id)
    assert (state, code) == ("COMPLETED", "0:0"), (state, code, out)
    sizes = enforced.controller.exec(["cat", f"{WORK}/shm-{tag}"]).check("cat shm").stdout
    assert sizes.split() == [str(64 * 1024), str(32 * 1024)], (sizes, out)
    assert enforced.unusable() == {}
    assert_no_trace(enforced, job_id)


STAGE_OUT_RUNS = """\
#!/bin/sh
#SBATCH -N1 -w node1
echo out-${{SLURM_RESTART_COUNT:-0}} > /tmp/out-{tag}
touch {work}/ready-{tag}-${{SLURM_RESTART_COUNT:-0}}
while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done
"""


def record_state(node: Node, job_id: str) -> str | None:
    """The state of the job's record on the node (`jobns status`), None without one."""
    r = node.exec(["jobns", "status", "--format", "json"]).check("jobns status")
    for job in json.loads(r.stdout)["jobs"]:
        if str(job.get("job_id")) == job_id:
            return str(job.get("state"))
    return None


def test_enforced_failed_stage_out_and_requeue_never_drain_the_node(
    enforced: SlurmCluster,
) -> None:
    """Her stage-out destination is not writable (her own 0500 directory): the epilog
    keeps the run in staging-out. Her own `scontrol requeue` then runs a new setup on
    the same node, which ends the last run first: that fails on her data, so the new run
    is refused with the reason ("last run") and no node drains. Once she fixed the
    directory, the administrator's `jobns teardown --job-id N` stages out and nothing
    is left."""
    node1 = enforced.rig.node("node1")
    saved = {n.hostname: n.get_file(CONFIG_PATH) for n in enforced.computes}
    tag = uuid.uuid4().hex[:8]
    ro = f"{WORK}/ro-{tag}"
    for n in enforced.computes:
        n.sh(f"printf '[staging]\\nstage_roots = [\"{WORK}\"]\\n' >> {CONFIG_PATH}").check(
            "add a stage root"
        )
    enforced.controller.exec(["install", "-d", "-o", ALICE, "-g", ALICE, "-m", "0500", ro]).check(
        f"mkdir {ro}"
    )
    job_id = ""
    try:
        job_id = enforced.sbatch(
            ALICE,
            STAGE_OUT_RUNS.format(work=WORK, tag=tag),
            f"--comment=jobns: stage_out source=/tmp/out-{tag} destination={ro}/out",
            wait=False,
        )
        wait_file(enforced, f"{WORK}/ready-{tag}-0", job_id)
        enforced.controller.exec(["touch", f"{WORK}/gate-{tag}"]).check("open the gate")
        deadline = time.monotonic() + 60
        while (kept := record_state(node1, job_id)) != "staging-out":  # the epilog kept it
            assert time.monotonic() < deadline and not enforced.unusable(), (
                kept,
                enforced.job_state(job_id),
                enforced.unusable(),
                enforced.output(job_id),
                node1.sh("tail -n 30 /var/log/jobns-helper.log").stdout,
            )
            time.sleep(0.25)
        enforced.controller.exec(["rm", f"{WORK}/gate-{tag}"]).check("close the gate")
        assert enforced.unusable() == {}
        scontrol(enforced, "requeue", job_id, user=ALICE)  # her own
        eligible_now(enforced, job_id)
        deadline = time.monotonic() + 120
        while "was refused" not in (out := enforced.output(job_id)):
            bad = enforced.unusable()
            assert not bad and time.monotonic() < deadline, (
                bad,
                enforced.job_state(job_id),
                out,
                node1.sh("tail -n 30 /var/log/jobns-helper.log").stdout,
            )
            time.sleep(0.25)
        assert "last run" in out, out
        assert enforced.unusable() == {}
    finally:
        if job_id:
            enforced.controller.exec(["scancel", job_id], timeout=30)
        enforced.controller.exec(["touch", f"{WORK}/gate-{tag}"])
        enforced.controller.exec(["chmod", "0700", ro])
    try:
        # The administrator's part, once she fixed it: the kept run resumes its stage-out.
        deadline = time.monotonic() + 60
        while enforced.in_queue(job_id):
            assert time.monotonic() < deadline, enforced.job_state(job_id)
            time.sleep(0.25)
        r = node1.exec(["jobns", "teardown", "--job-id", job_id])
        assert r.exit_code == 0, r
        assert_no_trace(enforced, job_id)
        staged = enforced.controller.exec(["cat", f"{ro}/out"]).check("cat the staged output")
        assert staged.stdout == "out-0\n", staged
        assert enforced.unusable() == {}
    finally:
        if job_id:  # (done above when the test passed; a failure leaves the kept run)
            node1.exec(["jobns", "teardown", "--job-id", job_id])
        for n in enforced.computes:
            n.put_file(CONFIG_PATH, saved[n.hostname])
        enforced.controller.exec(["rm", "-rf", ro])
