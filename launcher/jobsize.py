"""Capacities from what the job asked of the scheduler (between its directives and the
site defaults, launcher.capacity.plan).

tmp: Slurm's ``--tmp`` (the job's minimum temporary disk per node). A prolog cannot
learn it for free: slurmd passes its Prolog only SLURM_JOB_ID, _UID, _GID, _USER,
_ACCOUNT, _PARTITION, _CONSTRAINTS, _COMMENT, _NAME, _CPUS_PER_NODE, _NTASKS,
_NUM_NODES, _RESERVATION, _WORK_DIR, _STD* and a few more (read from the strings of
Slurm 22.05's slurmd here, and the same in the 23-25 Prolog guide): no tmp disk, and
the job credential does not carry it either. Two ways, for the site to choose:

  tmp_from_slurm = "scontrol"   setup asks the controller (``scontrol show job -o ID``,
                                MinTmpDiskNode): one RPC per node per job, so off by
                                default; a failed call falls back to the site default.
  a job_submit.lua rule         copies the request into the comment, which the prolog
                                does get (README "Disk capacities"): no RPC at all.

shm: ``shm_memory_fraction`` (0 < f <= 1) of the job's memory limit, read from its
memory cgroup when one exists at prolog time (``memory_cgroup``, a path with %j for
the job id and %u for its uid; defaults: Slurm's cgroup v2 and v1 layouts).
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

from jobns.launcher import sysprog

if TYPE_CHECKING:
    from jobns.launcher.config import Config
    from jobns.launcher.job import Job

UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
CGROUPS = (
    "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_%j/memory.max",
    "/sys/fs/cgroup/memory/slurm/uid_%u/job_%j/memory.limit_in_bytes",
)


def requested(config: Config, job: Job) -> dict[str, int]:
    """{"tmp": bytes, "shm": bytes} as far as the site's options find them."""
    out: dict[str, int] = {}
    if config.capacity.get("tmp_from_slurm") == "scontrol":
        tmp = slurm_tmp(job.job_id, config.slurm_bin)
        if tmp:
            out["tmp"] = tmp
    fraction = config.capacity.get("shm_memory_fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and fraction > 0:
        limit = memory_limit(config, job)
        if limit is not None:
            out["shm"] = max(int(limit * min(float(fraction), 1.0)), 1)
    return out


def parse_tmp(text: str) -> int | None:
    """MinTmpDiskNode=N[KMGTP] (megabytes without a suffix, like --tmp) -> bytes."""
    for word in text.split():
        if word.startswith("MinTmpDiskNode="):
            value = word.split("=", 1)[1]
            unit = UNITS.get(value[-1:].upper())
            digits = value[:-1] if unit else value
            try:
                n = float(digits)
            except ValueError:
                return None
            return int(n * (unit or UNITS["M"])) or None
    return None


def slurm_tmp(job_id: str, bin_dir: str = "") -> int | None:
    if not job_id.isdigit() and "_" not in job_id:
        return None
    try:
        r = subprocess.run(
            sysprog.argv(["scontrol", "show", "job", "-o", job_id], bin_dir),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            stdin=subprocess.DEVNULL,
            env=sysprog.environment(keep=("SLURM_CONF",)),  # never PATH, SCONTROL_*...
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.stderr.write(f"jobns: warning: scontrol show job {job_id}: {e}; no --tmp size\n")
        return None
    if r.returncode != 0:
        sys.stderr.write(
            f"jobns: warning: scontrol show job {job_id}: "
            f"{r.stderr.strip() or r.returncode}; no --tmp size\n"
        )
        return None
    return parse_tmp(r.stdout)


def memory_limit(config: Config, job: Job) -> int | None:
    template = config.capacity.get("memory_cgroup")
    paths = (str(template),) if template else CGROUPS
    for path in paths:
        path = path.replace("%j", job.job_id).replace("%u", str(job.user.uid))
        try:
            with open(path, encoding="ascii") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 1 << 60:  # "max" / v1's huge number: none
            return int(value)
        return None
    return None
