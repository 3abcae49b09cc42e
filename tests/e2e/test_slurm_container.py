"""`srun --container=BUNDLE` on the real Slurm 22.05 here (ci/start-slurm --jobns), as an
ordinary user: oci.conf's RunTimeRun runs `jobns oci-config` as the user on the step's
bundle, then rootless runc; the container's /tmp, /var/tmp and /dev/shm are the job's.

Installs jobns/slurm/oci.conf as /etc/slurm/oci.conf for the test (slurmstepd reads it for
--container steps only; other jobs never look at it) and /run/user/UID for the user.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, OsUser, require
from tests.e2e.test_oci_runtimes import busybox_rootfs
from tests.e2e.test_slurm import assert_no_trace, output, sbatch, slurm_with_jobns

pytestmark = [pytest.mark.slurm, pytest.mark.runtime]

OCI_CONF = Path("/etc/slurm/oci.conf")
WORK = Path("/var/lib/jobns-e2e-container")


def enforced() -> bool:
    """The SPANK enforcement (ci/start-slurm --enforce: the jobns plugin in PlugStackConfig)
    hides the state directory inside a job, where oci-config would look for the prolog's
    record: not this test's mode."""
    r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False)
    for line in r.stdout.splitlines():
        if line.split("=")[0].strip() == "PlugStackConfig":
            path = Path(line.partition("=")[2].strip())
            return path.is_file() and "jobns_spank" in path.read_text()
    return False


@pytest.fixture
def container_cluster(users: list[OsUser]) -> Iterator[tuple[Path, Path]]:
    require(
        shutil.which("sbatch") is not None and slurm_with_jobns(),
        "Slurm with the jobns prolog/epilog is not running (ci/start-slurm --jobns)",
    )
    require(
        not enforced(),
        "Slurm runs in --enforce mode (ci/start-slurm --jobns without "
        "--enforce for srun --container through jobns oci-config)",
    )
    require(shutil.which("runc") is not None, "runc is not installed (ci/install-system)")
    alice = users[0]
    saved = OCI_CONF.read_bytes() if OCI_CONF.exists() else None
    shutil.copyfile(REPO / "jobns" / "slurm" / "oci.conf", OCI_CONF)
    OCI_CONF.chmod(0o644)
    run_user = Path(f"/run/user/{alice.uid}")
    made_run_user = not run_user.exists()
    run_user.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_user, alice.uid, alice.gid)
    run_user.chmod(0o700)
    shutil.rmtree(WORK, ignore_errors=True)
    work = WORK / "work"
    work.mkdir(parents=True)
    work.chmod(0o1777)
    bundle = WORK / "bundle"
    bundle.mkdir()
    shutil.copytree(busybox_rootfs(), bundle / "rootfs", symlinks=True)
    subprocess.run(["runc", "spec", "--rootless"], cwd=bundle, check=True)
    doc = json.loads((bundle / "config.json").read_text())
    doc["process"]["terminal"] = False
    doc["linux"]["uidMappings"] = [{"containerID": 0, "hostID": alice.uid, "size": 1}]
    doc["linux"]["gidMappings"] = [{"containerID": 0, "hostID": alice.gid, "size": 1}]
    (bundle / "config.json").write_text(json.dumps(doc, indent=1))
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(bundle)], check=True)
    try:
        yield work, bundle
    finally:
        if saved is None:
            OCI_CONF.unlink()
        else:
            OCI_CONF.write_bytes(saved)
        if made_run_user:
            shutil.rmtree(run_user, ignore_errors=True)
        shutil.rmtree(WORK, ignore_errors=True)


def test_srun_container_gets_the_jobs_directories(
    container_cluster: tuple[Path, Path], users: list[OsUser]
) -> None:
    work, bundle = container_cluster
    alice = users[0]
    show = 'grep -E " /(tmp|var/tmp|dev/shm) " /proc/self/mountinfo | cut -d" " -f4,5'
    script = (
        f"srun --container={bundle} sh -c 'echo $TMPDIR $JOBNS_JOB_ID; "
        f"echo one > /tmp/f; echo seg > /dev/shm/s; {show}'\n"
        f"srun --container={bundle} sh -c 'cat /tmp/f /dev/shm/s'\n"
        # The batch script itself runs on the host: the job's tree has the file.
        "cat /tmp/job-$SLURM_JOB_ID/tmp/f\n"
    )
    job_id = sbatch(alice, work, script)
    out = output(work, job_id).splitlines()
    assert out[0] == f"/tmp {job_id}", out
    assert sorted(out[1:4]) == sorted(
        [
            f"/job-{job_id} /dev/shm",
            f"/tmp/job-{job_id}/tmp /tmp",
            f"/tmp/job-{job_id}/var_tmp /var/tmp",
        ]
    ), out
    assert out[4:] == ["one", "seg", "one"], out
    assert_no_trace(job_id)
