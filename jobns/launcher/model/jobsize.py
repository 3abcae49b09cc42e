"""Capacities from what the job asked of the scheduler (between its directives and the
site defaults, launcher.model.capacity.plan).

tmp: Slurm's ``--tmp`` (the job's minimum temporary disk per node). A prolog cannot
learn it for free: slurmd passes its Prolog only SLURM_JOB_ID, _UID, _GID, _USER,
_ACCOUNT, _PARTITION, _CONSTRAINTS, _COMMENT, _NAME, _CPUS_PER_NODE, _NTASKS,
_NUM_NODES, _RESERVATION, _WORK_DIR, _STD* and a few more (read from the strings of
Slurm 22.05's slurmd here, and the same in the 23-25 Prolog guide): no tmp disk, and
the job credential does not carry it either. Two ways, for the site to choose:

  tmp_from_slurm = "scontrol"   setup asks the controller for the job's MIN_TMP_DISK
                                (``squeue``, see :func:`slurm_tmp`): one RPC per node per
                                job, so off by default; a failed call or an answer it
                                cannot read falls back to the site default, with a warning.
  a job_submit.lua rule         copies the request into the comment, which the prolog
                                does get (docs/admin.md "Disk capacities"): no RPC at all.

shm: ``shm_memory_fraction`` (0 < f <= 1) of the job's memory limit, read from its
memory cgroup when one exists at prolog time (``memory_cgroup``, a path with %j for
the job id and %u for its uid; defaults: Slurm's cgroup v2 and v1 layouts).
"""

from __future__ import annotations

import re
import sys

from jobns.launcher.model.config import Config
from jobns.launcher.model.job import Job
from jobns.launcher.system import slurmquery

UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
CGROUPS = (
    "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_%j/memory.max",
    "/sys/fs/cgroup/memory/slurm/uid_%u/job_%j/memory.limit_in_bytes",
)
# Slurm keeps --tmp as a uint32 of MiB; NO_VAL (0xfffffffe) and INFINITE are no request.
MAX_TMP_MIB = 0xFFFFFFFD
MAX_TMP = MAX_TMP_MIB * UNITS["M"]
# What `squeue --noconvert -o "%A %i %d"` prints per job: the job id, its id as the user
# names it (12_3 for an array task), its MIN_TMP_DISK (MiB with an M, "0" for none;
# without --noconvert a release may print 1.50G). Not one of them is text a user chose.
SQUEUE_FORMAT = "%A %i %d"
_ROW = re.compile(r"([0-9]{1,10}) (\S+) (\S{1,40})", re.ASCII)
_SIZE = re.compile(r"([0-9]{1,12})(?:\.([0-9]{1,2}))?([KMGTP]?)", re.ASCII)
_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?", re.ASCII)
MAX_ANSWER = 1 << 16  # an array job's rows fit; anything longer is not squeue's answer


def requested(
    config: Config, job: Job, handed_over: bool = False, tmp_mib: int | None = None
) -> dict[str, int]:
    """{"tmp": bytes, "shm": bytes} as far as the site's options find them. handed_over:
    the burst buffer recorded the job's --tmp (tmp_mib, None for none: launcher.burstbuffer),
    so nobody is asked."""
    out: dict[str, int] = {}
    if handed_over:
        if tmp_mib is not None and config.capacity.get("tmp_from_slurm") == "scontrol":
            out["tmp"] = tmp_mib * UNITS["M"]
    elif config.capacity.get("tmp_from_slurm") == "scontrol":
        tmp = slurm_tmp(job.job_id, config.slurm_bin)
        if tmp:
            out["tmp"] = tmp
    fraction = config.capacity.get("shm_memory_fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and fraction > 0:
        limit = memory_limit(config, job)
        if limit is not None:
            out["shm"] = max(int(limit * min(float(fraction), 1.0)), 1)
    return out


def tmp_bytes(value: str) -> tuple[int | None, str]:
    """Slurm's MIN_TMP_DISK as it prints it (N[.NN][KMGTP], MiB without a unit, like
    --tmp) -> (bytes, "") or (None, "") for no request, or (None, why) for a value that is
    no size Slurm can hold (never an exception: no float, no inf, no nan)."""
    m = _SIZE.fullmatch(value)
    if m is None:
        return None, f"MIN_TMP_DISK {value[:40]!r} is not a size"
    whole, frac, unit = m.groups()
    scale = UNITS[unit or "M"]
    size = int(whole) * scale + int((frac or "0").ljust(2, "0")) * scale // 100
    if size > MAX_TMP:
        return None, f"MIN_TMP_DISK {value!r} is more than Slurm can hold"
    return (size or None), ""


def parse_squeue(text: str, job_id: str) -> tuple[int | None, str]:
    """The --tmp of job_id from ``squeue -h --noconvert -o "%A %i %d"``: (bytes, "") or
    (None, "") when it asked for none, or (None, why) when the answer is not what squeue
    prints (the caller warns and uses the site default).

    Why squeue and not ``scontrol show job -o``: scontrol prints JobName= (and Comment=,
    WorkDir=, StdOut=...), text the user chose, as words of the same line as
    MinTmpDiskNode=, so ``sbatch -J 'x MinTmpDiskNode=900G'`` forged her size. These
    three fields are numbers and ids only, on Slurm 22.05 to 26.05 (src/squeue/print.c);
    ``scontrol --json`` came only in 23.02 and squeue 22.05's --json ignores --jobs.
    An array job's rows (or a heterogeneous job's) are told apart by the first two."""
    if len(text) > MAX_ANSWER:
        return None, f"squeue answered {len(text)} characters, more than one job's"
    found: set[str] = set()
    for line in text.splitlines():
        row = _ROW.fullmatch(line.strip())
        if row is None:
            return None, f"squeue printed {line[:80]!r}, not JOBID ID MIN_TMP_DISK"
        if job_id in (row[1], row[2]):
            found.add(row[3])
    if not found:
        return None, "squeue does not list the job"
    if len(found) > 1:
        return None, f"squeue lists the job with {len(found)} different MIN_TMP_DISK"
    return tmp_bytes(found.pop())


def slurm_tmp(job_id: str, bin_dir: str = "") -> int | None:
    """The job's --tmp in bytes (None: none asked, or not learnt: then a warning)."""
    if _JOB_ID.fullmatch(job_id) is None:
        return None  # not a Slurm job id (a standalone job): nothing to ask
    text, problem = slurmquery.squeue(job_id, SQUEUE_FORMAT, bin_dir)
    size, problem = parse_squeue(text, job_id) if text is not None else (None, problem)
    if problem:
        sys.stderr.write(f"jobns: warning: squeue --jobs={job_id}: {problem}; no --tmp size\n")
        return None
    return size


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
