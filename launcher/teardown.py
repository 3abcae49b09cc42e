"""`jobns teardown` (the epilog): end what still runs in the job, drop the pins, remove the
directories and the state. Safe to run twice, after a crash, or on a half-set-up job.

The epilog as a whole is launcher.lifecycle.finish (post-run, staging-out, then this
module's teardown state). What follows is the teardown state itself.

Order matters: unpin first (no new task can join), then terminate every process
in the job's mount namespace (seed 004: SIGCONT+SIGTERM, kill_wait, SIGKILL, wait
for all), then remove the trees, then look once more for stragglers. A failing
step is reported and the others still run; the whole teardown is tried three
times before the job is left in `teardown-fail` for the administrator (seed 003).
"""

from __future__ import annotations

import errno
import os
import sys
import time

from launcher import config as config_mod
from launcher import fs, state
from launcher.errors import JobnsError
from launcher.fastimport import signal
from launcher.job import job_id_from
from launcher.run import Options
from launcher.setup import require_root, tree_from_record, unpin
from launcher.supervise import signal_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ATTEMPTS = 3
RETRY_PAUSE = 1.0
UNKILLABLE_WAIT = 30.0


def processes_in_namespace(dev: int, ino: int) -> list[int]:
    """Every process whose mount namespace is (dev, ino)."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/mnt")
        except OSError:
            continue  # gone, or a zombie (its namespaces are already released)
        if (st.st_dev, st.st_ino) == (dev, ino):
            out.append(int(name))
    return out


def terminate_namespace(dev: int, ino: int, kill_wait: float) -> list[str]:
    """SIGCONT+SIGTERM, wait kill_wait, SIGKILL, wait for all; errors if any survive."""
    pids = processes_in_namespace(dev, ino)
    if not pids:
        return []
    signal_all(pids, signal.SIGCONT)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + kill_wait
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = processes_in_namespace(dev, ino)
    deadline = time.monotonic() + UNKILLABLE_WAIT
    while pids:
        signal_all(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            return [f"terminate the job's processes: {sorted(pids)} still alive after SIGKILL "
                    f"(stuck in the kernel?); see /proc/PID/stack"]
        time.sleep(0.05)
        pids = processes_in_namespace(dev, ino)
    return []


def hold_namespace(pins: dict[str, object]) -> int | None:
    """An fd on the job's mount namespace while teardown runs, or None if it is unpinned.

    Namespace inode numbers are reused once a namespace is freed: holding it keeps
    (dev, ino) meaning *this* job's namespace, so we never signal another job's tasks.
    """
    mnt, dev, ino = pins.get("mnt"), pins.get("mnt_dev"), pins.get("mnt_ino")
    if not isinstance(mnt, str):
        return None
    try:
        fd = os.open(mnt, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (dev, ino):
        os.close(fd)  # the bare pin file: already unpinned by an earlier attempt
        return None
    return fd


def removable(t: Mapping[str, object], record: Mapping[str, object]) -> bool:
    """A recorded tree teardown removes: a job that ran owns all its trees; a setup that
    failed or crashed owns only what it made (never a directory it found in place)."""
    return bool(t.get("remove")) and (record.get("ran", True) is True or t.get("made", True)
                                      is True)


def teardown_once(record: dict[str, object], unstage: bool = True) -> list[str]:
    from launcher import sizelimit
    from launcher.lifecycle import unstage_session
    from launcher.staging import Staging

    errors: list[str] = []
    pins = record["pins"]
    assert isinstance(pins, dict)
    job_id = str(record["job_id"])
    held = hold_namespace(pins)
    try:
        errors += unpin(pins)
        dev, ino = pins.get("mnt_dev"), pins.get("mnt_ino")
        kill_wait = float(str(record["kill_wait"]))
        if held is not None and isinstance(dev, int) and isinstance(ino, int):
            errors += terminate_namespace(dev, ino, kill_wait)
        staging = Staging.from_record(record.get("staging"))
        scratch = staging.scratch_tree if staging is not None else None
        keep_scratch = False
        if unstage and staging is not None and scratch is not None:
            # Seed 001: scratch is removed only once its content is back in the session
            # directory. After a successful stage-out it is empty; after a failed or
            # interrupted setup it holds the job's inputs, which go back where they were.
            problems = unstage_session(record, staging)
            errors += problems
            keep_scratch = bool(problems)
        trees = record["trees"]
        assert isinstance(trees, list)
        for t in trees:
            tree = tree_from_record(t)
            if isinstance(t.get("capacity"), int):
                # Unmount first: removal never crosses into another file system.
                errors += sizelimit.unmount(tree, job_id)
            if removable(t, record):
                errors += fs.remove_recorded(tree)
        st = record.get("staging")
        scratch_rec = st.get("scratch_tree") if isinstance(st, dict) else None
        if scratch is not None and isinstance(scratch_rec, dict) and not keep_scratch \
                and removable(scratch_rec, record):
            errors += fs.remove_recorded(scratch)
        if held is not None and isinstance(dev, int) and isinstance(ino, int):
            errors += terminate_namespace(dev, ino, 0.0)  # a task that joined meanwhile
    finally:
        if held is not None:
            os.close(held)
    return errors


def teardown_locked(state_dir: str, job_id: str, record: dict[str, object],
                    force: bool = False, hurry: bool = False) -> None:
    """The teardown state: tried ATTEMPTS times, then teardown-fail (seed 003).
    hurry: remove scratch without moving its content back (like scancel --hurry)."""
    if record["state"] not in ("teardown", "teardown-fail"):
        state.enter(state_dir, job_id, record, "teardown")
    errors: list[str] = []
    for attempt in range(ATTEMPTS):
        errors = teardown_once(record, unstage=not hurry)
        if not errors:
            state.enter(state_dir, job_id, record, "complete")
            errors = state.remove_job_dir(state_dir, job_id)
            if not errors:
                return
        fails = record["teardown_failures"]
        assert isinstance(fails, int)
        record["teardown_failures"] = fails + 1
        record["errors"] = errors
        state.write_record(state_dir, job_id, record)
        if attempt + 1 < ATTEMPTS:
            time.sleep(RETRY_PAUSE)
    state.enter(state_dir, job_id, record, "teardown-fail")
    for err in errors:
        sys.stderr.write(f"jobns: teardown {job_id}: {err}\n")
    if force:
        state.remove_job_dir(state_dir, job_id)
        raise JobnsError(f"teardown job {job_id}: forgot its record (--force) although "
                         f"{len(errors)} problem(s) remain (listed above); clean those by hand")
    raise JobnsError(f"teardown job {job_id}: {len(errors)} problem(s) after {ATTEMPTS} "
                     "attempts (listed above); the job is kept as teardown-fail: fix them and "
                     "run jobns teardown again, or --force to forget it")


def main(opts: Options, _command: list[str]) -> int:
    require_root("teardown")
    environ = dict(os.environ)
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None, environ)
    raw_id = opts.get("job_id")
    job_id = job_id_from(None if raw_id is None else str(raw_id), environ)
    try:
        lock = state.JobLock(config.state_dir, job_id)
        lock.__enter__()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return 0  # no state directory: nothing was ever set up here
        raise
    try:
        record = state.read_record(config.state_dir, job_id)
        if record is None:
            lock.release_and_remove()
            return 0  # not set up on this node (or already torn down): nothing to do
        from launcher.lifecycle import finish

        finish(config, job_id, record, force=bool(opts.get("force")),
               hurry=bool(opts.get("hurry")))
        lock.release_and_remove()
        return 0
    finally:
        lock.__exit__()
