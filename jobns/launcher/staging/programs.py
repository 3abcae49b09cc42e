"""[lifecycle] pre_run and post_run: the site's programs, run as root in the host's
namespaces, never inside the job's (the job's namespace is its user's: SECURITY.md
rule 1). They get the job's variables and JOBNS_* (host paths, pins); a program that
must act inside the job does so as the job user (docs/users.md "Acting inside a job"). The
pre-run program also gets JOBNS_FILL: a writable view of each extra directory with
options, $JOBNS_FILL<path>, the one way to fill an `ro` one (launcher.mountns.dirs.fill)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

from jobns.launcher.model.config import Config
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.record import Record, host_dirs, job_of
from jobns.launcher.staging.model import Staging
from jobns.launcher.system import libc, sysprog


def program_env(config: Config, record: Record, phase: str) -> dict[str, str]:
    """The pre-run/post-run environment: the job's own variables (paths as the job sees
    them), Slurm's prolog/epilog variables, and JOBNS_* with the host paths."""
    job = job_of(record)
    # Root's fixed PATH (launcher.system.sysprog), never the caller's: slurmd gives none.
    env = {"PATH": sysprog.PATH, "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("SLURM_")})
    env.update(job_environment(config, job))
    staging = Staging.from_record(record.staging)
    if staging is not None and staging.runtime_scratchdir and "RUNTIME_LOCAL_SCRATCH_DIR" in env:
        env["RUNTIME_LOCAL_SCRATCH_DIR"] = staging.runtime_scratchdir
    dirs = host_dirs(record)
    env.update(
        {
            "JOBNS_JOB_ID": job.job_id,
            "JOBNS_USER": job.user.name,
            "JOBNS_UID": str(job.user.uid),
            "JOBNS_GID": str(job.user.gid),
            "JOBNS_STATE": phase,
            "JOBNS_LAYOUT": job.layout,
            "JOBNS_HOST_TMP": dirs.get("/tmp", ""),
            "JOBNS_HOST_VAR_TMP": dirs.get("/var/tmp", ""),
            "JOBNS_HOST_SHM": dirs.get("/dev/shm", ""),
            # The job's namespaces, for a program that must act in the job: as the job user
            # only (docs/users.md "Acting inside a job"), never as root: the namespace is hers.
            "JOBNS_MNT_NS": record.pins.mnt or "",
            "JOBNS_USER_NS": record.pins.user or "",
            "JOBNS_SESSION_DIR": (staging.session_dir or "") if staging else "",
            "JOBNS_SCRATCH_DIR": (staging.scratch_dir or "") if staging else "",
        }
    )
    return env


def run_program(
    config: Config, record: Record, phase: str, more: dict[str, str] | None = None
) -> str | None:
    """Run [lifecycle] pre_run/post_run as root without a shell; None, or what failed.
    more: variables besides program_env's (the pre-run program's JOBNS_FILL)."""
    key = phase.replace("-", "_")
    command = getattr(config.lifecycle, key)
    if not command:
        return None
    argv = shlex.split(command)
    timeout = config.lifecycle.program_timeout
    sys.stderr.flush()
    try:
        # Its output goes to our stderr: the prolog/epilog log. Own process group, so a
        # timeout kills whatever it started too.
        # It dies with jobns (as Slurm kills running burst-buffer scripts when slurmctld
        # stops): `jobns recover` runs it again, never alongside an orphaned copy.
        proc = subprocess.Popen(
            sysprog.argv(argv),  # absolute already (launcher.model.config requires it)
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr.fileno(),
            stderr=sys.stderr.fileno(),
            cwd="/",
            process_group=0,
            env={**program_env(config, record, phase), **(more or {})},
            preexec_fn=lambda: libc.set_pdeathsig(signal.SIGKILL),
        )
    except OSError as e:
        return f"{phase} program {argv[0]}: {e.strerror}; fix [lifecycle] {key}"
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return (
            f"{phase} program {command!r} still ran after {timeout:g} s and was killed; "
            "raise [lifecycle] program_timeout or fix the program"
        )
    if status != 0:
        how = (
            f"was killed by signal {-status}" if status < 0 else f"failed with exit status {status}"
        )
        return f"{phase} program {command!r} {how} (its output is above)"
    return None
