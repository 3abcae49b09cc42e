"""HPC container runtimes on Slurm 26.05 (Debian forky's node image, which alone has them:
containers/images.py FORKY): what a container started from inside a job gets of the job's
/tmp, /var/tmp and /dev/shm (docs/containers.md "Container runtimes, one by one").

charliecloud (`ch-run` 0.45, unprivileged): jobs of the ordinary user alice on a cluster
deployed as docs/admin.md "Enforced by Slurm" (the SPANK plugin and `[slurm] enforce`),
so every process of the job, ch-run included, starts in the job's namespace. Observed:
by default ch-run binds its caller's /tmp (the job's) and /dev (so /dev/shm is the job's);
/var/tmp is the image's own (read-only, like the whole image); `--private-tmp` gives a
fresh tmpfs on /tmp; `--bind /var/tmp` gives the job's /var/tmp. A second job running at
the same time and the node itself never see one another's files.

Podman 5.8 (crun 1.28), as root in a node of its own (no Slurm: Podman is root's here,
as on the host with 4.3, tests/e2e/test_oci_runtimes.py and test_cdi.py): the packaged
hooks.d file and the CDI spec, at cdiVersion 0.5.0 (jobns's default, which Podman 4.3
needs) and 1.0.0 (which Podman 5.8 accepts too). That node has the PODMAN privileges
(containers/privileges.py says why each is needed); Podman runs with --cgroups=disabled
(the node's cgroup file system is read-only), so with crun, not runc.

Only with forky among JOBNS_RIG_RELEASES (all releases when unset).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers import images
from containers.privileges import PODMAN, ROOTLESS_RUNC
from containers.rig import ExecResult, Node, Rig
from containers.slurm import WORK, SlurmCluster
from tests.e2e.conftest import rig_releases

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        "forky" not in rig_releases(), reason="JOBNS_RIG_RELEASES leaves out forky (26.05)"
    ),
]

ALICE, ALICE_ID = "alice", "1001"
BOB_ID = "1002"
CDI_DIR = "/var/run/cdi"
ROOTFS = "/srv/busybox-rootfs"  # Podman's --rootfs in the podman node
HOOKS_ERR = "/var/log/oci-hooks.err"  # crun writes a hook's stderr only there
PODMAN_RUN = (
    "podman --storage-driver vfs --runtime crun run --cgroups=disabled --rm "
    f"--network=none --annotation run.oci.hooks.stderr={HOOKS_ERR}"
)
# A busybox image directory as a user makes one by hand (no registry, no builder): the
# applets a test uses, and the files ch-run binds over (/etc/passwd, /etc/group, /etc/hosts,
# /etc/resolv.conf must exist in the image).
MAKE_IMAGE = """\
img=$1
mkdir -p $img/bin $img/tmp $img/var/tmp $img/dev $img/proc $img/sys $img/etc $img/home $img/mnt
cp /bin/busybox $img/bin/
for a in sh ls cat echo grep cut id wc sort; do ln -sf busybox $img/bin/$a; done
touch $img/etc/passwd $img/etc/group $img/etc/hosts $img/etc/resolv.conf
chmod 1777 $img/tmp $img/var/tmp
"""
# What a container shows: the files in its /tmp, /var/tmp, /dev/shm, sorted, on one line
# each (busybox ls), and whether /var/tmp is writable.
SHOW = (
    "echo tmp $(ls -A /tmp | sort); echo var_tmp $(ls -A /var/tmp | sort); "
    "echo shm $(ls -A /dev/shm | sort); "
    "if echo w > /var/tmp/ct-wrote 2>/dev/null; then echo var_tmp_writable yes; "
    "else echo var_tmp_writable no; fi"
)


def seen(output: str, tag: str) -> dict[str, list[str]]:
    """Lines `TAG KEY WORDS...` -> {KEY: WORDS}."""
    found = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == tag:
            found[words[1]] = words[2:]
    return found


@pytest.fixture(scope="module")
def forky_image(docker_client: Any) -> str:
    from containers.errors import RigError

    try:
        return images.build(docker_client, release_name="forky").node
    except RigError as e:
        pytest.fail(f"build the forky rig images: {e}", pytrace=False)


@pytest.fixture(scope="module")
def enforced(docker_client: Any, forky_image: str) -> Iterator[SlurmCluster]:
    t0 = time.monotonic()
    with Rig(
        forky_image,
        hostnames=["ctl", "node1"],
        client=docker_client,
        config={"kill_wait": 2},
        privileges=ROOTLESS_RUNC,  # ch-run's pivot_root (containers/privileges.py)
    ) as rig:
        # two CPUs: two one-task jobs at once on node1
        cluster = SlurmCluster(rig, "ctl", ["node1"], jobns=True, enforce=True, cpus=2)
        cluster.start()
        rig.log(f"forky enforced cluster up in {time.monotonic() - t0:.1f}s")
        yield cluster


# ------------------------------------------------------------------------- charliecloud
CH_JOB = """\
#!/bin/sh
#SBATCH -N1 -n1
set -e
img=$HOME/ch-img-$SLURM_JOB_ID
sh {work}/make-image.sh $img
echo job > /tmp/from-job; echo job > /var/tmp/from-job; echo job > /dev/shm/from-job
echo batch tmpdir $TMPDIR
ch-run $img -- sh -c '{show}' | sed 's/^/default /'
ch-run $img -- sh -c 'echo ct > /tmp/from-ct; echo ct > /dev/shm/from-ct'
ch-run --private-tmp $img -- sh -c '{show}; echo pt > /tmp/from-private' | sed 's/^/private /'
ch-run --bind /var/tmp $img -- sh -c '{show}' | sed 's/^/bindvt /'
ch-run $img -- grep -E ' /(tmp|var/tmp|dev|dev/shm) ' /proc/self/mountinfo | sed 's/^/mount /'
echo batch tmp $(ls -A /tmp | sort)
echo batch shm $(ls -A /dev/shm | sort)
rm -rf $img
# hold the job's files until the other job has looked (a file on the shared volume)
i=0
while [ ! -e {work}/gate-$SLURM_JOB_ID ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
""".format(work=WORK, show=SHOW.replace("'", "'\\''"))

OTHER_JOB = """\
#!/bin/sh
#SBATCH -N1 -n1
set -e
img=$HOME/ch-img-$SLURM_JOB_ID
sh {work}/make-image.sh $img
ch-run $img -- sh -c '{show}' | sed 's/^/other /'
rm -rf $img
""".format(work=WORK, show=SHOW.replace("'", "'\\''"))


def test_charliecloud_in_an_enforced_job(enforced: SlurmCluster) -> None:
    node = enforced.computes[0]
    enforced.controller.put_file(f"{WORK}/make-image.sh", MAKE_IMAGE)
    # the node's own /tmp, /var/tmp and /dev/shm: never a job's
    node.sh(
        "echo node > /tmp/from-node; echo node > /var/tmp/from-node; echo node > /dev/shm/from-node"
    ).check("node markers")
    try:
        first = enforced.sbatch(ALICE, CH_JOB, wait=False)
        wait_running(enforced, first)
        # the first job holds its files until the gate: this one runs beside it
        other = enforced.sbatch(ALICE, OTHER_JOB)
        node.exec(["touch", f"{WORK}/gate-{first}"]).check("open the gate")
        state, code = enforced.wait_done(first)
        out = enforced.output(first)
        assert (state, code) == ("COMPLETED", "0:0"), out + enforced.logs()
    finally:
        node.sh("rm -f /tmp/from-node /var/tmp/from-node /dev/shm/from-node")
    assert seen(out, "batch")["tmpdir"] == ["/tmp"], out
    # Default: the caller's /tmp (the job's) and /dev (so /dev/shm is the job's); /var/tmp
    # is the image's, read-only like the image.
    default = seen(out, "default")
    assert default["tmp"] == ["from-job"], out
    assert default["shm"] == ["from-job"], out
    assert (default["var_tmp"], default["var_tmp_writable"]) == ([], ["no"]), out
    # What a default container writes in /tmp and /dev/shm is in the job's directories.
    batch = seen(out, "batch")
    assert batch["tmp"] == ["from-ct", "from-job"] == batch["shm"], out
    # --private-tmp: a fresh tmpfs on /tmp (nothing of the job's, nothing kept after)
    private = seen(out, "private")
    assert private["tmp"] == [] and private["shm"] == ["from-ct", "from-job"], out
    # --bind /var/tmp: the job's /var/tmp, writable
    bindvt = seen(out, "bindvt")
    assert (bindvt["var_tmp"], bindvt["var_tmp_writable"]) == (["from-job"], ["yes"]), out
    # The other job, running at the same time on the same node: its own empty directories.
    theirs = seen(enforced.output(other), "other")
    assert theirs["tmp"] == [] and theirs["shm"] == [] and theirs["var_tmp"] == [], theirs
    # And the node's files never reached a container, nor a container's the node.
    assert "from-node" not in out + enforced.output(other), out
    left = node.sh("ls -A /tmp /var/tmp /dev/shm").stdout
    assert "from-ct" not in left and "from-job" not in left and "from-private" not in left


def wait_running(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, _ = cluster.job_state(job_id)
        if state == "RUNNING":
            return
        time.sleep(0.2)
    pytest.fail(f"job {job_id} not running after {timeout:g}s\n{cluster.logs()}", pytrace=False)


# ------------------------------------------------------------------------------ Podman 5
@pytest.fixture(scope="module")
def podman_node(docker_client: Any, forky_image: str) -> Iterator[Node]:
    """One node with root's Podman 5.8 and a busybox root file system; no Slurm."""
    with Rig(forky_image, 1, client=docker_client, privileges=PODMAN) as rig:
        node = rig.nodes[0]
        node.sh(MAKE_IMAGE, ROOTFS).check("make the busybox rootfs")
        yield node


def podman(node: Node, options: str, script: str) -> ExecResult:
    """Root's `podman run` of the busybox rootfs; the hooks' stderr follows podman's."""
    return node.sh(
        f"rm -f {HOOKS_ERR}; PODMAN_IGNORE_CGROUPSV1_WARNING=1 {PODMAN_RUN} {options} "
        f"--rootfs {ROOTFS} sh -c '{script}'; rc=$?; cat {HOOKS_ERR} >&2 2>/dev/null; exit $rc",
        timeout=120,
    )


def test_podman5_hook_as_the_nodes_first_jobns_call(podman_node: Node) -> None:
    """crun runs hooks with umask 0: the state directory the hook makes is still root's
    0755 (launcher.protocol.state.ensure_state_dir), and the next container works too."""
    node = podman_node
    # a node where jobns never ran (whichever of this module's tests ran before)
    node.sh("umount -l /run/jobns 2>/dev/null; rm -rf /run/jobns").check("reset /run/jobns")
    a = podman(node, "--annotation org.jobns.job-id=h1", "echo a > /tmp/a; echo $(ls -A /tmp)")
    assert (a.exit_code, a.stdout) == (0, "a\n"), a.stderr
    mode = node.exec(["stat", "-c", "%U %a", "/run/jobns"]).check("stat").stdout.split()
    assert mode[0] == "root" and int(mode[1], 8) & 0o022 == 0, mode
    b = podman(node, "--annotation org.jobns.job-id=h2", "echo $(ls -A /tmp)")
    assert (b.exit_code, b.stdout) == (0, "\n"), b.stderr  # a's job is gone with a


def test_podman5_hooks_d_gives_the_jobs_directories_to_its_users_containers(
    podman_node: Node,
) -> None:
    """The hooks.d file the jobns package installs (/usr/share/containers/oci/hooks.d,
    Podman's default directory), for a job a prolog set up for alice."""
    node = podman_node
    job = "p1"
    node.exec(["jobns", "setup", "--job-id", job, "--user", ALICE]).check("jobns setup")
    try:
        mine = f"--annotation org.jobns.job-id={job} --user {ALICE_ID}:{ALICE_ID}"
        w = podman(node, mine, "echo t > /tmp/t; echo v > /var/tmp/v; echo s > /dev/shm/s")
        assert w.exit_code == 0, w.stderr
        r = podman(node, mine, "cat /tmp/t /var/tmp/v /dev/shm/s")
        assert (r.exit_code, r.stdout) == (0, "t\nv\ns\n"), r.stderr
        other = podman(node, "--annotation org.jobns.job-id=p2", "ls -A /tmp /var/tmp /dev/shm")
        assert other.exit_code == 0 and "t" not in other.stdout.split(), other
        bob = podman(node, f"--annotation org.jobns.job-id={job} --user {BOB_ID}", "echo ran")
        assert bob.exit_code != 0 and "ran" not in bob.stdout, bob
        assert f"runs as uid {BOB_ID}" in bob.stderr and f"job {job} belongs to" in bob.stderr
        tree = node.exec(["ls", "-A", f"/tmp/job-{job}/tmp"]).check("ls").stdout.split()
        assert tree == ["t"], tree
    finally:
        node.exec(["jobns", "teardown", "--job-id", job]).check("jobns teardown")
    assert node.exec(["test", "-e", f"/tmp/job-{job}"]).exit_code != 0


@pytest.mark.parametrize("version", ["0.5.0", "1.0.0"])
def test_podman5_cdi_spec(podman_node: Node, version: str) -> None:
    """`podman run --device jobns.dev/job=JOB`: Podman 5.8 takes jobns's spec at its
    default cdiVersion 0.5.0 (the one Podman 4.3 needs) and at 1.0.0."""
    node = podman_node
    job = f"c{version.replace('.', '')}"
    conf = node.exec(["cat", "/etc/jobns/jobns.toml"]).check("read jobns.toml").stdout
    node.put_file(
        "/etc/jobns/jobns.toml", conf + f'[cdi]\ndir = "{CDI_DIR}"\nversion = "{version}"\n'
    )
    try:
        node.exec(["mkdir", "-p", CDI_DIR]).check("mkdir")
        node.exec(["jobns", "setup", "--job-id", job, "--user", ALICE]).check("jobns setup")
        spec = node.exec(["cat", f"{CDI_DIR}/jobns-{job}.json"]).check("read the spec").stdout
        assert f'"cdiVersion": "{version}"' in spec, spec
        device = f"--device jobns.dev/job={job}"
        r = podman(
            node,
            f"{device} --user {ALICE_ID}:{ALICE_ID}",
            "echo $TMPDIR $JOBNS_JOB_ID; echo c > /tmp/c; echo s > /dev/shm/s; ls -A /var/tmp",
        )
        assert (r.exit_code, r.stdout) == (0, f"/tmp {job}\n"), r.stderr
        got = node.sh(f"cat /tmp/job-{job}/tmp/c /dev/shm/job-{job}/s").check("the job's files")
        assert got.stdout == "c\ns\n"
        # the spec's createRuntime hook (owner_check): bob's container never starts
        bob = podman(node, f"{device} --user {BOB_ID}", "echo ran")
        assert bob.exit_code != 0 and "ran" not in bob.stdout, bob
    finally:
        node.exec(["jobns", "teardown", "--job-id", job])
        node.put_file("/etc/jobns/jobns.toml", conf)
    assert node.exec(["test", "-e", f"{CDI_DIR}/jobns-{job}.json"]).exit_code != 0
