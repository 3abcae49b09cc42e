"""`jobns gc`: remove what is left of jobs that no longer exist on this node.

Which jobs are dead: with Slurm reachable, every recorded job Slurm does not list
as pending/running/completing; without it, the recorded state decides (a setup or
teardown that was interrupted, i.e. its record says so and nobody holds its lock).
A dead job gets the rest of its epilog by state (launcher.lifecycle.lifecycle.finish: outputs
are staged out before anything is removed); a job Slurm still runs whose setup or
epilog was interrupted is recovered by state like `jobns recover` does.
Disk capacities: images and loop devices of jobs with no record (launcher.backing.diskimage);
a loop device a process outside a finished job still holds is named (a warning), since
it counts in the node cap until that process ends.
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
import stat
import subprocess
import time
from collections.abc import Callable

from jobns.hook import holds
from jobns.launcher.backing import fs, kinds
from jobns.launcher.lifecycle import release
from jobns.launcher.lifecycle.lifecycle import finish, recover_one, require_root
from jobns.launcher.lifecycle.metrics import write_gc_summary
from jobns.launcher.model import config as config_mod
from jobns.launcher.model import record as records
from jobns.launcher.model.inputs import Options
from jobns.launcher.model.job import safe_component
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import Record
from jobns.launcher.mountns import binds, cdi
from jobns.launcher.mountns.dirs import is_cover
from jobns.launcher.protocol import state
from jobns.launcher.system import sysprog
from jobns.launcher.system.errors import JobnsError, UserError
from jobns.launcher.system.log import log
from jobns.launcher.system.mountinfo import Mount
from jobns.launcher.system.removal import take_detached

ALIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUED",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "POWER_UP_NODE",
}
TEMP_MAX_AGE = 3600.0
SQUEUE_CHUNK = 200  # job ids per squeue call


def slurm_job_states(job_ids: list[str], bin_dir: str = "") -> dict[str, str] | None:
    """Slurm's state of each of these jobs (the ones recorded on this node: never the
    whole queue, which on a big cluster is a full-queue query per node). A numeric id
    missing from the answer is unknown to the controller (never a Slurm job, or ended
    more than MinJobAge ago); other ids are never asked about. None when Slurm cannot be
    asked."""
    states: dict[str, str] = {}
    numeric = [j for j in job_ids if j.isdigit()]  # anything else is no Slurm job id
    for i in range(0, len(numeric), SQUEUE_CHUNK):
        chunk = numeric[i : i + SQUEUE_CHUNK]
        got = _squeue(chunk, bin_dir)
        if got is None and len(chunk) > 1:
            # The query failed as a whole (squeue does when an id is unknown, e.g. a lone
            # one on 22.05): ask per id, so one unknown id cannot hide the others.
            got = {}
            for job_id in chunk:
                one = _squeue([job_id], bin_dir)
                if one is None:
                    return None
                got.update(one)
        if got is None:
            return None
        states.update(got)
    return states


def _squeue(job_ids: list[str], bin_dir: str) -> dict[str, str] | None:
    """{id: state} from one squeue call; {} for a lone id the controller does not know;
    None when the call failed."""
    try:
        r = subprocess.run(
            sysprog.argv(
                ["squeue", "-h", "-a", "-t", "all", "-j", ",".join(job_ids), "-o", "%A %T"],
                bin_dir,
            ),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=sysprog.environment(keep=("SLURM_CONF",)),  # never PATH, SQUEUE_*...
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return {} if len(job_ids) == 1 and "Invalid job id" in r.stderr else None
    out = {}
    for line in r.stdout.splitlines():
        job_id, _, st = line.strip().partition(" ")
        out[job_id] = st.strip()
    return out


def say(
    text: str,
    job_id: str | None = None,
    user: str | None = None,
    level: str = "",
    dry: bool = False,
) -> None:
    """A line of gc's report (stdout); also to syslog (launcher.system.log) unless it is a dry
    run."""
    print(text)
    if not dry:
        log(text, job_id, user, level=level or "info")


def dead_by_record(state_dir: str, job_id: str, record: Record) -> bool:
    if record.state in ("teardown", "teardown-fail", "complete"):
        return True
    if record.state in ("pending", "staging-in", "staged-in", "pre-run", "post-run", "staging-out"):
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
            say(
                f"{'would recover' if dry else 'recovering'} job {job_id} (alive in Slurm, "
                f"interrupted in state {record.state})",
                job_id,
                record.user_name,
                dry=dry,
            )
            if not dry:
                say(
                    f"job {job_id}: {recover_one(config, job_id, record)}", job_id, record.user_name
                )
                if not state.is_set_up(config.state_dir, job_id):
                    lock.release_and_remove()
    except JobnsError as e:
        if "is held by another jobns" in str(e):
            return 0  # being set up or torn down right now
        say(f"jobns gc: job {job_id}: {e}", job_id, level="error", dry=dry)
        return 1
    return 0


def unrecorded_trees(config: config_mod.Config, recorded: set[str], jobs: set[str]) -> list[Tree]:
    """job-* trees in the local and shm bases and in each [[dirs]] base that look like
    jobns's, that no record (of any job in `jobs`, readable or not) names, and that
    nobody holds; plus temporary and retired trees."""
    found = []
    for role, base, children in bases(config):
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
                if path not in recorded:  # else a release process of an epilog's has it
                    found.append(Tree(role, base, (), name, (), True))
                continue
            job_id = name[4:] if name.startswith("job-") else ""
            if not _job_id(job_id) or job_id in jobs or path in recorded:
                continue
            tree = Tree(role, base, (), name, children, True)
            # Looked at without entering a mount: one on it or its children (a user's
            # stalled FUSE server would hang us) means not proven dead, left alone; a
            # [[dirs]] tree's cover (root's, launcher.mountns.dirs) is looked through.
            seen = fs.lookalike(tree, _cover_on(tree) if role == "dir" else fs.nothing_ours)
            if seen is not None and not seen[1]:
                found.append(tree)
    return found


def _cover_on(tree: Tree) -> Callable[[Mount], bool]:
    return lambda m: is_cover(m, tree)


def bases(config: config_mod.Config) -> list[tuple[str, str, tuple[str, ...]]]:
    """(role, base, children) of every base whose job-* trees are jobns's: the local and
    shm bases, and each [[dirs]] base (config refuses bases that overlap)."""
    out = [("local", config.local_base, ("tmp", "var_tmp")), ("shm", config.shm_base, ())]
    return out + [("dir", d.base, ()) for d in config.dirs]


def _job_id(value: str) -> bool:
    try:
        safe_component(value, "job id", "")
    except JobnsError:
        return False
    return True


def _root_dir(path: str) -> bool:
    """A directory of root's: only teardown makes one with a retired tree's name."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0


def main(opts: Options, _command: list[str]) -> int:
    require_root("gc")
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None)
    dry = bool(opts.get("dry_run"))
    problems = 0
    recorded_paths: set[str] = set()
    jobs = set(state.list_jobs(config.state_dir))
    slurm = slurm_job_states(sorted(jobs), config.slurm_bin) if not opts.get("no_slurm") else None
    alive = None if slurm is None else {j for j, st in slurm.items() if st in ALIVE_STATES}
    summary = {"dead_jobs": 0, "unknown_to_slurm": 0, "leftovers": 0, "problems": 0}
    # Epilogs' release processes that were killed (launcher.lifecycle.release): finished first.
    problems += release.finish_all(
        config.state_dir,
        dry,
        lambda text, job, user, level: say(text, job or None, user or None, level, dry),
    )
    for job_id in sorted(jobs):
        try:
            record = records.load(config.state_dir, job_id)
        except JobnsError as e:
            # Unreadable is not dead: its trees may be a running job's. Kept for the admin.
            say(
                f"jobns gc: job {job_id}: damaged record kept, nothing of the job removed "
                f"(inspect it, then jobns teardown --job-id {job_id} --force): {e}",
                job_id,
                level="error",
                dry=dry,
            )
            problems += 1
            continue
        if record is None:
            if os.path.isdir(state.job_dir(config.state_dir, job_id)):
                # A job directory without its record (deleted?): not proven dead either.
                say(
                    f"jobns gc: job {job_id}: its state directory has no record; kept, "
                    "nothing of the job removed (inspect it, then jobns teardown --job-id "
                    f"{job_id} --force)",
                    job_id,
                    level="error",
                    dry=dry,
                )
                problems += 1
            continue
        recorded_paths |= {t.tree.path for t in record.trees}
        # Only a numeric id can be a Slurm job's; any other is judged by its record.
        by_slurm = alive is not None and job_id.isdigit()
        dead = (
            job_id not in alive
            if alive is not None and by_slurm
            else dead_by_record(config.state_dir, job_id, record)
        )
        if not dead:
            if by_slurm and record.state not in ("running", state.REFUSED):
                problems += recover_live(config, job_id, dry)
            continue
        why = "not alive in Slurm" if by_slurm else f"recorded state {record.state}"
        summary["dead_jobs"] += 1
        if by_slurm and slurm is not None and job_id not in slurm:
            summary["unknown_to_slurm"] += 1
            why = "unknown to Slurm"
            say(
                f"jobns gc: warning: Slurm does not know job {job_id} (not a Slurm job, or it "
                f"ended more than MinJobAge ago); {'it would be' if dry else 'it is'} removed",
                job_id,
                record.user_name,
                level="warning",
                dry=dry,
            )
        say(
            f"{'would remove' if dry else 'removing'} job {job_id} ({why})",
            job_id,
            record.user_name,
            dry=dry,
        )
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
            say(f"jobns gc: job {job_id}: kept: {e}", job_id, record.user_name, "warning")
        except JobnsError as e:
            say(f"jobns gc: job {job_id}: {e}", job_id, record.user_name, "error")
            problems += 1
    if not dry:
        # Containers whose holder was killed and whose poststop never ran (jobns/hook/holds.py).
        for err in holds.sweep(config.state_dir, config):
            say(f"jobns gc: {err}", level="error")
            problems += 1
    # CDI specs of jobs with no record left (a teardown that crashed, a record removed).
    for job_id in cdi.orphans(config, lambda: set(state.list_jobs(config.state_dir))):
        say(
            f"{'would remove' if dry else 'removing'} the CDI spec of job {job_id} (no job record)",
            job_id,
            dry=dry,
        )
        for err in [] if dry else cdi.remove(config, job_id):
            say(f"jobns gc: {err}", level="error")
            problems += 1
    # Root's mount points of jobs with no record left (launcher.mountns.binds): before the trees,
    # which they hold.
    for job_id in binds.orphans(config.state_dir, set(state.list_jobs(config.state_dir))):
        say(
            f"{'would detach' if dry else 'detaching'} root's mount points of job {job_id} "
            "(no job record)",
            job_id,
            dry=dry,
        )
        for err in [] if dry else binds.release(config.state_dir, job_id):
            say(f"jobns gc: {err}", level="error")
            problems += 1
    # What each backing keeps outside the trees (a disk capacity's mounts, loop devices,
    # images) of jobs with no state left; before the trees, so a mount on one is released
    # properly.
    for backing in kinds.every():
        for note in backing.sweep(config, lambda: set(state.list_jobs(config.state_dir)), dry):
            say(note, dry=dry)
    # Held by a process outside a finished job: nothing gc may take, so a warning each.
    for entry in kinds.held(config):
        say(f"jobns gc: warning: {kinds.held_line(entry)}", level="warning", dry=dry)
    recorded_paths |= release.named(config.state_dir)  # a live release removes those
    for tree in unrecorded_trees(config, recorded_paths, jobs):
        what = "retired by teardown" if fs.RETIRED in tree.name else "no job record, unused"
        summary["leftovers"] += 1
        say(f"{'would remove' if dry else 'removing'} {tree.path} ({what})", dry=dry)
        if not dry:
            # What a dead job's user mounted deeper inside is detached, never entered.
            for err in fs.remove_recorded(tree):
                say(f"jobns gc: {err}", level="error")
                problems += 1
            for note in take_detached():
                say(f"jobns gc: {note}", dry=dry)
    if not dry:
        summary["problems"] = problems
        write_gc_summary(config.state_dir, summary)
    return 125 if problems else 0
