"""A job's life on this node as Slurm's burst-buffer states: persisted, resumable.

  jobns setup      pending -> staging-in -> staged-in -> pre-run -> running
                   (or refused: the job's user asked for something impossible)
  jobns teardown   running -> post-run -> staging-out -> teardown -> complete (forgotten)

This module is the only owner of those states; `jobns setup`, `teardown`, `recover`
and `gc` are thin commands over it. Each state is written (atomically, launcher.protocol.state)
*before* its work starts, so after a crash the record says what was interrupted, and
every step can run again:

  state             on entering it                      after a crash (recover / gc)
  pending           record written; no task may join    teardown, then set up again
  staging-in        trees (+capacity tmpfs), scratch,   teardown (inputs moved back),
                    stage_in copies, session -> scratch then set up again
  staged-in         -                                   the same
  pre-run           pin the namespace, pre-run program  pre-run again
  running           tasks may join                      nothing
  refused           tasks fail with the reason          nothing (teardown forgets it)
  post-run          no task may join; end its processes post-run again
                    (kill_wait); post-run program
  staging-out       stage_out copies, scratch->session  post-run again
  teardown          unpin, kill, unmount, rename the    teardown again (a killed
                    trees away (3x); their removal is   release: recover / gc
                    a process's of its own (release)    finish it)
  teardown-fail     kept for the administrator          teardown again
  complete          the record is removed next          forget it

Who is failed by what (SECURITY.md rule 2; docs/admin.md "Who is failed by what"): a problem
the job's user caused (launcher.system.errors.UserError: a bad directive, an impossible
capacity, stage-in inputs she cannot read, a session directory not hers, a stage-out
destination she cannot write, a mount or a writer in her tree) fails her job, never
the node: setup refuses the job and exits 0 (every task then exits 125 with the
reason), teardown keeps what is at stake and exits 0. A fault of the node or the site
(state directory, kernel refusal, the site's pre-run program) fails loudly (125).

A failing stage-in or pre-run tears the job down (inputs back in the session
directory first). A failing post-run program is reported and the epilog goes on
(outputs must still be saved). A failing stage-out keeps the job in staging-out with
every output in scratch or in the session directory: `jobns teardown` again resumes
it, `jobns teardown --hurry` discards what is left. A job that never ran gets no
post-run and no stage_out copies (as Slurm's burst buffer: a job that never ran goes straight to
teardown), but its session inputs still go back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from jobns.launcher.backing import fs, sizelimit
from jobns.launcher.backing.base import Making
from jobns.launcher.backing.fs import TreeHandle
from jobns.launcher.lifecycle.release import Handover
from jobns.launcher.lifecycle.unattended import failure_text
from jobns.launcher.model import config as config_mod
from jobns.launcher.model import record as records
from jobns.launcher.model.capacity import Capacities, granularity
from jobns.launcher.model.config import Config
from jobns.launcher.model.directives import (
    Directives,
    comment_directives,
    parse_directives,
    parse_script,
)
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.inputs import config_from_run_env
from jobns.launcher.model.job import Job
from jobns.launcher.model.plan import Plan, Tree, tree_from_record
from jobns.launcher.model.record import (
    Pins,
    Record,
    TreeRecord,
    job_of,
    new_record,
    options_of,
    plan_of,
    run_env_values,
)
from jobns.launcher.model.request import Request
from jobns.launcher.mountns import binds, cdi, dirs, pins
from jobns.launcher.mountns.namespace import check_site_targets
from jobns.launcher.protocol import state
from jobns.launcher.staging.model import Staging
from jobns.launcher.staging.programs import run_program
from jobns.launcher.system.errors import JobnsError, UserError, printable_path, warn
from jobns.launcher.system.mountinfo import Identity, Mount, propagation_warning
from jobns.launcher.system.removal import take_detached

SETUP_STATES = ("pending", "staging-in", "staged-in", "pre-run")
EPILOG_STATES = ("running", "post-run", "staging-out")
ATTEMPTS = 3
RETRY_PAUSE = 1.0
COMMENT_PREFIX = "jobns:"
MAX_WARNINGS = 10  # directive warnings printed (and logged) per job


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        role = {"setup": "a Slurm Prolog", "teardown": "a Slurm Epilog"}.get(
            what, "an admin command"
        )
        raise JobnsError(f"jobns {what} must run as root (it is {role})")


# ------------------------------------------------------------------------- the request


def gather_directives(
    req: Request,
    environ: Mapping[str, str],
    config: Config | None = None,
    script_text: str | None = None,
) -> Directives | None:
    """#JOBNS directives from --script, --directives and the Slurm job comment.

    Under Slurm a user's own environment never reaches the prolog, but the job's
    comment does (SLURM_JOB_COMMENT): `sbatch --comment "jobns: shared_tmpdir=per-node"`.
    The directive word ([directives] word) and the capacity granularity ([capacity]
    granularity) come from the config. script_text: the batch script's header as the
    burst buffer handed it over (launcher.burstbuffer), in place of --script.
    """
    script = req.script
    if script_text is None and script:
        printable_path(script, "read batch script")
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                script_text = f.read()
        except OSError as e:
            raise JobnsError(f"read batch script {script}: {e.strerror}") from None
    return directives_from(
        script_text, req.directives, environ.get("SLURM_JOB_COMMENT", ""), config
    )


def directives_from(
    script_text: str | None, directives: str | None, comment: str, config: Config | None
) -> Directives | None:
    """The directives of a batch script's text, a --directives string and a job comment,
    merged (the script's first); None when there are none."""
    word = config.directive_word if config is not None else "JOBNS"
    lowered = comment.lower()
    if (
        script_text is None
        and not directives
        and not ("jobns" in lowered or f"#{word.lower()}" in lowered)
    ):
        return None  # the common prolog: no directives, nothing to parse
    gran = granularity(config) if config is not None else 1
    found: list[Directives] = []
    if script_text is not None:
        found.append(parse_script(script_text, word, gran))
    if directives:
        found.append(parse_directives(directives, word, gran))
    # A comment that looks meant for jobns but does not parse refuses the job, as a bad
    # directive does (a silent "ordinary comment" would run the job otherwise).
    in_comment = comment_directives(comment, word) if comment else None
    if in_comment is not None:
        found.append(parse_directives(in_comment, word, gran, source="--comment"))
    if not found:
        return None
    merged = found[0]
    for d in found[1:]:  # later sources fill in what earlier ones left unset
        merged.layout = merged.layout or d.layout
        merged.no_rm_tmpdir = merged.no_rm_tmpdir or d.no_rm_tmpdir
        merged.shm_capacity = merged.shm_capacity or d.shm_capacity
        merged.tmp_capacity = merged.tmp_capacity or d.tmp_capacity
        merged.stage_in += d.stage_in
        merged.stage_out += d.stage_out
        merged.warnings += d.warnings
    for w in merged.warnings[:MAX_WARNINGS]:
        warn(f"warning: {w}")
    if len(merged.warnings) > MAX_WARNINGS:
        # A script of a million misplaced lines must not flood the node's log.
        warn(f"warning: and {len(merged.warnings) - MAX_WARNINGS} more like these")
    return merged


# ------------------------------------------------------------------------------ setup


def setup(
    config: Config,
    job: Job,
    plan: Plan,
    kill_wait: float,
    caps: Capacities | None,
    staging: Staging | None,
    run: str | None = None,
    background: bool = False,
) -> None:
    """The prolog under the job lock: set the job up, or refuse it for a user's error.
    `run` is the job's run (launcher.model.job.run_from); a background setup sets the job
    up only while its prolog's mark is there (take_setup_mark)."""
    state.ensure_state_dir(config.state_dir)
    _warn_propagation_once(config.state_dir)
    with state.JobLock(config.state_dir, job.job_id) as lock:
        taken, prolog_at = take_setup_mark(config.state_dir, job.job_id, run, background)
        if not taken:
            if not state.is_set_up(config.state_dir, job.job_id):
                lock.release_and_remove()
            return
        try:
            _setup_locked(config, job, plan, kill_wait, caps, staging, run, prolog_at)
        except UserError:
            raise  # the job's own, recorded where it could be (already set up): not the node
        except BaseException as e:
            if state.is_set_up(config.state_dir, job.job_id):
                raise
            if background and isinstance(e, Exception):
                # Nobody reads a background setup's status: its tasks, waiting in the
                # SPANK plugin, get the node's failure now, still under the lock (the
                # run's teardown, waiting on it, then forgets the refusal).
                reason = node_failed_reason(failure_text(e))
                refuse(config, job, kill_wait, reason, run, True, prolog_at)
            else:
                lock.release_and_remove()  # nothing of the job is left: neither is its lock
            raise


def node_failed_reason(error: str) -> str:
    """What a job's tasks are told when the node failed its background setup."""
    return (
        "the node failed to set the job up; it is drained, and the job is requeued where "
        f"Slurm allows it (not a problem of the job's): {error}"
    )


def _setup_locked(
    config: Config,
    job: Job,
    plan: Plan,
    kill_wait: float,
    caps: Capacities | None,
    staging: Staging | None,
    run: str | None,
    prolog_at: float | None,
) -> None:
    """setup's work once it may set the job up: an earlier run ended, a repeated prolog
    of this run recognised, else a fresh start; a user's error refuses the job."""
    go, old = _this_runs_record(config, job, run)
    if not go:
        return
    if old is not None:
        if old.state == state.REFUSED:
            return  # the prolog ran twice for a refused job: still refused
        wanted = options_of(job, caps, staging.session_dir if staging is not None else None)
        if old.options != wanted:
            was = old.options or {}
            diff = "; ".join(
                f"{k}: {_show(was.get(k))}, now {_show(wanted.get(k))}"
                for k in sorted({*was, *wanted})
                if was.get(k) != wanted.get(k)
            )
            message = (
                f"setup job {job.job_id}: it is already set up on this node "
                f"with other options ({diff}); run jobns teardown first"
            )
            if run is None:
                raise JobnsError(message)  # by hand: the administrator's to sort out
            # One run of Slurm's asks once: keep what it was set up with, as a second
            # prolog of a refused job keeps its refusal.
            warn(f"{message} (the job keeps its first options)")
            return
        if old.state == "running":
            return  # idempotent: the prolog ran twice
        # An interrupted setup or epilog of the same job: finish it (nothing is lost:
        # staged-in inputs go back first), then set up anew.
        finish(config, job.job_id, old, force=True)
    try:
        start(config, job, plan, kill_wait, caps, staging, run, prolog_at)
    except UserError as e:
        if state.is_set_up(config.state_dir, job.job_id):
            raise  # its teardown failed too: that is for the administrator
        refuse(config, job, kill_wait, str(e), run, prolog_at=prolog_at)


def take_setup_mark(
    state_dir: str, job_id: str, run: str | None, background: bool, say: bool = True
) -> tuple[bool, float | None]:
    """First under the job lock in every setup: may this setup set the job up?

    Returns (whether to set up, when the run's prolog left its mark: the record keeps it
    for the teardown, launcher.commands.teardown). The packaged prolog leaves <id>.setup
    naming its run before it returns
    (launcher.protocol.state "marks"); a teardown of that run that got the lock first took
    the mark, and then the run is over before its setup began: a background setup sets
    up nothing (it would leak a job Slurm has ended). By hand (not background) a setup
    takes any mark and goes on. An epilog's <id>.ending older than the prolog's mark is
    from an earlier job of the same id (Slurm's ids start again when its state is wiped):
    it goes first, so the SPANK plugin never takes it for this run's."""
    setup_at = state.mark_time(state_dir, job_id, state.SETUP_MARK)
    if setup_at is not None:
        state.drop_stale_ending(state_dir, job_id, setup_at)
    prolog_at = setup_at / 1e9 if setup_at is not None else None
    if state.drop_mark(state_dir, job_id, state.SETUP_MARK, run if background else None):
        return True, prolog_at
    if not background:
        return True, None
    if say:
        warn(
            f"setup {job_id}: the job's epilog came first (run {run or '-'} is over before its "
            "setup began); nothing to set up"
        )
    return False, None


def another_run(record: Record, run: str | None) -> bool:
    """Is the record of another run of the job than `run`? (Unknown runs are the same.)"""
    return run is not None and record.run is not None and record.run != run


def _this_runs_record(config: Config, job: Job, run: str | None) -> tuple[bool, Record | None]:
    """(whether to go on, the job's record): an earlier run's record is ended first
    (then None: this run starts afresh); False when it could not be (this run is
    refused)."""
    old = records.load(config.state_dir, job.job_id)
    if old is None or not another_run(old, run):
        return True, old
    return _end_an_earlier_run(config, job, old), None


def _end_an_earlier_run(config: Config, job: Job, old: Record) -> bool:
    """A setup that finds the record of another run of its job (a requeue whose last
    run's teardown has not come yet, or never will): Slurm ended that run, so it is
    ended here first. What fails in it because of the job's own data (its stage-out)
    is the job's problem: the old run is kept as it is (nothing is lost) and this run
    is refused with the reason; only the node's faults go on. True to set up."""
    try:
        finish(config, job.job_id, old, force=True)
    except UserError as e:
        reason = f"the job's last run (run {old.run or '-'}) could not be ended on this node: {e}"
        state.close_run_env(config.state_dir, job.job_id, state.REFUSED, job.user.uid, reason)
        warn(f"setup {job.job_id}: refused the job (a problem of its user's): {reason}")
        return False
    return True


def _warn_propagation_once(state_dir: str) -> None:
    """Once per boot (state_dir is on /run): say in the prolog log if host mounts made
    later will not reach jobs."""
    marker = f"{state_dir}/{state.PROPAGATION_CHECKED}"
    if os.path.exists(marker):
        return
    warning = propagation_warning()
    if warning:
        warn(f"warning: {warning}")
    state.touch(marker, "the once-per-boot marker")


def _show(value: object) -> str:
    """An option's value for a message: plain words, not a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in sorted(value.items())) or "none"
    return "none" if value is None else str(value)


def setup_refused(
    config: Config,
    job: Job,
    kill_wait: float,
    reason: str,
    run: str | None = None,
    background: bool = False,
    node: bool = False,
) -> None:
    """The prolog of a job whose request is impossible (node: that the node failed, its
    setup never began): record it as refused (under the job lock; a job already set up
    or refused on this node is left as it is)."""
    state.ensure_state_dir(config.state_dir)
    with state.JobLock(config.state_dir, job.job_id) as lock:
        taken, prolog_at = take_setup_mark(config.state_dir, job.job_id, run, background, not node)
        if not taken:
            if not state.is_set_up(config.state_dir, job.job_id):
                lock.release_and_remove()
            return
        go, old = _this_runs_record(config, job, run)
        if not go:
            return
        if old is None:
            refuse(config, job, kill_wait, reason, run, node, prolog_at)
        elif old.state != state.REFUSED:
            warn(
                f"setup {job.job_id}: {reason} (the job is already {old.state} on this "
                "node and stays so)"
            )


def refuse_unconfigured(state_dir: str, job_id: str, reason: str, run: str | None) -> None:
    """A background setup that could not read jobns.toml: its tasks, waiting in the SPANK
    plugin, fail at once with the reason, through the state_dir the prolog script or
    the helper named (JOBNS_STATE_DIR). Only run.env is written (root's alone: no job
    user is known); the teardown removes a job directory that has no record."""
    if not state_dir.startswith("/") or ".." in state_dir.split("/"):
        raise JobnsError(f"no state_dir to record job {job_id}'s failure in ({state_dir!r})")
    state.ensure_state_dir(state_dir)
    with state.JobLock(state_dir, job_id) as lock:
        if not state.drop_mark(state_dir, job_id, state.SETUP_MARK, run):
            if not os.path.lexists(state.job_dir(state_dir, job_id)):
                lock.release_and_remove()
            return  # the run's teardown came first: nothing to tell its tasks
        if state.is_set_up(state_dir, job_id):
            return  # an earlier run's record: this run's teardown ends it
        state.private_dir(state.job_dir(state_dir, job_id), None)
        state.close_run_env(state_dir, job_id, state.REFUSED, None, reason)


def refuse(
    config: Config,
    job: Job,
    kill_wait: float,
    reason: str,
    run: str | None = None,
    node: bool = False,
    prolog_at: float | None = None,
) -> None:
    """Record a job its user made impossible (node: that the node failed in the
    background): nothing of it exists on the node, and every task fails with the reason.
    A user's problem: the prolog succeeds, the node stays in service."""
    record = new_record(job, None, kill_wait, config, state=state.REFUSED, run=run)
    record.prolog_at = prolog_at
    record.errors = [reason]
    records.save(config.state_dir, record)
    state.close_run_env(config.state_dir, job.job_id, state.REFUSED, job.user.uid, reason)
    whose = "this node failed it" if node else "a problem of its user's, not of this node"
    warn(f"setup {job.job_id}: refused the job ({whose}): {reason}")


def start(
    config: Config,
    job: Job,
    plan: Plan,
    kill_wait: float,
    caps: Capacities | None,
    staging: Staging | None,
    run: str | None = None,
    prolog_at: float | None = None,
) -> Record:
    """A fresh setup: persist the request, then run it to `running`; on failure the
    teardown runs (nothing is lost) and the error is raised again."""
    record = new_record(
        job,
        plan,
        kill_wait,
        config,
        caps,
        staging.record() if staging is not None else None,
        staging.session_dir if staging is not None else None,
        run=run,
    )
    record.prolog_at = prolog_at
    records.save(config.state_dir, record)
    state.close_run_env(config.state_dir, job.job_id, "pending", job.user.uid)
    state.pause_point("pending")
    run_setup(config, record, job, plan)
    return record


def run_setup(config: Config, record: Record, job: Job, plan: Plan) -> None:
    """pending -> running; any failure aborts (teardown) and is raised again."""
    state_dir, job_id = config.state_dir, job.job_id
    with _Aborting(config, job_id, record) as handles:
        records.enter(state_dir, record, "staging-in")
        staging = _staging(record)
        if staging is not None:
            # Only a staging job imports its copying code (~1 ms: transfer is big).
            from jobns.launcher.staging.steps import check_session_dir, stage_in

            check_session_dir(record, staging)
        if any(t.extra is not None for t in plan.trees):
            check_site_targets(plan)
        handles += make_trees(config, record, job, plan)
        if staging is not None:
            errors = stage_in(record, staging)
            if errors:
                for err in errors:
                    warn(f"setup {job_id}: {err}")
                raise UserError(
                    f"stage-in failed: {errors[0]}"
                    + (
                        f" (and {len(errors) - 1} more, listed in the prolog log)"
                        if len(errors) > 1
                        else ""
                    )
                    + "; the inputs are back in the session directory"
                )
        records.enter(state_dir, record, "staged-in")
        pre_run(config, record, job, plan, handles)


class _Aborting:
    """Holds the job's tree handles for a setup step: closes them at the end and, on any
    failure, aborts the job (teardown, inputs back) before the error goes on."""

    def __init__(self, config: Config, job_id: str, record: Record) -> None:
        self.config, self.job_id, self.record = config, job_id, record
        self.handles: list[TreeHandle] = []

    def __enter__(self) -> list[TreeHandle]:
        return self.handles

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        for h in self.handles:
            h.close()
        if error is not None:
            abort(self.config, self.job_id, self.record, error)


def make_trees(config: Config, record: Record, job: Job, plan: Plan) -> list[TreeHandle]:
    """Create the job's trees (and mount their capacity tmpfs), and its scratch tree.

    Whatever is found at a tree's place that jobns did not make for this job is moved
    aside (a squatter never blocks, receives or loses anything). A tree with a capacity
    is always made now, and stays root's until its tmpfs is mounted on it: the user
    cannot rename it away in between (the mount would land where she chose)."""
    uid, gid = plan.owner
    handles: list[TreeHandle] = []
    aside: list[str] = []
    try:
        for tree, rec in zip(plan.trees, record.trees, strict=True):
            size = rec.capacity
            cover = dirs.covered(tree)  # ro/noexec on every path (launcher.mountns.dirs)
            h = fs.acquire_tree(tree, uid, gid, aside=aside, fresh=size is not None or cover)
            handles.append(h)
            if h.created:
                rec.made = True
                records.save(config.state_dir, record)
            if size is None and not cover:
                continue
            # A covered tree's file system stays root's: only the cover's content is hers.
            owner = (0, 0) if cover else (uid, gid)
            if size is not None:
                rec.mount = _make_backing(config, record, rec, h, job.job_id, owner)
                records.save(config.state_dir, record)  # the mount teardown takes for ours
            if cover:  # recorded with the next save (until then uncover finds it anyway)
                rec.cover = dirs.cover(h, uid, gid, config.state_dir, job.job_id)
            again = fs.acquire_tree(tree, uid, gid, create=False)
            again.created = True
            h.close()
            handles[-1] = again
        scratch = record.scratch_record()
        if scratch is not None:
            h = fs.acquire_tree(tree_from_record(scratch), uid, gid, lock=False, aside=aside)
            h.close()
            if h.created:
                scratch["made"] = True
                records.save(config.state_dir, record)
    except BaseException:
        for h in handles:
            h.close()
        raise
    finally:
        for note in aside:
            warn(f"setup {job.job_id}: warning: {note}")
    return handles


def _make_backing(
    config: Config,
    record: Record,
    rec: TreeRecord,
    handle: TreeHandle,
    job_id: str,
    owner: tuple[int, int],
) -> Identity | None:
    """The tree's recorded backing (launcher/backing/kinds.py) puts its file system on the
    tree root; what it must find after a crash it saves in the record first."""
    from jobns.launcher.backing import kinds

    def save() -> None:
        records.save(config.state_dir, record)

    making = Making(config, rec, handle, job_id, owner, save)
    return kinds.of(rec.backing).make(making)


def pre_run(
    config: Config, record: Record, job: Job, plan: Plan, handles: list[TreeHandle]
) -> None:
    """pre-run -> running: pin the namespace, run the pre-run program, open the job."""
    state_dir, job_id = config.state_dir, job.job_id
    records.enter(state_dir, record, "pre-run")
    for _ in range(3):  # a crashed earlier pre-run's pins (even stacked)
        pins.unpin(record.pins)
    if config.pid_ns and not config.enforce:
        warn(f"setup {job_id}: {config_mod.PID_NS_IGNORED}")
    record.pins = pins.pin(
        plan, handles, job, state_dir, enforce=config.enforce, pid_ns=config.pid_ns
    )
    records.save(state_dir, record)
    failure = _pre_run_program(config, record)
    if failure is not None:
        raise JobnsError(f"setup job {job_id}: {failure}; the job is torn down")
    state.write_run_env(
        state_dir,
        job_id,
        enforced_values(run_env_values(record, config), job, config.enforce),
        job.user.uid,
    )
    # Containers of the job through CDI (launcher.mountns.cdi): the spec names the trees verified
    # by these handles, and is written only now, when tasks may join.
    state.pause_point("cdi")
    cdi.publish(config, job, plan, handles)
    record.ran = True
    records.enter(state_dir, record, "running")


def _pre_run_program(config: Config, record: Record) -> str | None:
    """The site's pre-run program, with a writable view of each covered extra directory
    while it runs ($JOBNS_FILL<path>: the one way to fill an `ro` one)."""
    if not config.lifecycle.pre_run:
        return None
    view = dirs.fill(config.state_dir, record.job_id, [(t.tree, t.cover) for t in record.trees])
    try:
        return run_program(config, record, "pre-run", {"JOBNS_FILL": view} if view else None)
    finally:
        if view:
            for err in binds.release(config.state_dir, record.job_id):
                warn(f"setup {record.job_id}: {err}")


def enforced_values(values: dict[str, str], job: Job, enforce: bool) -> dict[str, str]:
    """run.env of a job the SPANK plugin enforces: `enforced=1` (its namespace is root's)
    and, as `env.NAME=VALUE` lines, the job environment every task gets from the plugin
    (the same for all its tasks; the PMIx directory /tmp/pmix is made by `jobns run` or
    the TaskProlog `jobns env --format slurm`)."""
    if not enforce:
        return values
    env = job_environment(config_from_run_env(values), job)
    values = {**values, "enforced": "1"}
    values.update((f"env.{k}", v) for k, v in sorted(env.items()))
    return values


def abort(config: Config, job_id: str, record: Record, cause: BaseException) -> None:
    """A setup failed: tear the job down (inputs back first). If even that fails, the
    record stays (teardown-fail / its state) for `jobns teardown` or `recover`."""
    try:
        finish(config, job_id, record, force=False, aborting=True)
    except JobnsError as e:
        warn(f"setup {job_id}: after {cause}: {e}")


# ----------------------------------------------------------------------------- epilog


def finish(
    config: Config,
    job_id: str,
    record: Record,
    force: bool = False,
    hurry: bool = False,
    aborting: bool = False,
) -> None:
    """The epilog from whatever state the job is in (see the module docstring).

    Raises UserError when the job's own stage-out failed (the outputs are kept), and
    JobnsError when the node could not tear the job down."""
    state_dir = config.state_dir
    st = record.state
    # First: no new container gets the job through its CDI spec (in any state: a crashed
    # setup may have written it).
    for err in cdi.remove(config, job_id):
        warn(f"teardown {job_id}: {err} (jobns gc removes it later)")
    if st in ("complete", state.REFUSED):
        errors = state.remove_job_dir(state_dir, job_id)
        if errors:
            raise JobnsError(f"teardown job {job_id}: {'; '.join(errors)}")
        return
    uid = record.uid
    ran = record.has_run(st in EPILOG_STATES)
    if st in SETUP_STATES or st in EPILOG_STATES:
        # A setup's own abort keeps a never-run job "pending": tasks waiting for a
        # background setup (the SPANK plugin) wait for its outcome, which it records next.
        closed = "post-run" if ran else "pending" if aborting else "teardown"
        state.close_run_env(state_dir, job_id, closed, uid)
    if ran and st in EPILOG_STATES:
        records.enter(state_dir, record, "post-run")
        if _work_before_teardown(config, record, hurry):
            # The post-run program and stage-out see a quiet job; without either, the
            # teardown state's own termination (after the unpin) is the only one needed.
            for err in pins.terminate(record.pins, record.kill_wait):
                warn(f"post-run {job_id}: {err}")
        if not hurry:
            failure = _program(config, record, "post-run")
            if failure is not None:
                warn(f"post-run {job_id}: {failure}; staging out anyway")
                _note_errors(state_dir, job_id, record, [failure])
            records.enter(state_dir, record, "staging-out")
            staging = _staging(record)
            errors = []
            if staging is not None:
                from jobns.launcher.staging.steps import stage_out

                errors = stage_out(record, staging, ran)
            if errors:
                for err in errors:
                    warn(f"stage-out {job_id}: {err}")
                _note_errors(state_dir, job_id, record, errors)
                where = (
                    " and ".join(p for p in (staging.scratch_dir, staging.session_dir) if p)
                    if staging is not None
                    else ""
                )
                raise UserError(
                    f"stage-out of job {job_id} failed (the problems are listed "
                    f"above); the job is kept in staging-out and every output is whole in "
                    f"{where or 'the job directories'}: fix the problem and run jobns "
                    "teardown again (it resumes), or jobns teardown --hurry to discard what "
                    "was not staged out"
                )
    teardown_locked(state_dir, job_id, record, force=force, hurry=hurry)


def _staging(record: Record) -> Staging | None:
    """The job's staging, as its record keeps it; None for a job that stages nothing."""
    if record.staging is None:
        return None
    return Staging.from_record(record.staging)


def _program(config: Config, record: Record, phase: str) -> str | None:
    """[lifecycle] pre_run or post_run, when the config names one."""
    if not getattr(config.lifecycle, phase.replace("-", "_")):
        return None
    return run_program(config, record, phase)


def _work_before_teardown(config: Config, record: Record, hurry: bool) -> bool:
    """Does the epilog run anything between post-run and teardown (a post-run program,
    stage-out or scratch back to the session directory)?"""
    return not hurry and bool(config.lifecycle.post_run or record.staging)


def _note_errors(state_dir: str, job_id: str, record: Record, errors: list[str]) -> None:
    record.errors = errors
    records.save(state_dir, record)


def removable(tree: Tree, made: bool, record: Record) -> bool:
    """A recorded tree teardown removes: a job that ran owns all its trees; a setup that
    failed or crashed owns only what it made (never a directory it found in place)."""
    return tree.remove and (record.has_run(True) or made)


def teardown_once(
    record: Record, unstage: bool = True, handover: Handover | None = None
) -> list[str]:
    """One attempt at the teardown state: unpin, end the job's processes, put scratch
    back, then for each tree: seal it, detach what is mounted in it, empty and detach
    its capacity, remove it (with a handover: rename it out of the job's way for the
    release process, launcher.lifecycle.release, which also gets the last references to the job's
    namespaces)."""
    errors: list[str] = []
    job_pins = record.pins
    job_id = record.job_id
    held = pins.hold(job_pins)
    user = pins.userns_of(job_pins)  # before unpin: nested namespaces are found through it
    userns = user[1] if user is not None else None
    pid = pins.pidns_of(job_pins)  # likewise its PID namespace, whose init ends last
    pidns = pid[1] if pid is not None else None
    try:
        errors += pins.unpin(job_pins)
        dev, ino = job_pins.mnt_dev, job_pins.mnt_ino
        if held is not None and dev is not None and ino is not None:
            errors += pins.terminate_namespace(dev, ino, record.kill_wait, userns, pidns)
        staging = _staging(record)
        scratch = staging.scratch_tree if staging is not None else None
        keep_scratch = False
        if unstage and staging is not None and scratch is not None:
            # ARC's job scratch: it is removed only once its content is back in the session
            # directory. After a successful stage-out it is empty; after a failed or
            # interrupted setup it holds the job's inputs, which go back where they were.
            from jobns.launcher.staging.steps import unstage_session

            problems = unstage_session(record, staging)
            errors += problems
            keep_scratch = bool(problems)
        for t in record.trees:
            errors += _release_tree(t, job_id, removable(t.tree, t.made, record), handover)
        scratch_rec = record.scratch_record()
        if (
            scratch is not None
            and scratch_rec is not None
            and not keep_scratch
            and removable(scratch, scratch_rec.get("made", True) is True, record)
        ):
            fs.seal(scratch, fs.nothing_ours)
            errors += _remove(scratch, fs.nothing_ours, handover)
        if held is not None and dev is not None and ino is not None:
            errors += pins.terminate_namespace(dev, ino, 0.0, userns, pidns)  # joined late
    finally:
        for fd in (held, user[0] if user is not None else None, pid[0] if pid else None):
            if fd is not None:
                _drop(fd, handover)
        for note in take_detached():
            warn(f"teardown {job_id}: {note}")
    return errors


def _release_tree(
    t: TreeRecord, job_id: str, gone: bool, handover: Handover | None = None
) -> list[str]:
    """One recorded tree at teardown: detach its cover (launcher.mountns.dirs), seal it (whatever
    the user mounted on its root is detached first), release its capacity (empty and
    detach a tmpfs; shut down, detach, truncate and unlink a disk image), remove it.
    Which mount on the root is the capacity is the record's to say (sizelimit.owner: the
    identity setup recorded), never the mount's source name, which her FUSE mount can
    copy. A capacity is emptied, made read-only and detached here, whatever its size
    (what a held reference keeps is empty); with a handover the tree is then renamed
    out of the job's way, for the release process (launcher.lifecycle.release)."""
    tree = t.tree
    errors: list[str] = []
    if t.cover is not None or dirs.covered(tree):
        errors += dirs.uncover(tree, t.cover)  # first: the rest works on the tree
    if not gone and t.capacity is None:
        return errors  # kept (--no-rm-tmpdir) and nothing of ours mounted on it
    ours = sizelimit.owner(t, job_id)
    fs.seal(tree, ours)  # first: she cannot mount anew on a root she can no longer enter
    from jobns.launcher.backing import kinds

    # Its mounts go first: removal never crosses into another file system.
    errors += kinds.of(t.backing).release(t, ours)
    if gone:
        errors += _remove(tree, ours, handover)
    return errors


def _remove(tree: Tree, ours: Callable[[Mount], bool], handover: Handover | None) -> list[str]:
    """A sealed tree, emptied of mounts: removed now, or renamed for the release process."""
    if handover is None:
        return fs.remove_recorded(tree, ours)
    return handover.retire(tree, ours)


def _drop(fd: int, handover: Handover | None) -> None:
    """A namespace reference: its release process closes it (the kernel then frees the
    namespace's mounts, which is not the epilog's wait), else closed now."""
    if handover is not None:
        handover.keep(fd)
    else:
        os.close(fd)


def _still_mounted(record: Record) -> list[str]:
    """The recorded trees whose capacity (jobns's own mount) is still on their root."""
    out = []
    for t in record.trees:
        if t.capacity is None:
            continue
        top = fs.root_top(t.tree, sizelimit.owner(t, record.job_id))
        if top is not None:
            os.close(top[0])
            if top[1] == fs.OURS:
                out.append(t.tree.path)
    return out


def teardown_locked(
    state_dir: str, job_id: str, record: Record, force: bool = False, hurry: bool = False
) -> None:
    """The teardown state: tried ATTEMPTS times, then teardown-fail (as Slurm's burst buffer).
    hurry: remove scratch without moving its content back (like scancel --hurry).
    What the epilog renamed out of the job's way is then the release process's, even
    after a failed attempt (launcher.lifecycle.release: what the epilog finishes, what it hands
    over)."""
    handover = Handover(state_dir, job_id, record.user_name)
    try:
        _teardown_attempts(state_dir, job_id, record, force, hurry, handover)
    finally:
        handover.start()


def _teardown_attempts(
    state_dir: str, job_id: str, record: Record, force: bool, hurry: bool, handover: Handover
) -> None:
    if record.state not in ("teardown", "teardown-fail"):
        records.enter(state_dir, record, "teardown")
    errors: list[str] = []
    for attempt in range(ATTEMPTS):
        errors = teardown_once(record, not hurry, handover)
        if not errors:
            records.enter(state_dir, record, "complete")
            errors = state.remove_job_dir(state_dir, job_id)
            if not errors:
                return
        record.errors = errors
        records.save(state_dir, record)
        if attempt + 1 < ATTEMPTS:
            time.sleep(RETRY_PAUSE)
    # One failed epilog counts once, whatever its attempts (as Slurm's burst buffer: teardown-fail
    # after three tries; `jobns status` shows how many epilogs have failed).
    record.teardown_failures += 1
    records.enter(state_dir, record, "teardown-fail")
    for err in errors:
        warn(f"teardown {job_id}: {err}", log="error")
    held = _still_mounted(record) if force else []
    if held:
        # Forgotten, its memory or disk space would be lost to the node for good.
        raise JobnsError(
            f"teardown job {job_id}: kept its record despite --force: its capacity is "
            f"still mounted on {', '.join(held)} ({len(errors)} problem(s), listed "
            "above); fix them and run jobns teardown again"
        )
    if force:
        state.remove_job_dir(state_dir, job_id)
        raise JobnsError(
            f"teardown job {job_id}: forgot its record (--force) although "
            f"{len(errors)} problem(s) remain (listed above); clean those by hand"
        )
    raise JobnsError(
        f"teardown job {job_id}: {len(errors)} problem(s) after {ATTEMPTS} "
        "attempts (listed above); the job is kept as teardown-fail: fix them and "
        "run jobns teardown again, or --force to forget it"
    )


# ---------------------------------------------------------------------------- recover


def recover_one(config: Config, job_id: str, record: Record) -> str:
    """Act on an interrupted job by its recorded state (as Slurm's burst buffer after a slurmctld
    restart)."""
    st = record.state
    if st in ("running", state.REFUSED):
        return f"{st}: nothing to do"
    if st in ("pending", "staging-in", "staged-in"):
        request = record.copy()
        finish(config, job_id, record)  # teardown: inputs back, trees removed
        redo = _restart(request)
        job = job_of(redo)
        plan = plan_of(config, redo, job)
        records.save(config.state_dir, redo)
        state.close_run_env(config.state_dir, job_id, "pending", job.user.uid)
        try:
            run_setup(config, redo, job, plan)
        except UserError as e:
            if state.is_set_up(config.state_dir, job_id):
                raise
            refuse(config, job, redo.kill_wait, str(e), redo.run)
            return f"{st}: torn down; set up again: refused ({e})"
        return f"{st}: torn down and set up again: running"
    if st == "pre-run":
        job = job_of(record)
        plan = plan_of(config, record, job)
        uid, gid = plan.owner
        with _Aborting(config, job_id, record) as handles:
            for tree in plan.trees:
                handles.append(fs.acquire_tree(tree, uid, gid, create=False))
            pre_run(config, record, job, plan, handles)
        return "pre-run: pre-run again: running"
    finish(config, job_id, record)
    return f"{st}: finished: removed"


def _restart(record: Record) -> Record:
    """The request of an interrupted setup, as new (nothing of it exists any more)."""
    now = time.time()
    redo = record.copy()
    redo.state, redo.updated, redo.ran, redo.teardown_failures = "pending", now, False, 0
    redo.errors, redo.pins = [], Pins()
    redo.history.append({"state": "pending", "at": now})
    redo.trees = [TreeRecord(t.tree, t.capacity, False, backing=t.backing) for t in redo.trees]
    scratch = redo.scratch_record()
    if scratch is not None:
        scratch["made"] = False
    return redo
