"""The variables a job's tasks see: TMPDIR, PMIx session directories, ARC RUNTIME_*.

PURE: computed from the config and the job only. Paths are as seen *inside*
the job, where /tmp is already the job's own.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import Job

PMIX_TOP = "/tmp/pmix"

# Every variable jobns may set; `jobns env` and the OCI hook export exactly these.
PMIX_DIR_VARS = ("PMIX_SERVER_TMPDIR", "PMIX_TMPDIR", "PMIX_NSDIR", "PMIX_PROCDIR")


def job_environment(config: Config, job: Job) -> dict[str, str]:
    env = {
        "TMPDIR": "/tmp",
        "JOBNS_JOB_ID": job.job_id,
        # PMIx: system tmpdir for rendezvous files, server/session tmpdir,
        # one directory per namespace and one per process under it.
        "PMIX_SYSTEM_TMPDIR": "/tmp",
        "PMIX_SERVER_TMPDIR": PMIX_TOP,
        "PMIX_TMPDIR": PMIX_TOP,
        "PMIX_NSDIR": f"{PMIX_TOP}/{job.nspace}",
        "PMIX_PROCDIR": f"{PMIX_TOP}/{job.nspace}/{job.rank}",
        # jobns removes the whole tree at the end of the job, so PMIx need not.
        "PMIX_TDIR_RMCLEAN": "1",
    }
    arc = config.arc
    if arc is not None:
        # ARC: the variables ARC's job wrapper reads. Empty means "no".
        env["RUNTIME_NODE_SEES_FRONTEND"] = "yes" if arc.shared_filesystem else ""
        env["RUNTIME_LOCAL_SCRATCH_DIR"] = arc.scratchdir
        if arc.movetool:
            env["RUNTIME_LOCAL_SCRATCH_MOVE_TOOL"] = arc.movetool
        if arc.shared_scratch:
            env["RUNTIME_FRONTEND_SEES_NODE"] = arc.shared_scratch
    return env


def pmix_dirs(env: dict[str, str]) -> list[str]:
    """The PMIx directories to create inside the job, parents first."""
    return [env[v] for v in ("PMIX_SERVER_TMPDIR", "PMIX_NSDIR", "PMIX_PROCDIR")]
