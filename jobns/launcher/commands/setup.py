"""`jobns setup` (the prolog): make a job's directories and one namespace for all its tasks.

A thin command: it gathers the request (options, #JOBNS directives from --script,
--directives and the Slurm job comment, capacities, staging) and hands it to
launcher.lifecycle.lifecycle, which owns the states; launcher.mountns.pins makes the namespace.

A request the job's user made impossible (a bad directive, a capacity over the
site's cap, a stage path outside the allowed roots) refuses the job, not the node:
setup records the reason, exits 0, and every task of the job exits 125 with it.
"""

from __future__ import annotations

import os

from jobns.launcher.lifecycle import lifecycle
from jobns.launcher.lifecycle.lifecycle import gather_directives, require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import Options, Request, kill_wait_from
from jobns.launcher.model.job import Job, hostname, job_id_from, layout_from, user_from
from jobns.launcher.model.plan import build
from jobns.launcher.system.errors import JobnsError, UserError

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import User
    from jobns.launcher.model.staging import Staging


def main(opts: Options, _command: list[str]) -> int:
    require_root("setup")
    req = Request.from_options(opts)
    environ = dict(os.environ)
    background = bool(opts.get("background")) and not req.dry_run
    try:
        config = config_mod.load(req.config, environ)
        # Who the job is comes from the site (flags, Slurm): a problem there is the node's.
        job_id = job_id_from(req.job_id, environ)
        user = user_from(req.user, environ)
        kill_wait = kill_wait_from(req, config)
    except Exception as e:
        if background:
            _node_failed(None, None, None, 0.0, e)
        raise
    try:
        return _setup(req, environ, config, job_id, user, kill_wait)
    except Exception as e:
        if background:
            _node_failed(config, job_id, user, kill_wait, e)
        raise


def _node_failed(
    config: Config | None, job_id: str | None, user: User | None, kill_wait: float, e: Exception
) -> None:
    """A background setup (launcher.lifecycle.unattended) the node failed: its tasks fail
    at once with the reason, and the node is drained, as slurmd drains it for a failed
    prolog."""
    from jobns.launcher.lifecycle import unattended

    error = unattended.failure_text(e)
    if config is not None and job_id is not None and user is not None:
        try:
            lifecycle.setup_refused(
                config,
                Job(job_id, user, hostname()),
                kill_wait,
                f"this node failed to set the job up (it is drained): {error}",
            )
        except Exception as again:  # the state is what failed: the tasks time out instead
            lifecycle.warn(f"setup {job_id}: could not record the failure: {again}")
    drained = unattended.drain("setup", error, config.slurm_bin if config else "")
    lifecycle.warn(f"setup {job_id or '?'}: {drained}")


def _setup(
    req: Request, environ: dict[str, str], config: Config, job_id: str, user: User, kill_wait: float
) -> int:
    from jobns.launcher.model import capacity

    # What the job asks for comes from its user (directives, comment): a problem there is
    # hers, and refuses her job.
    try:
        directives = gather_directives(req, environ, config)
        req = req.with_directives(directives)
        job = Job(job_id, user, hostname(), layout_from(req.shared), req.no_rm_tmpdir)
        plan = build(config, job)
        caps = capacity.plan(config, directives, job.layout, _sizes_from_the_site(config, job))
        session_flag = req.session_dir
        stg: Staging | None = None
        notes: list[str] = []
        if directives is not None or session_flag or config.staging.session_dir:
            # Only then is there anything to stage (and the path machinery worth importing).
            from jobns.launcher.model import staging

            stg, notes = staging.build(
                config, job, plan, directives, session_flag, staging.symbols_for(job, environ)
            )
    except JobnsError as e:
        if not (isinstance(e, UserError) or directives_given(req, environ)):
            raise  # no directives: the site's config or flags are wrong
        if req.dry_run:
            raise UserError(str(e)) from None
        lifecycle.setup_refused(config, Job(job_id, user, hostname()), kill_wait, str(e))
        return 0
    for note in notes:
        lifecycle.warn(f"setup {job.job_id}: {note}")
    if req.dry_run:
        from jobns.launcher.backing import kinds

        lines = [plan.describe(), *caps.describe(), *kinds.describe(config, plan, caps)]
        lines += stg.describe() if stg is not None else []
        print("\n".join(lines))
        return 0
    lifecycle.setup(config, job, plan, kill_wait, caps, stg)
    return 0


def _sizes_from_the_site(config: Config, job: Job) -> dict[str, int]:
    """What the job asked of the scheduler (launcher.model.jobsize), when the site's config
    asks for that at all (its code is imported only then)."""
    if not (
        config.capacity.get("tmp_from_slurm") not in (None, "none")
        or config.capacity.get("shm_memory_fraction") is not None
    ):
        return {}
    from jobns.launcher.model import jobsize

    return jobsize.requested(config, job)


def directives_given(req: Request, environ: dict[str, str]) -> bool:
    return bool(
        req.script
        or req.directives
        or lifecycle.COMMENT_PREFIX in environ.get("SLURM_JOB_COMMENT", "")
    )
