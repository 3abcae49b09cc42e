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
from typing import TYPE_CHECKING

from jobns.launcher.backing import kinds
from jobns.launcher.lifecycle import lifecycle, unattended
from jobns.launcher.lifecycle.lifecycle import gather_directives, require_root
from jobns.launcher.model import capacity, jobsize
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.config import Config
from jobns.launcher.model.inputs import Options, Request, kill_wait_from
from jobns.launcher.model.job import (
    Job,
    User,
    hostname,
    job_id_from,
    layout_from,
    run_from,
    user_from,
)
from jobns.launcher.model.plan import build
from jobns.launcher.staging import model as staging
from jobns.launcher.staging.model import Staging
from jobns.launcher.system.errors import JobnsError, UserError, warn

if TYPE_CHECKING:
    from jobns.launcher.burstbuffer.record import BbRecord


def main(opts: Options, _command: list[str]) -> int:
    require_root("setup")
    req = Request.from_options(opts)
    environ = dict(os.environ)
    background = bool(opts.get("background")) and not req.dry_run
    config: Config | None = None
    try:
        config = config_mod.load(req.config, environ)
        # Who the job is comes from the site (flags, Slurm): a problem there is the node's.
        job_id = job_id_from(req.job_id, environ)
        user = user_from(req.user, environ)
        run = run_from(environ, background)
        kill_wait = kill_wait_from(req, config)
    except Exception as e:
        if background:
            _node_failed(config, _job_id_or_none(req.job_id, environ), environ, e)
        raise
    try:
        return _setup(req, environ, config, job_id, user, kill_wait, run, background)
    except Exception as e:
        if background:
            _node_failed(config, job_id, environ, e, user, kill_wait, run)
        raise


def _node_failed(
    config: Config | None,
    job_id: str | None,
    environ: dict[str, str],
    e: Exception,
    user: User | None = None,
    kill_wait: float = 0.0,
    run: str | None = None,
) -> None:
    """A background setup (launcher.lifecycle.unattended) the node failed, as slurmd
    handles a failed prolog: the node is drained (first, so Slurm sends the job
    elsewhere), the job is requeued where Slurm allows it, and its tasks (waiting in the
    SPANK plugin) fail at once with a reason that says the node is at fault. A failure
    inside lifecycle.setup recorded that already, under the job's lock; one before it
    (the config, the plan) is recorded here while the run's prolog mark is still there.
    A broken jobns.toml leaves no state_dir to record it in: the one the script or the
    helper named (JOBNS_STATE_DIR) is used then."""
    error = unattended.failure_text(e)
    bin_dir = config.slurm_bin if config else ""
    drained = unattended.drain("setup", error, bin_dir)
    warn(f"setup {job_id or '?'}: {drained}")
    if job_id is None:
        return
    requeued = unattended.requeue(job_id, f"node failed to set it up: {error}", bin_dir)
    warn(f"setup {job_id}: {requeued}")
    reason = lifecycle.node_failed_reason(error)
    try:
        if run is None:
            run = run_from(environ, True)
        if config is not None and user is not None:
            job = Job(job_id, user, hostname())
            lifecycle.setup_refused(config, job, kill_wait, reason, run, True, node=True)
        else:
            lifecycle.refuse_unconfigured(environ.get("JOBNS_STATE_DIR", ""), job_id, reason, run)
    except Exception as again:  # the state is what failed: the tasks time out instead
        warn(f"setup {job_id}: could not record the failure: {again}")


def _job_id_or_none(flag: str | None, environ: dict[str, str]) -> str | None:
    try:
        return job_id_from(flag, environ)
    except JobnsError:
        return None


def _setup(
    req: Request,
    environ: dict[str, str],
    config: Config,
    job_id: str,
    user: User,
    kill_wait: float,
    run: str | None,
    background: bool,
) -> int:
    # What the job asks for comes from its user (directives, comment): a problem there is
    # hers, and refuses her job.
    try:
        bb = _burst_buffer_record(config, job_id)
        if bb is not None and bb.uid != user.uid:
            # A record of another run of this id (job ids restart when a controller
            # loses its state), kept after a failed stage-out: not this job's.
            warn(
                f"setup {job_id}: warning: the burst buffer's record names uid {bb.uid}, "
                f"not the job's ({user.uid}): ignored (jobns bb status on the controller)"
            )
            bb = None
        if bb is not None and bb.comment and not environ.get("SLURM_JOB_COMMENT"):
            environ = {**environ, "SLURM_JOB_COMMENT": bb.comment}
        header = bb.script_header if bb is not None and not req.script else None
        directives = gather_directives(req, environ, config, header)
        req = req.with_directives(directives)
        job = Job(job_id, user, hostname(), layout_from(req.shared), req.no_rm_tmpdir)
        plan = build(config, job)
        if bb is not None and bb.tree_path and plan.trees[0].path == bb.tree_path:
            plan.trees[0].remove = False  # the burst buffer's: its teardown removes it
        sizes = _sizes_from_the_site(config, job, bb)
        caps = capacity.plan(config, directives, job.layout, sizes)
        session_flag = req.session_dir
        stg: Staging | None = None
        notes: list[str] = []
        if directives is not None or session_flag or config.staging.session_dir:
            # Only then is there anything to stage.
            stg, notes = staging.build(
                config, job, plan, directives, session_flag, staging.symbols_for(job, environ)
            )
            if stg is not None and bb is not None:
                stg = _without_the_burst_buffers(stg, bb)
    except JobnsError as e:
        if not (isinstance(e, UserError) or directives_given(req, environ)):
            raise  # no directives: the site's config or flags are wrong
        if req.dry_run:
            raise UserError(str(e)) from None
        lifecycle.setup_refused(
            config, Job(job_id, user, hostname()), kill_wait, str(e), run, background
        )
        return 0
    for note in notes:
        warn(f"setup {job.job_id}: {note}")
    if req.dry_run:
        lines = [plan.describe(), *caps.describe(), *kinds.describe(config, plan, caps)]
        lines += stg.describe() if stg is not None else []
        print("\n".join(lines))
        return 0
    lifecycle.setup(config, job, plan, kill_wait, caps, stg, run, background)
    return 0


def _burst_buffer_record(config: Config, job_id: str) -> BbRecord | None:
    """What jobns's burst buffer did for the job, if the site runs it: only such a site's
    prolog pays for importing it (~2.5 ms)."""
    if config.burst_buffer.get("enabled") is not True:
        return None
    from jobns.launcher.burstbuffer.store import handed_over

    return handed_over(config, job_id)


def _sizes_from_the_site(config: Config, job: Job, bb: BbRecord | None) -> dict[str, int]:
    """What the job asked of the scheduler (launcher.model.jobsize), when the site's config
    asks for that at all; a burst-buffer job's --tmp is in its record (then no question
    to the controller)."""
    if not (
        config.capacity.get("tmp_from_slurm") not in (None, "none")
        or config.capacity.get("shm_memory_fraction") is not None
    ):
        return {}
    if bb is None:
        return jobsize.requested(config, job)
    return jobsize.requested(config, job, handed_over=True, tmp_mib=bb.tmp_mib)


def _without_the_burst_buffers(stg: Staging, bb: BbRecord) -> Staging | None:
    """The staging left to this node: the burst buffer made (or makes, after the job) the
    copies into and out of the shared tmpdir."""
    ins, outs = bb.lines("stage_in"), bb.lines("stage_out")
    stg.stage_in = [c for c in stg.stage_in if c.line not in ins]
    stg.stage_out = [c for c in stg.stage_out if c.line not in outs]
    if stg.session_dir is None and not stg.stage_in and not stg.stage_out:
        return None
    return stg


def directives_given(req: Request, environ: dict[str, str]) -> bool:
    return bool(
        req.script
        or req.directives
        or lifecycle.COMMENT_PREFIX in environ.get("SLURM_JOB_COMMENT", "")
    )
