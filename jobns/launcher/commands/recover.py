"""`jobns recover`: after a crash or restart, bring every job on this node (or one) to a
state nobody is working on: running, refused, or gone (launcher.lifecycle.lifecycle.recover_one
acts by the recorded state). A job whose lock is held is being handled already."""

from __future__ import annotations

import sys

from jobns.launcher.lifecycle import release
from jobns.launcher.lifecycle.lifecycle import recover_one, require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model import record as records
from jobns.launcher.model.inputs import Options
from jobns.launcher.model.job import safe_component
from jobns.launcher.protocol import state
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.log import log


def main(opts: Options, _command: list[str]) -> int:
    require_root("recover")
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None)
    raw = opts.get("job_id")
    jobs = (
        [safe_component(str(raw), "job id", "pass --job-id with letters, digits, '.', '_', '-'")]
        if raw
        else state.list_jobs(config.state_dir)
    )
    # Epilogs' release processes that were killed (launcher.lifecycle.release): finished first.
    problems = release.finish_all(config.state_dir, False, _report)
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
            record = records.load(config.state_dir, job_id)
            if record is not None:
                done = recover_one(config, job_id, record)
                print(f"job {job_id}: {done}")
                log(done, job_id, record.user_name)
            if not state.is_set_up(config.state_dir, job_id):
                lock.release_and_remove()
        except JobnsError as e:
            print(f"jobns recover: job {job_id}: {e}", file=sys.stderr)
            log(str(e), job_id, level="error")
            problems += 1
        finally:
            lock.__exit__()
    return 125 if problems else 0


def _report(text: str, job_id: str, user: str, level: str) -> None:
    print(text, file=sys.stderr if level == "error" else sys.stdout)
    log(text, job_id or None, user or None, level=level)
