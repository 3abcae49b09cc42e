"""The burst buffer's steps on the controller (`jobns bb STEP`), as slurmscriptd runs
them through jobns's burst_buffer.lua, in Slurm's order:

  setup      the job's directives read from its batch script and comment, checked in
             full (a mistake fails the step: Slurm holds the job with jobns's message),
             its shared tree made as the job's user will have it, its record written;
  data-in    its stage_in copies into the shared tmpdir, each as the job's user and
             bounded by [staging] timeout; done ones are recorded and never repeated;
  data-out   its stage_out copies out of the shared tmpdir, as the job's user; a failure
             keeps every output whole in the tree (stage-out-failed);
  teardown   the shared tree and the record removed (kept under no_rm_tmpdir, and kept
             with the outputs after a failed stage-out unless Slurm hurries: scancel
             --hurry, a failed stage-in or pre-run).

Every step is idempotent, because slurmctld re-runs steps after a restart (setup and
data-in after a teardown, data-out from the start, teardown again). Each holds the job's
step lock (launcher.burstbuffer.store.StepLock), so a step re-run after a restart waits
for the one still running. The per-node part (namespace, /dev/shm, capacities, the
rest of the staging) stays in the prolog, which reads the record (see handed_over).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jobns.launcher.backing import fs
from jobns.launcher.burstbuffer import pools, store
from jobns.launcher.burstbuffer.record import (
    POOL,
    STAGE_OUT_FAILED,
    STAGED_IN,
    STAGED_OUT,
    BbRecord,
)
from jobns.launcher.lifecycle.lifecycle import directives_from
from jobns.launcher.model import jobsize
from jobns.launcher.model.config import Config
from jobns.launcher.model.directives import Directives, Symbols, script_header
from jobns.launcher.model.job import Job, User, hostname, lookup_user
from jobns.launcher.model.plan import Plan, Tree, build
from jobns.launcher.protocol import state
from jobns.launcher.staging import model as staging
from jobns.launcher.staging.model import Copy
from jobns.launcher.system import slurmquery
from jobns.launcher.system.errors import JobnsError, UserError, warn

MAX_SCRIPT = 4 << 20  # Slurm's own default max_script_size


@dataclass(slots=True)
class JobInfo:
    """What slurmctld tells setup about the job (24.11 and later: job_info; 22.05: setup
    asks squeue). None: not told."""

    comment: str | None = None
    work_dir: str | None = None
    job_name: str | None = None
    tmp_mib: int | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None


def enabled(config: Config, job_id: str, step: str) -> bool:
    """Is the lifecycle on ([burst_buffer] enabled)? Without it burst_buffer.lua only
    checks directives at submission (as before the lifecycle existed): every step
    succeeds and does nothing, and the prolog stages on the nodes as on any cluster."""
    if pools.Settings(config).enabled:
        return True
    warn(
        f"bb {step} job {job_id}: nothing to do: [burst_buffer] enabled is not true in "
        f"{config.source or 'the config'} (the prolog sets the job up and stages its data)",
        log=None,
    )
    return False


def setup(
    config: Config, job_id: str, uid: int, gid: int, script: str, size: int, info: JobInfo
) -> BbRecord | None:
    if size > 0 and not pools.Settings(config).enabled:
        raise UserError(
            f"#BB_LUA capacity= asks for space in the pool {POOL}, which this cluster "
            "does not offer ([burst_buffer] is not enabled): drop capacity="
        )
    if not enabled(config, job_id, "setup"):
        return None
    user = _user(uid, gid)
    text = _read_script(script, job_id, config)
    comment = info.comment or ""
    directives = directives_from(text, None, comment, config)
    layout = (directives.layout if directives is not None else None) or "local"
    if size > 0 and layout != "shared":
        raise UserError(
            f"#BB_LUA pool={POOL} capacity= reserves space in the job's shared tmpdir, "
            f"but its layout is {layout}: add '#JOBNS shared_tmpdir' or drop capacity="
        )
    no_rm = bool(directives is not None and directives.no_rm_tmpdir)
    job = Job(job_id, user, hostname(), layout, no_rm)
    plan = build(config, job, dirs=False)
    tree = plan.trees[0] if layout == "shared" else None
    copies_in, copies_out = _owned_copies(config, job, plan, directives, info, tree)
    record = BbRecord(
        job_id=job_id,
        uid=user.uid,
        gid=user.gid,
        user=user.name,
        layout=layout,
        no_rm_tmpdir=no_rm,
        size=size,
        script_header=script_header(text),
        comment=comment,
        work_dir=info.work_dir or "",
        job_name=info.job_name or "",
        array_job_id=info.array_job_id or "",
        array_task_id=info.array_task_id or "",
        tmp_mib=info.tmp_mib,
        tree_path=tree.path if tree is not None else "",
        stage_in=[c.record() for c in copies_in],
        stage_out=[c.record() for c in copies_out],
    )
    with store.StepLock(config, job_id):
        dfd = _records(config)
        try:
            old = store.load_at(dfd, job_id, store.records_dir(config))
            if old is not None and old.uid == uid:
                # Setup again without a teardown between (a re-run step): what was
                # copied stays copied.
                record.stage_in_done = [
                    line for line in old.stage_in_done if line in record.lines("stage_in")
                ]
            elif old is not None:
                # An earlier job of this id (ids restart when a controller loses its
                # state), kept after a failed stage-out: its tree is moved aside below.
                warn(f"bb setup {job_id}: warning: replacing the record of user {old.user}")
            if tree is not None:
                aside: list[str] = []
                handle = fs.acquire_tree(tree, user.uid, user.gid, lock=False, aside=aside)
                handle.close()
                for note in aside:
                    warn(f"bb setup {job_id}: warning: {note}")
            store.save_at(dfd, record)
        finally:
            os.close(dfd)
    _publish(config)
    return record


def data_in(config: Config, job_id: str) -> BbRecord | None:
    if not enabled(config, job_id, "data-in"):
        return None
    with store.StepLock(config, job_id) as lock:
        dfd = _records(config)
        try:
            record = _load(config, dfd, job_id, lock)
            errors = _copy_pending(config, dfd, record, "staging-in")
            if errors:
                raise UserError(_failed("stage-in", errors, "the inputs are untouched"))
            state.pause_point("bb-data-in")  # test hook: copied, not yet staged-in
            record.state, record.errors = STAGED_IN, []
            store.save_at(dfd, record)
        finally:
            os.close(dfd)
    _publish(config)
    return record


def data_out(config: Config, job_id: str) -> BbRecord | None:
    if not enabled(config, job_id, "data-out"):
        return None
    with store.StepLock(config, job_id) as lock:
        dfd = _records(config)
        try:
            record = store.load_at(dfd, job_id, store.records_dir(config))
            if record is None:
                lock.remove()
                return None  # torn down already (a re-run after a restart)
            state.pause_point("bb-data-out")  # test hook: nothing copied out yet
            errors = _stage_out(config, dfd, record)
            if errors:
                raise UserError(
                    _failed(
                        "stage-out",
                        errors,
                        f"every output is kept in {record.tree_path}; `jobns bb "
                        f"--job-id {job_id} data-out` retries, `jobns bb --job-id "
                        f"{job_id} --hurry teardown` discards",
                    )
                )
            return record
        finally:
            os.close(dfd)


def teardown(config: Config, job_id: str, hurry: bool) -> str:
    """Remove the job's shared tree and record; what was done, in a few words.

    Slurm hurries a teardown whose job never ran, was cancelled (`scancel --hurry`) or
    failed its stage-in or pre-run: then everything goes. An unhurried one comes after
    a stage-out, or for a buffer whose job slurmctld lost in a restart (it runs no
    stage-out then): copies still to make out of the tree are made first, and if they
    fail the tree and the record are kept (the outputs are the user's results)."""
    if not enabled(config, job_id, "teardown"):
        return "nothing to tear down"
    with store.StepLock(config, job_id) as lock:
        dfd = _records(config)
        try:
            record = store.load_at(dfd, job_id, store.records_dir(config))
            if record is None:
                said = "nothing to tear down"
            else:
                errors = [] if hurry else _stage_out(config, dfd, record)
                if errors:
                    said = f"kept {record.tree_path}: its stage-out failed"
                    warn(f"bb teardown {job_id}: {said}; {'; '.join(errors)}")
                    return said
                said = "removed"
                if record.tree_path and not record.no_rm_tmpdir:
                    said = _remove_tree(config, record)
                elif record.tree_path:
                    said = f"kept {record.tree_path} (no_rm_tmpdir)"
                store.delete_at(dfd, job_id)
            lock.remove()
        finally:
            os.close(dfd)
    _publish(config)
    return said


def _stage_out(config: Config, dfd: int, record: BbRecord) -> list[str]:
    """The stage_out copies not made yet, each as the job's user; errors (the record then
    says stage-out-failed, and every output stays whole in the tree)."""
    errors = _copy_pending(config, dfd, record, "staging-out")
    if errors:
        record.state = STAGE_OUT_FAILED
        store.save_at(dfd, record)
        return errors
    if record.state != STAGED_OUT:
        record.state, record.errors = STAGED_OUT, []
        store.save_at(dfd, record)
    return []


def status(config: Config) -> list[str]:
    """`scontrol show bbstat`: the pool, then one line per job the burst buffer holds."""
    if not pools.Settings(config).enabled:
        return [
            "jobns burst buffer: directives are checked at submission; [burst_buffer] "
            "enabled is not set, so the prolog sets jobs up and stages their data"
        ]
    lines = [f"jobns burst buffer: pool {POOL}: {pools.publish(config).strip()}"]
    dfd = store.open_records(config, create=False)
    if dfd is None:
        return lines
    try:
        for name in sorted(os.listdir(dfd)):
            if not (name.startswith("job-") and name.endswith(".json")):
                continue
            job_id = name[len("job-") : -len(".json")]
            try:
                r = store.load_at(dfd, job_id, store.records_dir(config))
            except JobnsError as e:
                lines.append(f"job {job_id}: unreadable record: {e}")
                continue
            if r is None:
                continue
            lines.append(
                f"job {r.job_id} user {r.user}: {r.state}, layout {r.layout}, "
                f"size {r.size}, stage_in {len(r.stage_in_done)}/{len(r.stage_in)}, "
                f"stage_out {len(r.stage_out_done)}/{len(r.stage_out)}"
                + (f", tree {r.tree_path}" if r.tree_path else "")
                + (f": {r.errors[0]}" if r.errors else "")
            )
    finally:
        os.close(dfd)
    return lines


# --------------------------------------------------------------------------------- parts


def _user(uid: int, gid: int) -> User:
    if uid == 0:
        raise JobnsError("jobns bb: root's jobs get no burst buffer (Slurm refuses them too)")
    user = lookup_user(str(uid))
    if user.gid != gid:
        # Slurm says which group the job runs as (sbatch --gid): that one, with her groups.
        user = User(user.name, user.uid, gid, user.groups, user.home)
    return user


def _read_script(path: str, job_id: str, config: Config) -> str:
    """The batch script slurmctld saved (its path, or, when a #BB_LUA line holds a %
    symbol, a copy of the directive lines only: then the saved script is read)."""
    if path.startswith("/proc/"):
        path = _saved_script(job_id, config)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(f"read the job's batch script {path}: {e.strerror}") from None
    try:
        data = store.read_bounded(fd, MAX_SCRIPT)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _saved_script(job_id: str, config: Config) -> str:
    text, problem = slurmquery.scontrol(["show", "config"], config.slurm_bin)
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "StateSaveLocation" and value.strip().startswith("/"):
            return f"{value.strip()}/hash.{int(job_id) % 10}/job.{job_id}/script"
    raise JobnsError(f"find the job's saved batch script: scontrol show config: {problem}")


def _owned_copies(
    config: Config,
    job: Job,
    plan: Plan,
    directives: Directives | None,
    info: JobInfo,
    tree: Tree | None,
) -> tuple[list[Copy], list[Copy]]:
    """The stage_in and stage_out copies whose job side is the shared tree (/tmp,
    /var/tmp of the shared layout): the burst buffer's; the rest is the prolog's."""
    if tree is None or directives is None or not (directives.stage_in or directives.stage_out):
        return [], []
    symbols = Symbols(
        job_id=job.job_id,
        array_job_id=info.array_job_id,
        array_task_id=info.array_task_id,
        workdir=info.work_dir,
        user=job.user.name,
        job_name=info.job_name,
    )
    top = tree.path + "/"
    stg, notes = staging.build(config, job, plan, directives, None, symbols)
    for note in notes:
        warn(f"bb setup {job.job_id}: {note}")
    if stg is None:
        return [], []
    return (
        [c for c in stg.stage_in if c.destination.startswith(top)],
        [c for c in stg.stage_out if c.source.startswith(top)],
    )


def _copy_pending(config: Config, dfd: int, record: BbRecord, phase: str) -> list[str]:
    """The copies of a phase (staging-in, staging-out) not made yet, in order; each made
    one is recorded at once, so none is made twice after a restart. The first failure's
    errors are recorded and returned; nothing after it is tried."""
    copies, done = (
        (record.stage_in, record.stage_in_done)
        if phase == "staging-in"
        else (record.stage_out, record.stage_out_done)
    )
    for c in copies:
        if c["line"] in done:
            continue
        errors = _copy(record, c, phase, config.staging.timeout)
        if errors:
            record.errors = errors
            store.save_at(dfd, record)
            return errors
        done.append(c["line"])
        store.save_at(dfd, record)
    return []


def _copy(record: BbRecord, c: dict[str, str], phase: str, deadline: float) -> list[str]:
    """One copy, in a worker that is the job's user, bounded by [staging] timeout."""
    from jobns.launcher.staging import transfer

    uid, gid, groups = record.uid, record.gid, _groups(record)

    def work() -> transfer.Result:
        t = transfer.Transfer(phase, None, deadline)
        t.copy_path(c["source"], c["destination"], c["line"])
        return t.result()

    what = "stage in" if phase == "staging-in" else "stage out"
    try:
        result = transfer.as_user(uid, gid, groups, what, work, deadline)
    except transfer.OutOfTime as e:
        return [f"{c['line']!r} did not finish within {e.seconds:g} s ([staging] timeout)"]
    for w in transfer.warnings_of(result):
        warn(f"bb {what} {record.job_id}: {w}")
    return transfer.errors_of(result)


def _groups(record: BbRecord) -> list[int]:
    try:
        return list(lookup_user(str(record.uid)).groups)
    except JobnsError:
        return [record.gid]


def _failed(what: str, errors: list[str], after: str) -> str:
    more = f" (and {len(errors) - 1} more, in slurmctld's log)" if len(errors) > 1 else ""
    return f"{what} failed: {errors[0]}{more}; {after}"


def _records(config: Config) -> int:
    dfd = store.open_records(config, create=True)
    assert dfd is not None
    return dfd


def _load(config: Config, dfd: int, job_id: str, lock: store.StepLock) -> BbRecord:
    record = store.load_at(dfd, job_id, store.records_dir(config))
    if record is None:
        lock.remove()
        raise JobnsError(
            f"jobns bb: job {job_id} has no burst-buffer record in {store.records_dir(config)}"
            ": slurm_bb_setup did not run for it (is burst_buffer.lua jobns's?)"
        )
    return record


def _remove_tree(config: Config, record: BbRecord) -> str:
    job = Job(record.job_id, User(record.user, record.uid, record.gid, (), "/"), "bb", "shared")
    tree = build(config, job, dirs=False).trees[0]
    if tree.path != record.tree_path:
        warn(
            f"bb teardown {record.job_id}: shared_base changed since setup: "
            f"{record.tree_path} is left for the administrator"
        )
        return f"left {record.tree_path}"
    fs.seal(tree, fs.nothing_ours)
    errors = fs.remove_recorded(tree, fs.nothing_ours)
    if errors:
        raise JobnsError(f"remove {tree.path}: {'; '.join(errors)}")
    return f"removed {tree.path}"


def _publish(config: Config) -> None:
    try:
        pools.publish(config)
    except (OSError, JobnsError) as e:
        warn(f"bb: could not update the pool for slurm_bb_pools: {e}")


def job_info_from_slurm(job_id: str, config: Config) -> JobInfo:
    """22.05 gives setup no job_info: ask squeue, one field a call (free text such as a
    comment can hold any separator), and the --tmp as the prolog would."""
    info = JobInfo()
    for attr, fmt in (("comment", "%k"), ("work_dir", "%Z"), ("job_name", "%j")):
        text, problem = slurmquery.squeue(job_id, fmt, config.slurm_bin)
        if text is None:
            raise JobnsError(f"ask Slurm about job {job_id}: squeue: {problem}")
        value = text.rstrip("\n")
        if "\n" in value:
            raise JobnsError(f"ask Slurm about job {job_id}: squeue printed several rows")
        setattr(info, attr, None if value in ("", "(null)") else value)
    text, _problem = slurmquery.squeue(job_id, "%F %K", config.slurm_bin)
    parts = (text or "").split()
    if len(parts) == 2 and parts[1].isdigit():
        info.array_job_id, info.array_task_id = parts
    tmp = jobsize.slurm_tmp(job_id, config.slurm_bin)
    info.tmp_mib = -(-tmp // (1 << 20)) if tmp else None
    return info
