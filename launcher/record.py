"""The persisted job record (schemas/job-state.schema.json) and its conversions.

record <-> job <-> plan live here and nowhere else: a new record from a job and its
plan, the job and the plan a record describes (the record is the truth about where
the trees are, even if the config changed since), the host paths of the job's
directories, and the few values a joining task reads from run.env.
"""

from __future__ import annotations

import time

from launcher import transfer
from launcher.errors import JobnsError
from launcher.plan import TMP_TARGETS, build, tree_from_record, tree_record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from launcher.capacity import Capacities
    from launcher.config import Config
    from launcher.job import Job, User
    from launcher.plan import Plan
    from launcher.staging import Staging

Record = dict[str, object]
NO_PINS: dict[str, object] = {"user": None, "mnt": None, "mnt_dev": None, "mnt_ino": None}
NO_CAPACITIES: dict[str, object] = {"shm": None, "tmp": None}


def options_of(job: Job, caps: Capacities | None = None,
               staging: Staging | None = None) -> dict[str, object]:
    """What must match for a repeated setup to be the same setup."""
    return {"user": job.user.uid, "layout": job.layout, "no_rm_tmpdir": job.no_rm,
            "capacities": caps.record() if caps is not None else dict(NO_CAPACITIES),
            "session_dir": staging.session_dir if staging is not None else None}


def new_record(job: Job, plan: Plan | None, kill_wait: float, config: Config,
               caps: Capacities | None = None, staging: Staging | None = None,
               state: str = "pending") -> Record:
    """A fresh record; plan None for a refused job (it has no trees)."""
    now = time.time()
    arc = config.raw.get("arc")
    trees = [] if plan is None else [
        tree_record(t, caps.for_tree(t.role) if caps is not None else None)
        for t in plan.trees]
    return {
        "version": 1, "job_id": job.job_id,
        "user": {"name": job.user.name, "uid": job.user.uid, "gid": job.user.gid},
        "hostname": job.hostname, "layout": job.layout, "no_rm_tmpdir": job.no_rm,
        "state": state, "created": now, "updated": now, "trees": trees,
        "pins": dict(NO_PINS), "kill_wait": kill_wait,
        "arc": arc if isinstance(arc, dict) else None,
        "teardown_failures": 0, "errors": [], "history": [{"state": state, "at": now}],
        "options": options_of(job, caps, staging), "ran": False,
        "capacities": caps.record() if caps is not None else dict(NO_CAPACITIES),
        "staging": staging.record() if staging is not None else None,
    }


def user_of(record: Record) -> User:
    """The record's user, looked up again for the groups (else only its ids)."""
    from launcher.job import User, lookup_user

    user = record["user"]
    assert isinstance(user, dict)
    uid, gid = int(user["uid"]), int(user["gid"])
    try:
        return lookup_user(str(uid))
    except JobnsError:
        return User(str(user["name"]), uid, gid, (gid,), "/")


def owner(record: Record) -> int:
    user = record["user"]
    assert isinstance(user, dict)
    return int(user["uid"])


def job_of(record: Record) -> Job:
    """The job a record describes."""
    from launcher.job import Job

    return Job(str(record["job_id"]), user_of(record), str(record["hostname"]),
               str(record["layout"]), bool(record["no_rm_tmpdir"]))


def plan_of(config: Config, record: Record, job: Job) -> Plan:
    """The job's plan with the recorded trees."""
    plan = build(config, job)
    plan.trees = [tree_from_record(t) for t in trees_of(record)]
    return plan


def trees_of(record: Record) -> list[dict[str, object]]:
    trees = record["trees"]
    assert isinstance(trees, list)
    return trees


def pins_of(record: Record) -> dict[str, object]:
    pins = record["pins"]
    assert isinstance(pins, dict)
    return pins


def host_dirs(record: Record) -> dict[str, str]:
    """Where the job's /tmp, /var/tmp and /dev/shm are on the host."""
    out: dict[str, str] = {}
    for t in trees_of(record):
        tree = tree_from_record(t)
        if tree.role == "shm":
            out["/dev/shm"] = tree.path
        else:
            out.update({target: f"{tree.path}/{child}" for child, target in TMP_TARGETS})
    return out


def user_ids(record: Record) -> tuple[int, int, list[int]]:
    user = record["user"]
    assert isinstance(user, dict)
    return transfer.user_ids(int(user["uid"]), int(user["gid"]))


def run_env_values(record: Record, config: Config) -> dict[str, str]:
    pins = pins_of(record)
    user = record["user"]
    assert isinstance(user, dict)
    values = {
        "job_id": str(record["job_id"]), "uid": str(user["uid"]), "gid": str(user["gid"]),
        "user": str(user["name"]), "layout": str(record["layout"]),
        "user_pin": str(pins["user"] or ""), "mnt_pin": str(pins["mnt"]),
        "kill_wait": repr(record["kill_wait"]),
    }
    # The job environment as setup saw the config: later runs use exactly this.
    arc = config.arc
    if arc is not None:
        scratchdir = arc.scratchdir
        staging = record.get("staging")
        if isinstance(staging, dict) and staging.get("runtime_scratchdir"):
            # Dynamic scratch: ARC's wrapper appends <arc-job-id> to this (seed 001).
            scratchdir = str(staging["runtime_scratchdir"])
        values.update({"arc.shared_filesystem": "1" if arc.shared_filesystem else "",
                       "arc.scratchdir": scratchdir, "arc.movetool": arc.movetool,
                       "arc.shared_scratch": arc.shared_scratch})
    return values
