"""What a background setup or teardown (`--background`) does when the node fails it.

The packaged prolog of an enforced node and every packaged epilog return at once and
leave `jobns setup` / `jobns teardown` running on their own (docs/admin.md "What the
prolog and epilog wait for"). Nobody reads their exit status then, so what slurmd would
have done with a failed prolog or epilog is done here: the node is drained through
`scontrol update ... State=DRAIN` with the reason, and a failed setup records the job as
refused, so its tasks (waiting in the SPANK plugin) fail at once with the reason instead
of waiting. A user's mistake never gets here: it refuses her job and the node stays in
service, as in the foreground.
"""

from __future__ import annotations

import os
import re
import subprocess

from jobns.launcher.system import sysprog
from jobns.launcher.system.errors import JobnsError

# Slurm's node names: a hostname-like word (slurmd gives the prolog SLURMD_NODENAME).
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_REASON = 300  # a drain reason is one line in sinfo -R; the whole story is in syslog


def _scontrol(args: list[str], bin_dir: str) -> tuple[int, str]:
    """scontrol with args (no shell, never the caller's PATH): (exit status, its output
    on one line); status -1 when it could not run."""
    try:
        r = subprocess.run(
            sysprog.argv(["scontrol", *args], bin_dir),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=sysprog.environment(keep=("SLURM_CONF",)),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, str(e)
    out = r.stdout if r.returncode == 0 else (r.stderr or r.stdout)
    return r.returncode, " ".join(out.split())


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def drain(what: str, error: str, bin_dir: str = "") -> str:
    """Drain this node (SLURMD_NODENAME, else the hostname) with `jobns <what>: <error>`
    as the reason; returns one line saying what happened, for the log. Never raises: a
    drain that fails leaves the log line as the only trace, as a failed epilog's would.
    A node jobns drained already keeps its reason: the first failure (a setup's) is the
    one an administrator needs, not the teardowns that follow from it."""
    node = _node_name()
    if not _NODE_NAME.fullmatch(node):
        return f"not drained: {node!r} is not a Slurm node name"
    reason = " ".join(f"jobns {what}: {error}".split())[:MAX_REASON]
    rc, shown = _scontrol(["show", "node", "--oneliner", node], bin_dir)
    if (
        rc == 0
        and "DRAIN" in _field(shown, "State")
        and _field(shown, "Reason").startswith("jobns")
    ):
        return f"node {node} is drained already (reason kept: {_field(shown, 'Reason')})"
    rc, out = _scontrol(["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], bin_dir)
    if rc != 0:
        return f"not drained: scontrol update NodeName={node}: exit {rc}: {out[:200]}"
    return f"drained node {node}: {reason}"


def _field(oneliner: str, key: str) -> str:
    """The value of Key= in `scontrol show -o` output (Reason runs to its bracketed
    author, e.g. `Reason=jobns setup: x [root@1700000000]`)."""
    m = re.search(rf"(?:^| ){key}=(.*?)(?= [A-Z][A-Za-z]*=|$)", oneliner)
    return m.group(1) if m else ""


def requeue(job_id: str, why: str, bin_dir: str = "") -> str:
    """Requeue the job after the node failed it (drain first, so Slurm sends it
    elsewhere), with `why` in its AdminComment for the user and the administrator.
    Slurm requeues only a batch job that may be requeued (not `--no-requeue`, not an
    salloc/srun allocation): otherwise its tasks fail with the reason. One line for
    the log, starting "requeued" when it was; never raises."""
    if not job_id.isdigit():
        return f"not requeued: {job_id!r} is not a Slurm job id"
    rc, out = _scontrol(["requeue", job_id], bin_dir)
    if rc != 0:
        return f"not requeued (scontrol requeue {job_id}: exit {rc}: {out[:200]})"
    comment = " ".join(f"jobns on {_node_name()}: {why}".split())[:MAX_REASON]
    _scontrol(["update", f"JobId={job_id}", f"AdminComment={comment}"], bin_dir)
    return f"requeued job {job_id}: {comment}"


def failure_text(e: BaseException) -> str:
    """The one line a failure is reported with (a bug names its type, as cli does)."""
    if isinstance(e, JobnsError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}"
