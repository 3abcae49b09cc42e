"""The variables a job's tasks see: TMPDIR, PMIx's tmpdirs, ARC RUNTIME_*.

PURE: computed from the config and the job only. Paths are as seen *inside*
the job, where /tmp is already the job's own.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import Job

PMIX_TOP = "/tmp/pmix"


def job_environment(config: Config, job: Job) -> dict[str, str]:
    env = {
        "TMPDIR": "/tmp",
        "JOBNS_JOB_ID": job.job_id,
        # The only PMIx variables OpenPMIx reads from the environment: where a PMIx
        # server started inside the job (prterun, a tool) puts its rendezvous files
        # (pmix.sys.HOST in the system tmpdir, pmix.HOST.tool.* in the server's) and
        # where clients and tools look for them. PMIX_TMPDIR, PMIX_NSDIR, PMIX_PROCDIR
        # are attributes a PMIx library gets from its server (PMIx_Get), never from the
        # environment: jobns sets none of them.
        "PMIX_SYSTEM_TMPDIR": "/tmp",
        "PMIX_SERVER_TMPDIR": PMIX_TOP,
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
    """The PMIx directory to create inside the job (the server tmpdir), as the job user."""
    return [env["PMIX_SERVER_TMPDIR"]]
