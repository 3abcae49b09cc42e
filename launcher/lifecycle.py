"""A job's life on this node as seed 003's burst-buffer states: persisted, resumable.

  jobns setup      pending -> staging-in -> staged-in -> pre-run -> running
  jobns teardown   running -> post-run -> staging-out -> teardown -> complete (forgotten)

Each state is written (atomically, launcher.state) *before* its work starts, so after
a crash the record says what was interrupted, and every step can run again:

  state             on entering it                      after a crash (recover / gc)
  pending           record written; no task may join    teardown, then set up again
  staging-in        trees (+capacity tmpfs), scratch,   teardown (inputs moved back),
                    stage_in copies, session -> scratch then set up again
  staged-in         -                                   the same
  pre-run           pin the namespace, pre-run program  pre-run again
  running           tasks may join                      nothing
  post-run          no task may join; end its processes post-run again
                    (kill_wait); post-run program
  staging-out       stage_out copies, scratch->session  post-run again
  teardown          unpin, kill, unmount, remove (3x)   teardown again
  teardown-fail     kept for the administrator          teardown again
  complete          the record is removed next          forget it

Failures: a failing stage-in or pre-run fails the setup (exit 125) and runs the
teardown (inputs go back to the session directory first). A failing post-run program
is reported and the epilog goes on (outputs must still be saved). A failing stage-out
keeps the job in staging-out with every output in scratch or in the session directory:
`jobns teardown` again resumes it, `jobns teardown --hurry` discards what is left.
A job that never ran gets no post-run and no stage_out copies (seed 003: a job that
never ran goes straight to teardown), but its session inputs still go back.
"""

from __future__ import annotations

import copy
import os
import sys

from launcher import fs, sizelimit, state, transfer
from launcher.capacity import Capacities
from launcher.errors import JobnsError
from launcher.fastimport import set_pdeathsig, signal
from launcher.plan import TMP_TARGETS, build
from launcher.setup import (
    new_record,
    pin_namespaces,
    require_root,
    run_env_values,
    tree_from_record,
    unpin,
)
from launcher.staging import Staging
from launcher.teardown import hold_namespace, teardown_locked, terminate_namespace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.config import Config
    from launcher.fs import TreeHandle
    from launcher.job import Job
    from launcher.plan import Plan
    from launcher.run import Options

Record = dict[str, object]
SETUP_STATES = ("pending", "staging-in", "staged-in", "pre-run")
EPILOG_STATES = ("running", "post-run", "staging-out")


def warn(msg: str) -> None:
    sys.stderr.write(f"jobns: {msg}\n")


# ------------------------------------------------------------------------ who and where


def job_of(record: Record) -> Job:
    """The job a record describes (its user looked up again for the groups)."""
    from launcher.job import Job, User, lookup_user

    user = record["user"]
    assert isinstance(user, dict)
    uid, gid = int(user["uid"]), int(user["gid"])
    try:
        u = lookup_user(str(uid))
    except JobnsError:
        u = User(str(user["name"]), uid, gid, (gid,), "/")
    return Job(str(record["job_id"]), u, str(record["hostname"]), str(record["layout"]),
               bool(record["no_rm_tmpdir"]))


def plan_of(config: Config, record: Record, job: Job) -> Plan:
    """The job's plan with the recorded trees (the record is the truth, even if the
    config changed since)."""
    plan = build(config, job)
    trees = record["trees"]
    assert isinstance(trees, list)
    plan.trees = [tree_from_record(t) for t in trees]
    return plan


def host_dirs(record: Record) -> dict[str, str]:
    """Where the job's /tmp, /var/tmp and /dev/shm are on the host."""
    out: dict[str, str] = {}
    trees = record["trees"]
    assert isinstance(trees, list)
    for t in trees:
        tree = tree_from_record(t)
        if tree.role == "shm":
            out["/dev/shm"] = tree.path
        else:
            out.update({target: f"{tree.path}/{child}" for child, target in TMP_TARGETS})
    return out


def _user_ids(record: Record) -> tuple[int, int, list[int]]:
    user = record["user"]
    assert isinstance(user, dict)
    return transfer.user_ids(int(user["uid"]), int(user["gid"]))


# --------------------------------------------------------------------------- programs


def program_env(config: Config, record: Record, phase: str) -> dict[str, str]:
    """The pre-run/post-run environment: the job's own variables (paths as the job sees
    them), Slurm's prolog/epilog variables, and JOBNS_* with the host paths."""
    from launcher.environment import job_environment

    job = job_of(record)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("SLURM_")})
    env.update(job_environment(config, job))
    staging = Staging.from_record(record.get("staging"))
    if staging is not None and staging.runtime_scratchdir and "RUNTIME_LOCAL_SCRATCH_DIR" \
            in env:
        env["RUNTIME_LOCAL_SCRATCH_DIR"] = staging.runtime_scratchdir
    pins = record["pins"]
    assert isinstance(pins, dict)
    dirs = host_dirs(record)
    env.update({
        "JOBNS_JOB_ID": job.job_id, "JOBNS_USER": job.user.name,
        "JOBNS_UID": str(job.user.uid), "JOBNS_GID": str(job.user.gid),
        "JOBNS_STATE": phase, "JOBNS_LAYOUT": job.layout,
        "JOBNS_HOST_TMP": dirs.get("/tmp", ""), "JOBNS_HOST_VAR_TMP": dirs.get("/var/tmp", ""),
        "JOBNS_HOST_SHM": dirs.get("/dev/shm", ""),
        # `nsenter --mount=$JOBNS_MNT_NS` enters the job's mount namespace.
        "JOBNS_MNT_NS": str(pins.get("mnt") or ""), "JOBNS_USER_NS": str(pins.get("user") or ""),
        "JOBNS_SESSION_DIR": (staging.session_dir or "") if staging else "",
        "JOBNS_SCRATCH_DIR": (staging.scratch_dir or "") if staging else "",
    })
    return env


def run_program(config: Config, record: Record, phase: str) -> str | None:
    """Run [lifecycle] pre_run/post_run as root without a shell; None, or what failed."""
    key = phase.replace("-", "_")
    command = getattr(config.lifecycle, key)
    if not command:
        return None
    import shlex
    import subprocess

    argv = shlex.split(command)
    timeout = config.lifecycle.program_timeout
    sys.stderr.flush()
    try:
        # Its output goes to our stderr: the prolog/epilog log. Own process group, so a
        # timeout kills whatever it started too.
        # It dies with jobns (as Slurm kills running burst-buffer scripts when slurmctld
        # stops): `jobns recover` runs it again, never alongside an orphaned copy.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                stderr=sys.stderr.fileno(), cwd="/", process_group=0,
                                env=program_env(config, record, phase),
                                preexec_fn=lambda: set_pdeathsig(signal.SIGKILL))
    except OSError as e:
        return f"{phase} program {argv[0]}: {e.strerror}; fix [lifecycle] {key}"
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return (f"{phase} program {command!r} still ran after {timeout:g} s and was killed; "
                "raise [lifecycle] program_timeout or fix the program")
    if status != 0:
        how = f"was killed by signal {-status}" if status < 0 else \
            f"failed with exit status {status}"
        return f"{phase} program {command!r} {how} (its output is above)"
    return None


# ---------------------------------------------------------------------------- staging


def _check_session_dir(record: Record, staging: Staging) -> None:
    """The session directory must be a real directory of the job user's (root looks,
    without following a symlink in its last component)."""
    import stat

    path = staging.session_dir
    if path is None:
        return
    user = record["user"]
    assert isinstance(user, dict)
    try:
        st = os.lstat(path)
    except OSError as e:
        raise JobnsError(f"stage in session directory {path}: {e.strerror}; was the job "
                         "submitted through ARC?") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != user["uid"]:
        raise JobnsError(f"refuse session directory {path}: it must be a directory owned by "
                         f"the job user (uid {user['uid']}), not a symlink or someone "
                         "else's; check --session-dir / [staging] session_dir")


def stage_in(record: Record, staging: Staging) -> list[str]:
    """stage_in copies, then session -> scratch; as the job user."""
    movetool = transfer.split_movetool(staging.movetool)

    def work() -> transfer.Result:
        t = transfer.Transfer("staging-in", movetool, staging.timeout)
        for c in staging.stage_in:  # first: a source may lie in the session directory
            t.copy_path(c.source, c.destination, c.line)
        if staging.session_dir and staging.scratch_dir:
            skip = frozenset(staging.stdio) if staging.link_stdio else frozenset()
            t.move_contents(staging.session_dir, staging.scratch_dir, skip)
            if staging.link_stdio and not t.errors:
                t.link_stdio(staging.session_dir, staging.scratch_dir, staging.stdio)
        return t.result()

    return _worker(record, "stage in", work)


def stage_out(record: Record, staging: Staging, ran: bool) -> list[str]:
    """stage_out copies (a job that ran only), then scratch -> session; as the job user."""
    movetool = transfer.split_movetool(staging.movetool)

    def work() -> transfer.Result:
        t = transfer.Transfer("staging-out", movetool, staging.timeout)
        if ran:  # first: a source may lie in scratch
            for c in staging.stage_out:
                t.copy_path(c.source, c.destination, c.line)
        if staging.session_dir and staging.scratch_dir:
            if staging.link_stdio:
                t.unlink_stdio(staging.session_dir, staging.scratch_dir, staging.stdio)
            t.move_contents(staging.scratch_dir, staging.session_dir)
        return t.result()

    return _worker(record, "stage out", work)


def unstage_session(record: Record, staging: Staging) -> list[str]:
    """Teardown's part: whatever is still in scratch goes back to the session directory."""
    if not (staging.session_dir and staging.scratch_dir):
        return []
    if not os.path.isdir(staging.scratch_dir):
        return []  # never made, or already removed
    movetool = transfer.split_movetool(staging.movetool)
    session, scratch = staging.session_dir, staging.scratch_dir

    def work() -> transfer.Result:
        t = transfer.Transfer("teardown", movetool, staging.timeout)
        if staging.link_stdio:
            t.unlink_stdio(session, scratch, staging.stdio)
        t.move_contents(scratch, session)
        return t.result()

    return _worker(record, "move scratch back", work)


def _worker(record: Record, what: str, work: Callable[[], transfer.Result]) -> list[str]:
    uid, gid, groups = _user_ids(record)
    result = transfer.as_user(uid, gid, groups, what, work)
    for w in transfer.warnings_of(result):
        warn(f"job {record['job_id']}: {w}")
    return transfer.errors_of(result)


# ------------------------------------------------------------------------------ setup


def start(config: Config, job: Job, plan: Plan, kill_wait: float, caps: Capacities | None,
          staging: Staging | None) -> Record:
    """A fresh setup: persist the request, then run it to `running`; on failure the
    teardown runs (nothing is lost) and the error is raised again."""
    record = new_record(job, plan, kill_wait, config, caps, staging)
    state.write_record(config.state_dir, job.job_id, record)
    state.close_run_env(config.state_dir, job.job_id, "pending")
    state.pause_point("pending")
    run_setup(config, record, job, plan)
    return record


def run_setup(config: Config, record: Record, job: Job, plan: Plan) -> None:
    """pending -> running; any failure aborts (teardown) and is raised again."""
    state_dir, job_id = config.state_dir, job.job_id
    with _Aborting(config, job_id, record) as handles:
        state.enter(state_dir, job_id, record, "staging-in")
        staging = Staging.from_record(record.get("staging"))
        if staging is not None:
            _check_session_dir(record, staging)
        handles += make_trees(config, record, job, plan)
        if staging is not None:
            errors = stage_in(record, staging)
            if errors:
                for err in errors:
                    warn(f"setup {job_id}: {err}")
                raise JobnsError(f"setup job {job_id}: stage-in failed ({len(errors)} "
                                 "problem(s), listed above); the job is torn down and its "
                                 "inputs are back in its session directory")
        state.enter(state_dir, job_id, record, "staged-in")
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
    """Create the job's trees (and mount their capacity tmpfs), and its scratch tree."""
    uid, gid = plan.owner
    trees = record["trees"]
    assert isinstance(trees, list)
    handles: list[TreeHandle] = []
    try:
        for tree, rec in zip(plan.trees, trees, strict=True):
            h = fs.acquire_tree(tree, uid, gid)
            handles.append(h)
            if h.created:
                rec["made"] = True
                state.write_record(config.state_dir, job.job_id, record)
            size = rec.get("capacity")
            if not isinstance(size, int):
                continue
            if not h.created:
                raise JobnsError(f"set a capacity on {tree.path}: it existed before this "
                                 "setup (a task of the job ran without jobns setup?); "
                                 "remove it or drop the capacity directive")
            sizelimit.mount(h, size, uid, gid, job.job_id)
            again = fs.acquire_tree(tree, uid, gid, create=False)
            again.created = True
            h.close()
            handles[-1] = again
        staging = record.get("staging")
        scratch = staging.get("scratch_tree") if isinstance(staging, dict) else None
        if isinstance(scratch, dict):
            h = fs.acquire_tree(tree_from_record(scratch), uid, gid, lock=False)
            h.close()
            if h.created:
                scratch["made"] = True
                state.write_record(config.state_dir, job.job_id, record)
    except BaseException:
        for h in handles:
            h.close()
        raise
    return handles


def pre_run(config: Config, record: Record, job: Job, plan: Plan,
            handles: list[TreeHandle]) -> None:
    """pre-run -> running: pin the namespace, run the pre-run program, open the job."""
    state_dir, job_id = config.state_dir, job.job_id
    state.enter(state_dir, job_id, record, "pre-run")
    pins = record["pins"]
    assert isinstance(pins, dict)
    for _ in range(3):  # a crashed earlier pre-run's pins (even stacked)
        unpin(pins)
    record["pins"] = pin_namespaces(plan, handles, job, state_dir)
    state.write_record(state_dir, job_id, record)
    failure = run_program(config, record, "pre-run")
    if failure is not None:
        raise JobnsError(f"setup job {job_id}: {failure}; the job is torn down")
    state.write_run_env(state_dir, job_id, run_env_values(record, config))
    record["ran"] = True
    state.enter(state_dir, job_id, record, "running")


def abort(config: Config, job_id: str, record: Record, cause: BaseException) -> None:
    """A setup failed: tear the job down (inputs back first). If even that fails, the
    record stays (teardown-fail / its state) for `jobns teardown` or `recover`."""
    try:
        finish(config, job_id, record, force=False)
    except JobnsError as e:
        warn(f"setup {job_id}: after {cause}: {e}")


# ----------------------------------------------------------------------------- epilog


def finish(config: Config, job_id: str, record: Record, force: bool = False,
           hurry: bool = False) -> None:
    """The epilog from whatever state the job is in (see the module docstring)."""
    state_dir = config.state_dir
    st = str(record["state"])
    if st == "complete":
        errors = state.remove_job_dir(state_dir, job_id)
        if errors:
            raise JobnsError(f"teardown job {job_id}: {'; '.join(errors)}")
        return
    ran = record.get("ran", st in EPILOG_STATES) is True
    if st in SETUP_STATES or st in EPILOG_STATES:
        state.close_run_env(state_dir, job_id, "post-run" if ran else "teardown")
    if ran and st in EPILOG_STATES:
        state.enter(state_dir, job_id, record, "post-run")
        stuck = _terminate(record)
        for err in stuck:
            warn(f"post-run {job_id}: {err}")
        if not hurry:
            failure = run_program(config, record, "post-run")
            if failure is not None:
                warn(f"post-run {job_id}: {failure}; staging out anyway")
                _note_errors(state_dir, job_id, record, [failure])
            state.enter(state_dir, job_id, record, "staging-out")
            staging = Staging.from_record(record.get("staging"))
            errors = stage_out(record, staging, ran) if staging is not None else []
            if errors:
                for err in errors:
                    warn(f"stage-out {job_id}: {err}")
                _note_errors(state_dir, job_id, record, errors)
                where = " and ".join(p for p in (staging.scratch_dir, staging.session_dir)
                                     if p) if staging is not None else ""
                raise JobnsError(
                    f"stage-out of job {job_id} failed ({len(errors)} problem(s), listed "
                    f"above); the job is kept in staging-out and every output is whole in "
                    f"{where or 'the job directories'}: fix the problem and run jobns "
                    "teardown again (it resumes), or jobns teardown --hurry to discard what "
                    "was not staged out")
    teardown_locked(state_dir, job_id, record, force=force, hurry=hurry)


def _terminate(record: Record) -> list[str]:
    """End every process left in the job's namespace (seed 004: SIGCONT+SIGTERM,
    kill_wait, SIGKILL), keeping the pins: teardown still needs them."""
    pins = record["pins"]
    assert isinstance(pins, dict)
    held = hold_namespace(pins)
    if held is None:
        return []
    try:
        dev, ino = pins.get("mnt_dev"), pins.get("mnt_ino")
        assert isinstance(dev, int) and isinstance(ino, int)
        return terminate_namespace(dev, ino, float(str(record["kill_wait"])))
    finally:
        os.close(held)


def _note_errors(state_dir: str, job_id: str, record: Record, errors: list[str]) -> None:
    record["errors"] = errors
    state.write_record(state_dir, job_id, record)


# ---------------------------------------------------------------------------- recover


def recover_one(config: Config, job_id: str, record: Record) -> str:
    """Act on an interrupted job by its recorded state (seed 003, slurmctld restart)."""
    st = str(record["state"])
    if st == "running":
        return "running: nothing to do"
    if st in ("pending", "staging-in", "staged-in"):
        request = copy.deepcopy(record)
        finish(config, job_id, record)  # teardown: inputs back, trees removed
        redo = _restart(request)
        job = job_of(redo)
        plan = plan_of(config, redo, job)
        state.write_record(config.state_dir, job_id, redo)
        state.close_run_env(config.state_dir, job_id, "pending")
        run_setup(config, redo, job, plan)
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
    import time

    now = time.time()
    redo = copy.deepcopy(record)
    redo.update({"state": "pending", "updated": now, "ran": False, "teardown_failures": 0,
                 "errors": [], "pins": {"user": None, "mnt": None, "mnt_dev": None,
                                        "mnt_ino": None}})
    history = redo["history"]
    assert isinstance(history, list)
    history.append({"state": "pending", "at": now})
    trees = redo["trees"]
    assert isinstance(trees, list)
    for t in trees:
        t["made"] = False
    staging = redo.get("staging")
    if isinstance(staging, dict) and isinstance(staging.get("scratch_tree"), dict):
        staging["scratch_tree"]["made"] = False
    return redo


def recover_main(opts: Options, _command: list[str]) -> int:
    """`jobns recover`: after a crash or restart, bring every job (or one) to a state
    nobody is working on: running, or gone. A job whose lock is held is being handled."""
    from launcher import config as config_mod
    from launcher.job import safe_component

    require_root("recover")
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None)
    raw = opts.get("job_id")
    jobs = [safe_component(str(raw), "job id", "pass --job-id with letters, digits, '.', "
                           "'_', '-'")] if raw else state.list_jobs(config.state_dir)
    problems = 0
    for job_id in jobs:
        lock = state.JobLock(config.state_dir, job_id, blocking=False)
        try:
            lock.__enter__()
        except FileNotFoundError:
            continue  # no state directory: nothing was ever set up here
        except JobnsError:
            print(f"job {job_id}: busy: another jobns holds its lock (it is being handled)")
            continue
        try:
            record = state.read_record(config.state_dir, job_id)
            if record is not None:
                print(f"job {job_id}: {recover_one(config, job_id, record)}")
            if not state.is_set_up(config.state_dir, job_id):
                lock.release_and_remove()
        except JobnsError as e:
            print(f"jobns recover: job {job_id}: {e}", file=sys.stderr)
            problems += 1
        finally:
            lock.__exit__()
    return 125 if problems else 0
