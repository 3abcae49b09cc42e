"""Inside Slurm (issue 31, items 2 and 3): MPI over Slurm's mpi/pmix with jobns's
job_container plugin (JobContainerType=job_container/jobns) and the SPANK plugin
(enforced), two compute nodes, as the ordinary user alice.

- `srun --mpi=pmix -N2 --ntasks-per-node=2` of an Open MPI program (Open MPI 4.1 on
  22.05, 5 on 24.11; shared memory inside a node, TCP between them): every rank runs in
  the job's mount namespace, and nothing of Slurm's PMIx client directory
  (`spmix_appdir_UID_JOB.STEP`) or of Open MPI's session directory is left on a node.
- A PMIx client (Debian's python3-pmix) asks PMIx_Get for PMIX_TMPDIR, PMIX_NSDIR and
  PMIX_PROCDIR while the job runs: what Slurm's PMIx server hands out, and where it is.
  Slurm (pmixp_client.c _set_tmpdirs, the same in 22.05 and 24.11) gives job-level
  values only (the namespace's wildcard rank): PMIX_TMPDIR its client base (TmpFS, /tmp,
  or mpi.conf's PMIxCliTmpDirBase), PMIX_NSDIR the step's `spmix_appdir_UID_JOB.STEP`
  under it; no PMIX_PROCDIR (PMIX_ERR_NOT_FOUND, measured on both).

On 24.11 jobns's plugin puts the whole step (slurmstepd itself) in the job's namespace
(step_create), so slurmstepd makes that directory in the job's own /tmp and Slurm's
default mpi.conf works. 22.05 has no such hook: slurmstepd stays in the node's namespace
and would make it in the node's /tmp, which the tasks (in the job's /tmp) cannot see
(PMIx 5's gds/shmem2 then fails MPI_Init with FILE_OPEN_FAILURE). There mpi.conf moves
it out of the private directories (`PMIxCliTmpDirBase=`, a root-owned 0755 directory
beside SlurmdSpoolDir: slurmstepd mkdirs `spmix_appdir_*` in it, no parents, and chowns
that to the user), as `jobns doctor` asks, and the test proves it works that way.

Slurm 26.05 as Debian forky ships it has no mpi/pmix plugin (only mpi_pmi2), and Open MPI
5 and later speak only PMIx (no PMI-2): there the MPI program is MPICH's, over
`srun --mpi=pmi2` (Slurm's mpi/pmi2 serves MPICH's PMI client), and the PMIx test is
skipped with that reason, after the node shows mpi/pmix is really missing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers import images
from containers.errors import RigError
from containers.images import Release
from containers.rig import Rig
from containers.slurm import FINAL, WORK, SlurmCluster
from tests.e2e.test_rig_inside_slurm import container_conf

pytestmark = pytest.mark.docker

COMPUTES = ("node1", "node2")
ALICE, ALICE_ID = "alice", "1001"
# 22.05: where mpi.conf puts slurmstepd's PMIx client directories (outside the job's
# private /tmp, /var/tmp, /dev/shm; beside SlurmdSpoolDir, where its server's are)
PMIX_BASE = "/var/spool/slurmd/pmix"
# Open MPI's TCP between the nodes (MACHINE.md "MPI over Slurm's PMIx in the rig")
OMPI_NET = "OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0"
# trixie's python3-pmix (5.0.7-1) installs its module as an egg directory with no .pth:
# `import pmix` needs it on sys.path (bookworm's is in dist-packages itself)
PMIX_EGG = "/usr/lib/python3/dist-packages/pypmix-*.egg"


def slurm_version(release: Release) -> tuple[int, ...]:
    return tuple(int(x) for x in release.slurm.split("."))


def whole_step(release: Release) -> bool:
    """Does jobns's plugin put the whole step (slurmstepd itself) in the job's namespace?
    From 24.11, whose slurmd joins in the child that execs slurmstepd; 22.05 has no such
    hook (docs/admin.md "Inside Slurm: the job_container and namespace plugin")."""
    return slurm_version(release) >= (24, 11)


def shared_memory_btl(release: Release) -> str:
    """Open MPI's shared-memory BTL: vader in 4.1 (22.05's Debian), sm in 5."""
    return "vader" if slurm_version(release) < (24, 11) else "sm"


def mpi_files(release: Release) -> dict[str, str]:
    """mpi.conf where the whole step is not joined (22.05); Slurm's default elsewhere."""
    if whole_step(release):
        return {}
    return {"/etc/slurm/mpi.conf": f"PMIxCliTmpDirBase={PMIX_BASE}\n"}


def plugin_of(release: Release) -> str:
    """Slurm's MPI plugin the release's MPI speaks: pmix (Open MPI, where Slurm has
    mpi/pmix), else pmi2 (MPICH, whose PMI client Slurm's mpi/pmi2 serves)."""
    return "pmi2" if slurm_version(release) >= (25, 11) else "pmix"


@pytest.fixture(scope="module")
def mpi(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    """Two computes with jobns enforced and its job_container/namespace plugin, and
    Slurm's MPI plugin of the release (plugin_of) with the MPI of the image."""
    with Rig(
        release_image, hostnames=["ctl", *COMPUTES], client=docker_client, config={"kill_wait": 2}
    ) as rig:
        node = rig.node(COMPUTES[0])
        plugins = f"/usr/lib/{images.multiarch()}/slurm-wlm"
        flavour = plugin_of(release)
        needs = (
            f"ls {plugins}/mpi_pmix*.so && command -v mpicc && python3 -c 'import glob, sys; "
            f'sys.path += glob.glob("{PMIX_EGG}"); import pmix\''
            if flavour == "pmix"
            else f"ls {plugins}/mpi_pmi2.so && mpicc -show | grep -q mpich"
        )
        missing = node.sh(needs)
        if missing.exit_code != 0:
            raise RigError(
                f"the {release.suite} node lacks Slurm's mpi/{flavour} or its MPI: images.py "
                f"gives it MPI or MPICH_PMI2 ({missing.stdout}{missing.stderr})"
            )
        cluster = SlurmCluster(
            rig,
            "ctl",
            COMPUTES,
            jobns=True,
            enforce=True,
            extra=container_conf(release),
            files=mpi_files(release),
            cpus=2,  # two ranks per node
        )
        cluster.configure()
        if not whole_step(release):
            for n in cluster.computes:
                n.exec(
                    ["install", "-d", "-o", "root", "-g", "root", "-m", "0755", PMIX_BASE]
                ).check(f"mkdir {PMIX_BASE} on {n.hostname}")
        cluster.start()
        yield cluster


HELLO_C = r"""
#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One line per rank: where it runs, its mount namespace, a ring exchange and a sum
 * (so every pair of ranks talks: shared memory inside a node, TCP between nodes), and
 * what its /tmp holds while MPI is up. */
int main(int argc, char **argv)
{
    int rank, size, got = -1, sum = -1;
    char host[256] = "?", mnt[128] = "?", tmp[4096] = "";
    ssize_t n;
    DIR *d;
    struct dirent *e;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof(host) - 1);
    n = readlink("/proc/self/ns/mnt", mnt, sizeof(mnt) - 1);
    mnt[n > 0 ? n : 0] = '\0';
    MPI_Sendrecv(&rank, 1, MPI_INT, (rank + 1) % size, 0, &got, 1, MPI_INT,
             (rank + size - 1) % size, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    d = opendir("/tmp");
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (strlen(tmp) + strlen(e->d_name) + 2 < sizeof(tmp)) {
            strcat(tmp, e->d_name);
            strcat(tmp, ",");
        }
    }
    if (d)
        closedir(d);
    printf("hello step=%s rank=%d size=%d host=%s mnt=%s got=%d sum=%d tmp=%s\n",
           argc > 1 ? argv[1] : "-", rank, size, host, mnt, got, sum, tmp);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"""

MPI_JOB = """\
#!/bin/sh
#SBATCH -N2 --ntasks-per-node=2
export {net}
echo batch mnt=$(readlink /proc/self/ns/mnt) host=$(hostname)
OMPI_MCA_btl=self,{shm},tcp srun --mpi={mpi} -N2 --ntasks-per-node=2 {work}/hello-{tag} all \\
  || exit 10
# one node, shared memory only: the ranks must meet in the job's /tmp and /dev/shm
OMPI_MCA_btl=self,{shm} srun --mpi={mpi} -N1 -n2 -w {first} {work}/hello-{tag} shm || exit 11
echo batch tmp=$(ls -A /tmp | tr '\\n' ,)
"""


def node_tmp(cluster: SlurmCluster) -> dict[str, set[str]]:
    """What each compute node's own /tmp (and 22.05's PMIx base) holds, as full paths."""
    found = {}
    for n in cluster.computes:
        r = n.sh(f"ls -d /tmp/* /tmp/.[!.]* {PMIX_BASE}/* 2>/dev/null; true")
        found[n.hostname] = set(r.stdout.split())
    return found


def own_mnt(cluster: SlurmCluster) -> dict[str, str]:
    """Each compute node's own mount namespace (a docker exec runs in the container's)."""
    return {
        n.hostname: n.exec(["readlink", "/proc/self/ns/mnt"]).check("readlink").stdout.strip()
        for n in cluster.computes
    }


def fields(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)


def test_mpi_runs_in_the_jobs_namespace(mpi: SlurmCluster, release: Release) -> None:
    """`srun --mpi=pmix -N2 --ntasks-per-node=2` of an Open MPI program (26.05: `srun
    --mpi=pmi2` of an MPICH one) as alice: all 4
    ranks run and talk (shared memory inside a node, TCP between), each in the job's
    mount namespace (the batch script's on the first node), and no node's own /tmp keeps
    anything of Slurm's PMIx directories or Open MPI's session directory."""
    tag = f"h{time.monotonic_ns() % 10**9}"
    src = f"{WORK}/hello-{tag}.c"
    mpi.controller.put_file(src, HELLO_C)
    mpi.computes[0].exec(["mpicc", "-o", f"{WORK}/hello-{tag}", src], user=ALICE).check("mpicc")
    before = node_tmp(mpi)
    t0 = time.monotonic()
    script = MPI_JOB.format(
        net=OMPI_NET,
        shm=shared_memory_btl(release),
        work=WORK,
        tag=tag,
        first=COMPUTES[0],
        mpi=plugin_of(release),
    )
    job_id = mpi.sbatch(ALICE, script, timeout=180)
    took = time.monotonic() - t0
    out = mpi.output(job_id)
    print(f"\n{release.suite}: MPI job {job_id} in {took:.1f}s\n{out}")
    lines = out.splitlines()
    batch = fields(next(line for line in lines if line.startswith("batch mnt=")))
    ranks = [fields(line) for line in lines if line.startswith("hello step=all ")]
    assert sorted(int(r["rank"]) for r in ranks) == [0, 1, 2, 3], out
    for r in ranks:
        rank = int(r["rank"])
        assert (r["size"], r["sum"], int(r["got"])) == ("4", "6", (rank + 3) % 4), out
    assert sorted(r["host"] for r in ranks) == sorted([*COMPUTES, *COMPUTES]), out
    shm = [fields(line) for line in lines if line.startswith("hello step=shm ")]
    assert sorted(int(r["rank"]) for r in shm) == [0, 1], out
    assert all(r["sum"] == "1" and r["host"] == COMPUTES[0] for r in shm), out
    # each task's /tmp is the job's: the batch script's namespace on the first node, one
    # namespace per node, never the node's own
    node_ns = own_mnt(mpi)
    for host in COMPUTES:
        spaces = {r["mnt"] for r in [*ranks, *shm] if r["host"] == host}
        assert len(spaces) == 1 and node_ns[host] not in spaces, (host, spaces, node_ns, out)
    assert {r["mnt"] for r in ranks if r["host"] == batch["host"]} == {batch["mnt"]}, out
    # nothing of the job on any node afterwards
    after = node_tmp(mpi)
    left = {h: sorted(after[h] - before[h]) for h in after if after[h] - before[h]}
    assert left == {}, (left, out)
    for h, paths in after.items():
        assert not [p for p in paths if re.search(r"spmix_appdir|ompi|prte|pmix\.", p)], (h, paths)
    assert mpi.unusable() == {}


# A PMIx client: PMIx_Get of the session directories (job-level: the namespace's
# wildcard rank; PMIX_PROCDIR: its own rank too), optional (never a direct modex that
# waits on the server); then it says it is ready and waits for the test's go (the test
# looks at the nodes meanwhile).
PMIX_DIRS_PY = """\
import glob, json, os, socket, sys, time

# trixie's python3-pmix installs an egg directory that nothing puts on sys.path
sys.path += glob.glob(EGG)
import pmix


def text(v):
    return v.decode() if isinstance(v, bytes) else v


sync = sys.argv[1]
client = pmix.PMIxClient()
rc, me = client.init([])
if rc != 0:
    print("pmix-init-failed", rc, flush=True)
    sys.exit(2)
optional = [{"key": text(pmix.PMIX_OPTIONAL), "value": True, "val_type": pmix.PMIX_BOOL}]
wildcard = {"nspace": me["nspace"], "rank": pmix.PMIX_RANK_WILDCARD}
got = {}
for name in ("PMIX_TMPDIR", "PMIX_NSDIR", "PMIX_PROCDIR"):
    key = text(getattr(pmix, name))
    for who, proc in (("job", wildcard), ("proc", me)):
        rc, value = client.get(proc, key, optional)
        if isinstance(value, dict):  # {"value": ..., "val_type": ...}
            value = value.get("value")
        got[f"{name}@{who}"] = [rc, text(client.error_string(rc)), text(value) if rc == 0 else None]
dirs = sorted({v[2] for v in got.values() if isinstance(v[2], str)})
report = {
    "host": socket.gethostname(),
    "rank": me["rank"],
    "nspace": text(me["nspace"]),
    "mnt": os.readlink("/proc/self/ns/mnt"),
    "get": got,
    "exists": {d: os.path.isdir(d) for d in dirs},
    "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("PMIX_", "SLURM_PMIX"))},
    "tmp": sorted(os.listdir("/tmp")),
}
# to a file, not stdout: srun forwards two ranks' long lines in pieces that interleave
with open(f"{sync}/report-{report['host']}.json", "w") as out:
    json.dump(report, out)
print(f"pmix-dirs rank {report['rank']} on {report['host']}", flush=True)
open(f"{sync}/ready-{report['host']}", "w").close()
for _ in range(600):
    if os.path.exists(f"{sync}/go"):
        break
    time.sleep(0.1)
client.finalize([])
""".replace("EGG", repr(PMIX_EGG))

PMIX_JOB = """\
#!/bin/sh
#SBATCH -N2 --ntasks-per-node=1
echo batch mnt=$(readlink /proc/self/ns/mnt) host=$(hostname)
srun --mpi=pmix -N2 --ntasks-per-node=1 python3 {work}/pmix-dirs-{tag}.py {sync}
"""


def test_pmix_session_directories(mpi: SlurmCluster, release: Release) -> None:
    """Inside a job, PMIx_Get of PMIX_TMPDIR, PMIX_NSDIR, PMIX_PROCDIR: what Slurm's PMIx
    server hands out. On 24.11 (whole step joined, default mpi.conf) its directories are
    in the job's own /tmp: the task sees them, the node's /tmp never has them. On 22.05
    they are where mpi.conf put them (PMIxCliTmpDirBase), seen from the task and the node
    alike. Gone from everywhere after the job."""
    if plugin_of(release) != "pmix":
        plugins = f"/usr/lib/{images.multiarch()}/slurm-wlm"
        shipped = mpi.computes[0].sh(f"cd {plugins} && ls mpi_*.so").stdout.split()
        assert not [p for p in shipped if p.startswith("mpi_pmix")], shipped
        pytest.skip(
            f"Slurm {release.slurm} as Debian {release.suite} ships it has no mpi/pmix "
            f"(only {', '.join(shipped)}): no PMIx server hands a task its directories"
        )
    tag = f"p{time.monotonic_ns() % 10**9}"
    sync = f"{WORK}/sync-{tag}"
    mpi.controller.put_file(f"{WORK}/pmix-dirs-{tag}.py", PMIX_DIRS_PY)
    mpi.controller.exec(["install", "-d", "-m", "1777", sync]).check(f"mkdir {sync}")
    before = node_tmp(mpi)
    t0 = time.monotonic()
    job_id = mpi.sbatch(ALICE, PMIX_JOB.format(work=WORK, tag=tag, sync=sync), wait=False)
    ready = False
    deadline = time.monotonic() + 90
    while not ready and time.monotonic() < deadline and mpi.job_state(job_id)[0] not in FINAL:
        ready = mpi.controller.exec(["ls", *(f"{sync}/ready-{h}" for h in COMPUTES)]).exit_code == 0
        time.sleep(0.2)
    during = node_tmp(mpi)
    mpi.controller.exec(["touch", f"{sync}/go"]).check("touch go")
    state, code = mpi.wait_done(job_id)
    took = time.monotonic() - t0
    out = mpi.output(job_id)
    print(f"\n{release.suite}: PMIx job {job_id} in {took:.1f}s\n{out}")
    print(f"nodes' own /tmp (and {PMIX_BASE}) while it ran: {during}")
    assert ready and (state, code) == ("COMPLETED", "0:0"), (
        state,
        code,
        out,
        mpi.logs(),
    )
    reports = [
        json.loads(mpi.controller.exec(["cat", f"{sync}/report-{h}.json"]).check("report").stdout)
        for h in COMPUTES
    ]
    assert sorted(r["host"] for r in reports) == sorted(COMPUTES), out
    node_ns = own_mnt(mpi)
    appdir = f"spmix_appdir_{ALICE_ID}_{job_id}.0"
    base = "/tmp" if whole_step(release) else PMIX_BASE
    for r in reports:
        host, get = r["host"], r["get"]
        assert r["mnt"] != node_ns[host], r
        # what Slurm hands out (pmixp_client.c _set_tmpdirs): PMIX_TMPDIR its client
        # base, PMIX_NSDIR the step's client directory under it, no PMIX_PROCDIR
        assert get["PMIX_TMPDIR@job"][2] == base, r
        assert get["PMIX_NSDIR@job"][2] == f"{base}/{appdir}", r
        # each directory it names is there, seen from the task
        assert all(r["exists"].values()) and {base, f"{base}/{appdir}"} <= set(r["exists"]), r
        procdir = get["PMIX_PROCDIR@proc"][2] or get["PMIX_PROCDIR@job"][2]
        assert procdir is None or procdir.startswith(f"{base}/{appdir}/"), r
        if whole_step(release):
            # in the job's /tmp: the task sees it, the node's own /tmp does not have it
            assert appdir in r["tmp"], r
            assert f"/tmp/{appdir}" not in during[host], (host, during[host])
        else:
            # 22.05: beside SlurmdSpoolDir, one directory the node and the job both see
            assert f"{PMIX_BASE}/{appdir}" in during[host], (host, during[host])
            assert not [p for p in during[host] if "spmix_appdir" in p and p.startswith("/tmp/")]
    after = node_tmp(mpi)
    left = {h: sorted(after[h] - before[h]) for h in after if after[h] - before[h]}
    assert left == {}, (left, out)
    assert mpi.unusable() == {}
    for r in reports:
        print(f"{r['host']}: PMIx_Get {r['get']}\n  env {r['env']}")
