"""`jobns gc`: remove what is left of jobs that no longer exist on this node.

Which jobs are dead: with Slurm reachable, every recorded job Slurm does not list
as pending/running/completing; without it, the recorded state decides (a setup or
teardown that was interrupted, i.e. its record says so and nobody holds its lock).
A dead job gets the rest of its epilog by state (launcher.lifecycle.finish: outputs
are staged out before anything is removed); a job Slurm still runs whose setup or
epilog was interrupted is recovered by state like `jobns recover` does.
Also swept: job trees in the bases with no record and no running task (a node
crash or reboot loses /run), temporary trees older than an hour, and trees teardown
sealed and retired (<name>~removing-*, root's) because a writer outside the job kept
refilling them.

gc removes only what it proved dead (SECURITY.md rule 8): a job with any record,
readable or not, is never swept as "unrecorded"; a damaged record is reported and
kept for the administrator; a squatter's entry moved aside (<name>~moved-*) is never
touched.
"""

from __future__ import annotations

import os
import subprocess
import time

from launcher import config as config_mod
from launcher import fs, state
from launcher import record as records
from launcher.errors import JobnsError, UserError
from launcher.inputs import Options
from launcher.job import safe_component
from launcher.lifecycle import finish, recover_one, require_root
from launcher.plan import Tree
from launcher.record import Record

ALIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
                "REQUEUED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
                "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE"}
TEMP_MAX_AGE = 3600.0


def slurm_alive_jobs() -> set[str] | None:
    """Ids of jobs Slurm still knows as alive, or None when Slurm cannot be asked."""
    try:
        r = subprocess.run(["squeue", "-h", "-a", "-o", "%A %T"], capture_output=True,
                           text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    alive = set()
    for line in r.stdout.splitlines():
        job_id, _, st = line.partition(" ")
        if st.strip() in ALIVE_STATES:
            alive.add(job_id.strip())
    return alive


def dead_by_record(state_dir: str, job_id: str, record: Record) -> bool:
    if record.state in ("teardown", "teardown-fail", "complete"):
        return True
    if record.state in ("pending", "staging-in", "staged-in", "pre-run", "post-run",
                           "staging-out"):
        # An interrupted setup or epilog (or a stage-out kept after a failure): a live one
        # holds the job lock.
        try:
            with state.JobLock(state_dir, job_id, blocking=False):
                return True
        except JobnsError:
            return False
    pinned = record.pins
    if pinned.mnt is not None:
        try:
            st = os.stat(pinned.mnt)
        except OSError:
            return True
        # An unmounted pin is the empty file itself, not the namespace.
        return (st.st_dev, st.st_ino) != (pinned.mnt_dev, pinned.mnt_ino)
    return False


def recover_live(config: config_mod.Config, job_id: str, dry: bool) -> int:
    """A job Slurm still runs whose setup or epilog was interrupted (nobody holds its
    lock): act by state, as `jobns recover` does. Returns the number of problems."""
    try:
        with state.JobLock(config.state_dir, job_id, blocking=False) as lock:
            record = records.load(config.state_dir, job_id)
            if record is None or record.state == "running":
                return 0
            print(f"{'would recover' if dry else 'recovering'} job {job_id} (alive in Slurm, "
                  f"interrupted in state {record.state})")
            if not dry:
                print(f"job {job_id}: {recover_one(config, job_id, record)}")
                if not state.is_set_up(config.state_dir, job_id):
                    lock.release_and_remove()
    except JobnsError as e:
        if "is held by another jobns" in str(e):
            return 0  # being set up or torn down right now
        print(f"jobns gc: job {job_id}: {e}")
        return 1
    return 0


def unrecorded_trees(config: config_mod.Config, recorded: set[str], jobs: set[str]
                     ) -> list[Tree]:
    """job-* trees in the local and shm bases that look like jobns's, that no record (of
    any job in `jobs`, readable or not) names, and that nobody holds; plus temporary and
    retired trees."""
    found = []
    for role, base, children in (("local", config.local_base, ("tmp", "var_tmp")),
                                 ("shm", config.shm_base, ())):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            path = f"{base.rstrip('/')}/{name}"
            if name.startswith(".job-") and ".jobns-" in name:
                try:
                    if time.time() - os.lstat(path).st_mtime > TEMP_MAX_AGE:
                        found.append(Tree(role, base, (), name, (), True))
                except OSError:
                    pass
                continue
            if fs.RETIRED in name and name.startswith("job-") and _root_dir(path):
                found.append(Tree(role, base, (), name, (), True))
                continue
            job_id = name[4:] if name.startswith("job-") else ""
            if not _job_id(job_id) or job_id in jobs or path in recorded:
                continue
            tree = Tree(role, base, (), name, children, True)
            if fs.looks_like_ours(tree) and not fs.in_use(tree):
                found.append(tree)
    return found


def _job_id(value: str) -> bool:
    try:
        safe_component(value, "job id", "")
    except JobnsError:
        return False
    return True


def _root_dir(path: str) -> bool:
    """A directory of root's: only teardown makes one with a retired tree's name."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def main(opts: Options, _command: list[str]) -> int:
    require_root("gc")
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None)
    dry = bool(opts.get("dry_run"))
    alive = slurm_alive_jobs() if not opts.get("no_slurm") else None
    problems = 0
    recorded_paths: set[str] = set()
    jobs = set(state.list_jobs(config.state_dir))
    for job_id in sorted(jobs):
        try:
            record = records.load(config.state_dir, job_id)
        except JobnsError as e:
            # Unreadable is not dead: its trees may be a running job's. Kept for the admin.
            print(f"jobns gc: job {job_id}: damaged record kept, nothing of the job removed "
                  f"(inspect it, then jobns teardown --job-id {job_id} --force): {e}")
            problems += 1
            continue
        if record is None:
            continue
        recorded_paths |= {t.tree.path for t in record.trees}
        dead = job_id not in alive if alive is not None else \
            dead_by_record(config.state_dir, job_id, record)
        if not dead:
            if alive is not None and record.state not in ("running", state.REFUSED):
                problems += recover_live(config, job_id, dry)
            continue
        why = "not alive in Slurm" if alive is not None else f"recorded state {record.state}"
        print(f"{'would remove' if dry else 'removing'} job {job_id} ({why})")
        if dry:
            continue
        try:
            with state.JobLock(config.state_dir, job_id, blocking=False) as lock:
                fresh = records.load(config.state_dir, job_id)
                if fresh is not None:
                    # The whole epilog, by state: outputs are staged out before removal.
                    finish(config, job_id, fresh, force=True)
                lock.release_and_remove()
        except UserError as e:
            print(f"jobns gc: job {job_id}: kept: {e}")
        except JobnsError as e:
            print(f"jobns gc: job {job_id}: {e}")
            problems += 1
    if not dry:
        # Containers whose holder was killed and whose poststop never ran (hook/holds.py).
        from hook.holds import sweep

        for err in sweep(config.state_dir, config):
            print(f"jobns gc: {err}")
            problems += 1
    for tree in unrecorded_trees(config, recorded_paths, jobs):
        what = "retired by teardown" if fs.RETIRED in tree.name else "no job record, unused"
        print(f"{'would remove' if dry else 'removing'} {tree.path} ({what})")
        if not dry:
            for err in fs.remove_recorded(tree):
                print(f"jobns gc: {err}")
                problems += 1
    return 125 if problems else 0
