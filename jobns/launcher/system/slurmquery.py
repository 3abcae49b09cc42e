"""Asking Slurm's controller about one job: what its command prints, as text.

Root runs the command as every program it runs by name (launcher.system.sysprog: found in
the system's directories or [slurm] bin_dir, with a fixed environment); what the answer
means is the caller's to read (launcher.model.jobsize parses squeue's).
"""

from __future__ import annotations

import subprocess

from jobns.launcher.system import sysprog

TIMEOUT = 10  # seconds: a controller that does not answer by then is not waited for


def squeue(job_id: str, fields: str, bin_dir: str = "") -> tuple[str | None, str]:
    """What ``squeue -h --noconvert -a -t all --jobs=JOB_ID -o FIELDS`` prints: (its
    output, "") or (None, why) when it could not run or failed (why: one clean line)."""
    cmd = ["squeue", "-h", "--noconvert", "-a", "-t", "all", f"--jobs={job_id}"]
    return _run([*cmd, "-o", fields], bin_dir)


def _run(cmd: list[str], bin_dir: str) -> tuple[str | None, str]:
    try:
        r = subprocess.run(
            sysprog.argv(cmd, bin_dir),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
            # Never PATH, SQUEUE_FORMAT, SQUEUE_NAMES, SLURM_CLUSTERS...: the command line
            # alone says what squeue prints, and of which job.
            env=sysprog.environment(keep=("SLURM_CONF",)),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if r.returncode != 0:
        return None, _one_line(r.stderr) or f"exit {r.returncode}"
    return r.stdout, ""


def scontrol(args: list[str], bin_dir: str = "") -> tuple[str | None, str]:
    """What ``scontrol ARGS`` prints: (its output, "") or (None, why)."""
    return _run(["scontrol", *args], bin_dir)


def _one_line(text: str) -> str:
    """Another program's message as part of one clean line of ours."""
    return " ".join("".join(c if c.isprintable() else " " for c in text[:400]).split())
