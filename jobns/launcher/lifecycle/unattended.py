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


def drain(what: str, error: str, bin_dir: str = "") -> str:
    """Drain this node (SLURMD_NODENAME, else the hostname) with `jobns: <what>: <error>`
    as the reason; returns one line saying what happened, for the log. Never raises: a
    drain that fails leaves the log line as the only trace, as a failed epilog's would."""
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    if not _NODE_NAME.fullmatch(node):
        return f"not drained: {node!r} is not a Slurm node name"
    reason = " ".join(f"jobns {what}: {error}".split())[:MAX_REASON]
    try:
        argv = sysprog.argv(
            ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
            bin_dir,
        )
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=sysprog.environment(keep=("SLURM_CONF",)),  # never the caller's PATH
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not drained: scontrol update NodeName={node}: {e}"
    if r.returncode != 0:
        why = " ".join((r.stderr or r.stdout).split())[:200]
        return f"not drained: scontrol update NodeName={node}: exit {r.returncode}: {why}"
    return f"drained node {node}: {reason}"


def failure_text(e: BaseException) -> str:
    """The one line a failure is reported with (a bug names its type, as cli does)."""
    if isinstance(e, JobnsError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}"
