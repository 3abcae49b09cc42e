"""Tasks of a job the site enforces through Slurm (docs/admin.md "Enforced by Slurm").

The jobns SPANK plugin (jobns/slurm/spank/jobns_spank.c) joins each task to its job's namespace
as root, before slurmstepd drops privileges, and exports JOBNS_JOINED="<job id>:<st_dev>:
<st_ino>" (the namespace it joined). Inside, the state directory is hidden, so a task
learns that it is already in its job's namespace from this variable, checked against its
own /proc/self/ns/mnt. A forged or stale value only makes jobns wrap the task as usual.
"""

from __future__ import annotations

import os

JOINED_VAR = "JOBNS_JOINED"


def inside_job(environ: dict[str, str], job_id: str) -> bool:
    """This process is in the namespace the plugin joined for job_id."""
    jid, _, ident = environ.get(JOINED_VAR, "").partition(":")
    if jid != job_id or not ident:
        return False
    try:
        st = os.stat("/proc/self/ns/mnt")
    except OSError:
        return False
    return ident == f"{st.st_dev}:{st.st_ino}"
