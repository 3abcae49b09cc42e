"""The staging steps of a job's life (ARC's session staging and #JOBNS
stage_in/stage_out): stage_in and stage_out copies, the ARC session directory moved into
scratch and back. Each runs in a worker that is the job user (launcher.staging.transfer.as_user),
so whatever the user's paths point at, root never reads or writes through them; and each
has a deadline, [staging] timeout (Staging.deadline): a file system the user serves (a
stopped FUSE server) can stall the worker, which is then killed, never root."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from jobns.launcher.model.record import Record, user_ids
from jobns.launcher.staging import transfer
from jobns.launcher.staging.model import Staging
from jobns.launcher.system.errors import UserError, warn


def check_session_dir(record: Record, staging: Staging) -> None:
    """The session directory must be a real directory of the job user's (root looks,
    without following a symlink in its last component)."""
    path = staging.session_dir
    if path is None:
        return
    uid = record.uid
    try:
        st = os.lstat(path)
    except OSError as e:
        raise UserError(
            f"stage in session directory {path}: {e.strerror}; was the job submitted through ARC?"
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise UserError(
            f"refuse session directory {path}: it must be a directory owned by "
            f"the job user (uid {uid}), not a symlink or someone else's; check "
            "--session-dir / [staging] session_dir"
        )


def stage_in(record: Record, staging: Staging) -> list[str]:
    """stage_in copies, then session -> scratch; as the job user."""
    movetool = transfer.split_movetool(staging.movetool)

    def work() -> transfer.Result:
        t = transfer.Transfer("staging-in", movetool, staging.deadline)
        for c in staging.stage_in:  # first: a source may lie in the session directory
            t.copy_path(c.source, c.destination, c.line)
        if staging.session_dir and staging.scratch_dir:
            skip = frozenset(staging.stdio) if staging.link_stdio else frozenset()
            t.move_contents(staging.session_dir, staging.scratch_dir, skip)
            if staging.link_stdio and not t.errors:
                t.link_stdio(staging.session_dir, staging.scratch_dir, staging.stdio)
        return t.result()

    try:
        return _worker(record, staging, "stage in", work)
    except transfer.OutOfTime as e:
        # Raised here, within setup's abort: its teardown moves back what was moved.
        raise UserError(f"stage-in of job {record.job_id} {_late(e)}") from None


def stage_out(record: Record, staging: Staging, ran: bool) -> list[str]:
    """stage_out copies (a job that ran only), then scratch -> session; as the job user."""
    movetool = transfer.split_movetool(staging.movetool)

    def work() -> transfer.Result:
        t = transfer.Transfer("staging-out", movetool, staging.deadline)
        if ran:  # first: a source may lie in scratch
            for c in staging.stage_out:
                t.copy_path(c.source, c.destination, c.line)
        if staging.session_dir and staging.scratch_dir:
            if staging.link_stdio:
                t.unlink_stdio(staging.session_dir, staging.scratch_dir, staging.stdio)
            t.move_contents(staging.scratch_dir, staging.session_dir)
        return t.result()

    try:
        return _worker(record, staging, "stage out", work)
    except transfer.OutOfTime as e:
        # Like any failed stage-out: the job stays in staging-out, every output whole.
        return [f"stage-out of job {record.job_id} {_late(e)}"]


def unstage_session(record: Record, staging: Staging) -> list[str]:
    """Teardown's part: whatever is still in scratch goes back to the session directory."""
    if not (staging.session_dir and staging.scratch_dir):
        return []
    if not os.path.isdir(staging.scratch_dir):
        return []  # never made, or already removed
    movetool = transfer.split_movetool(staging.movetool)
    session, scratch = staging.session_dir, staging.scratch_dir

    def work() -> transfer.Result:
        t = transfer.Transfer("teardown", movetool, staging.deadline)
        if staging.link_stdio:
            t.unlink_stdio(session, scratch, staging.stdio)
        t.move_contents(scratch, session)
        return t.result()

    try:
        return _worker(record, staging, "move scratch back", work)
    except transfer.OutOfTime as e:
        return [f"moving scratch back of job {record.job_id} {_late(e)}"]


def _late(e: transfer.OutOfTime) -> str:
    """The rest of the one line saying a worker ran out of time."""
    left = (
        ""
        if e.reaped
        else f" (its worker, pid {e.pid}, is stuck in a file system and ends once that answers)"
    )
    return (
        f"did not finish within {e.seconds:g} s ([staging] timeout): a path it copies "
        "from or to did not answer (a stopped FUSE server, a hung network file system) "
        f"or the data is too large; the worker was killed{left}: fix the paths or "
        "stage less, or ask the administrator to raise [staging] timeout"
    )


def _worker(
    record: Record, staging: Staging, what: str, work: Callable[[], transfer.Result]
) -> list[str]:
    uid, gid, groups = user_ids(record)
    result = transfer.as_user(uid, gid, groups, what, work, staging.deadline)
    for w in transfer.warnings_of(result):
        warn(f"job {record.job_id}: {w}")
    return transfer.errors_of(result)
