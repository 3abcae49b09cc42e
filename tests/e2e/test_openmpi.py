"""Open MPI, a real client of per-job /tmp and /dev/shm: its session directory and vader
shared-memory segments land in the job's own directories, and what a SIGKILLed rank
leaves behind goes with the job."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, require, require_root

pytestmark = pytest.mark.root

HELLO = r"""
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int token = rank, sum = 0;
    MPI_Allreduce(&token, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) { printf("sum %d of %d ranks\n", sum, size); fflush(stdout); }
    if (getenv("HELLO_DIE")) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) { system("ls /dev/shm /tmp > \"$HELLO_DIE\""); }
        MPI_Barrier(MPI_COMM_WORLD);
        raise(SIGKILL);  /* leave session directory and segments behind, as a crash does */
    }
    MPI_Finalize();
    return 0;
}
"""


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_root()
    require(
        shutil.which("mpicc") is not None and shutil.which("mpirun") is not None,
        "Open MPI is not installed (ci/install-system installs openmpi-bin)",
    )
    d = Path("/var/lib/jobns-mpi")
    d.mkdir(exist_ok=True)
    d.chmod(0o755)
    (d / "hello.c").write_text(HELLO)
    subprocess.run(["mpicc", "-o", str(d / "hello"), str(d / "hello.c")], check=True)
    (d / "hello").chmod(0o755)
    return d / "hello"


def host_mpi_files() -> set[str]:
    """Open MPI's traces in the host's own /tmp and /dev/shm (none may appear)."""
    names = os.listdir("/dev/shm") + os.listdir("/tmp")
    return {n for n in names if "vader" in n or n.startswith(("ompi.", "openmpi-sessions"))}


MPIRUN = ["mpirun", "--oversubscribe", "-np", "2", "--mca", "btl", "self,vader"]


def test_mpi_job_uses_the_jobs_tmp_and_shm(
    sandbox: Sandbox, users: list[OsUser], hello: Path
) -> None:
    alice = users[0]
    before = host_mpi_files()
    assert sandbox.run(["setup", "--job-id", "mpi1", "--user", alice.name]).returncode == 0
    r = sandbox.run(["run", "--job-id", "mpi1", "--", *MPIRUN, str(hello)], user=alice, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sum 1 of 2 ranks" in r.stdout
    r = sandbox.run(["teardown", "--job-id", "mpi1"])
    assert r.returncode == 0, r.stderr
    assert host_mpi_files() == before


def test_killed_ranks_leftovers_go_with_the_job(
    sandbox: Sandbox, users: list[OsUser], hello: Path
) -> None:
    alice = users[0]
    before = host_mpi_files()
    listing = sandbox.root / "w"
    listing.mkdir(mode=0o1777)
    listing.chmod(0o1777)
    assert sandbox.run(["setup", "--job-id", "mpi2", "--user", alice.name]).returncode == 0
    r = sandbox.run(
        ["run", "--job-id", "mpi2", "--", *MPIRUN, "-x", "HELLO_DIE", str(hello)],
        user=alice,
        timeout=180,
        env={"HELLO_DIE": str(listing / "seen")},
    )
    assert r.returncode != 0  # the ranks died of SIGKILL
    seen = (listing / "seen").read_text().split()
    # Open MPI's vader segments and session directory were in the job's own scratch...
    assert any("vader" in name for name in seen), seen
    assert any(name.startswith("ompi.") for name in seen), seen
    # ...and are still there after the crash, until the epilog removes the job.
    leftovers = os.listdir(sandbox.shm / "job-mpi2") + os.listdir(sandbox.local / "job-mpi2/tmp")
    assert leftovers
    assert sandbox.run(["teardown", "--job-id", "mpi2"]).returncode == 0
    assert not (sandbox.shm / "job-mpi2").exists() and not (sandbox.local / "job-mpi2").exists()
    assert host_mpi_files() == before
