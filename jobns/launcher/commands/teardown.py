"""`jobns teardown` (the epilog): end what still runs in the job, stage out, drop the pins,
take the directories out of the job's way (a release process of their own removes them,
launcher.lifecycle.release) and remove the state. Safe to run twice, after a crash, or on a
half-set-up or refused job.

A thin command over launcher.lifecycle.lifecycle.finish (post-run, staging-out, teardown). A
problem of the job's user (its stage-out destination unwritable: the outputs are
kept) is reported and the epilog exits 0: a failing epilog drains the node.
"""

from __future__ import annotations

import errno
import os

from jobns.launcher.lifecycle import lifecycle, unattended
from jobns.launcher.lifecycle.lifecycle import require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model import record as records
from jobns.launcher.model.inputs import Options
from jobns.launcher.model.job import job_id_from
from jobns.launcher.protocol import state
from jobns.launcher.system.errors import JobnsError, UserError, warn


def main(opts: Options, _command: list[str]) -> int:
    if not opts.get("background"):
        return _teardown(opts)
    try:
        return _teardown(opts)
    except Exception as e:
        # Nobody reads a background epilog's exit status: drain the node as slurmd
        # would have for a failed epilog (launcher.lifecycle.unattended).
        warn(
            f"teardown {opts.get('job_id') or '?'}: "
            + unattended.drain("teardown", unattended.failure_text(e))
        )
        raise


def _teardown(opts: Options) -> int:
    require_root("teardown")
    environ = dict(os.environ)
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None, environ)
    raw_id = opts.get("job_id")
    job_id = job_id_from(None if raw_id is None else str(raw_id), environ)
    # Which run: the one whose prolog came before this teardown's epilog ran (the
    # epilog's restart count is already the next run's after a requeue). By hand (not
    # background) this teardown ends whatever run is recorded.
    epilog_at = epilog_time(environ) if opts.get("background") else None
    state_dir = config.state_dir
    try:
        lock = state.JobLock(state_dir, job_id)
        lock.__enter__()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return 0  # no state directory: nothing was ever set up here
        raise
    try:
        record = records.load(state_dir, job_id)
        if record is None:
            # Not set up (or already torn down). If this run's setup has not begun, it
            # now sets nothing up (launcher.lifecycle.lifecycle.take_setup_mark).
            state.drop_mark_before(state_dir, job_id, state.SETUP_MARK, epilog_at)
            if os.path.lexists(state.job_dir(state_dir, job_id)):
                errors = state.remove_job_dir(state_dir, job_id)  # a refusal's run.env only
                if errors:
                    raise JobnsError(f"teardown job {job_id}: {'; '.join(errors)}")
            lock.release_and_remove()
            return 0
        if epilog_at is not None and record.prolog_at is not None and record.prolog_at > epilog_at:
            return 0  # a later run of the job is set up: its own epilog ends it
        try:
            lifecycle.finish(
                config, job_id, record, force=bool(opts.get("force")), hurry=bool(opts.get("hurry"))
            )
        except UserError as e:
            warn(f"teardown {job_id}: {e}")
            return 0  # the job's problem, recorded; the node is fine
        except JobnsError:
            if not state.is_set_up(state_dir, job_id):
                lock.release_and_remove()  # --force forgot the record: the lock goes too
            raise
        lock.release_and_remove()
        return 0
    finally:
        try:
            # Whatever happened, this run's epilog mark goes: left, a later job of the
            # same id would find it (launcher.protocol.state "marks").
            state.drop_mark_before(state_dir, job_id, state.ENDING, epilog_at, state.ENDING_SLACK)
        finally:
            lock.__exit__()


EPILOG_AT = "JOBNS_EPILOG_AT"


def epilog_time(environ: dict[str, str]) -> float | None:
    """When the packaged epilog ran (JOBNS_EPILOG_AT, bash's $EPOCHREALTIME), or None
    (not given, or not a time: then this teardown ends whatever run is recorded)."""
    raw = environ.get(EPILOG_AT, "")
    try:
        at = float(raw)
    except ValueError:
        return None
    return at if 0 < at < 1e11 else None
