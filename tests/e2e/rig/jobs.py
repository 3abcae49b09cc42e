"""Run jobns jobs in rig nodes, the ways a batch system and a user would.

Modes (who starts `jobns run`):
  root        root runs the job as itself
  --user      root runs it for alice (`--user alice`), as slurmstepd would
  alice       alice herself (`su alice -c 'jobns run ...'`): the unprivileged mode,
              with a user namespace
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from containers.rig import ExecResult, Node

T = TypeVar("T")

MODES = ("root", "--user", "alice")
UIDS = {"root": 0, "--user": 1001, "alice": 1001}
SHARED_BASE = "/lustre/jobns"
SYNC_BASE = "/lustre/sync"  # barriers live outside the job trees: those are removed

# Poll for a file for at most ~60 s (600 x 0.1 s); exit 3 names what never came.
WAIT_FOR = """\
wait_for() {
  i=0
  while [ ! -e "$1" ]; do
    i=$((i + 1))
    if [ "$i" -gt 600 ]; then echo "$(hostname): timed out waiting for $1" >&2; exit 3; fi
    sleep 0.1
  done
}
"""


def new_job_id() -> str:
    # unique per test: a failed test's leftovers cannot collide with the next one's
    return str(100000 + secrets.randbelow(900000))


def jobns_run(
    job_id: str, mode: str, flags: Sequence[str], script: str, args: Sequence[str] = ()
) -> list[str]:
    """The argv (run as root in the node) that starts `sh -c script args` as a job."""
    argv = ["jobns", "run", "--job-id", job_id, *flags]
    if mode == "--user":
        argv += ["--user", "alice"]
    argv += ["--", "sh", "-c", script, "sh", *args]
    if mode == "alice":
        return ["su", "alice", "-s", "/bin/sh", "-c", shlex.join(argv)]
    return argv


def run_job(
    node: Node,
    job_id: str,
    mode: str,
    flags: Sequence[str],
    script: str,
    args: Sequence[str] = (),
    timeout: float = 90,
) -> ExecResult:
    return node.exec(jobns_run(job_id, mode, flags, script, args), timeout=timeout)


def concurrently(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run the calls at the same time (each blocks on a docker exec); results in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


@contextmanager
def in_background(fn: Callable[[], object]) -> Iterator[None]:
    """Run fn in a thread during the `with` body; re-raise its failure at the end."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(fn)
        yield
    future.result()


def describe(results: dict[str, ExecResult]) -> str:
    return "\n".join(
        f"== {name}: exit {r.exit_code}\n-- stdout\n{r.stdout}-- stderr\n{r.stderr}"
        for name, r in results.items()
    )
