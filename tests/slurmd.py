"""Run jobns as slurmd runs it: the Prolog and Epilog this project installs
(jobns/slurm/scripts/prolog, jobns/slurm/scripts/epilog), executed directly with only the
variables slurmd gives a prolog or epilog: no PATH, no HOME, no LANG.

Which variables: Slurm's prep/script plugin builds them (``_build_env`` in
src/plugins/prep/script/prep_script_slurmd.c) and execve()s the script with that array
as its whole environment. Below: exactly what a Prolog printed here (Debian's Slurm
22.05.8, `srun --comment=... true` by an ordinary user; the comment only when the job
has one). A job with an account, a reservation or std* paths gets those too, a SPANK
plugin's SPANK_* and a GRES's variables where a job has them; none names a program.

``as_slurmd`` runs any jobns command that way (gc and recover, which no slurmd runs,
with an empty environment: a cron job or a bare unit gives no more); other tests can
use it wherever a command's environment matters.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.conftest import JOBNS, REPO, OsUser, Sandbox

INSTALLED = "/opt/jobns/venv/bin/jobns"  # what jobns/slurm/scripts/{prolog,epilog} run
SCRIPTS = {"setup": "prolog", "teardown": "epilog"}
STATE_DIR = "STATE_DIR=/run/jobns"  # the scripts' copy of jobns.toml's state_dir


def slurmd_env(
    job: str,
    user: OsUser,
    context: str = "prolog_slurmd",
    comment: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The whole environment slurmd 22.05 gives a Prolog (context prolog_slurmd) or an
    Epilog (epilog_slurmd) of a one-node job."""
    node = os.uname().nodename.split(".")[0]
    env = {
        "SLURMD_NODENAME": node,
        "SLURM_CLUSTER_NAME": "rig",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_JOBID": job,
        "SLURM_JOB_CPUS_PER_NODE": "1",
        "SLURM_JOB_GID": str(user.gid),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_PARTITION": "debug",
        "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_JOB_UID": str(user.uid),
        "SLURM_JOB_USER": user.name,
        "SLURM_JOB_WORK_DIR": user.home,
        "SLURM_NODELIST": node,
        "SLURM_SCRIPT_CONTEXT": context,
        "SLURM_UID": str(user.uid),
    }
    if context == "epilog_slurmd":
        env.update(SLURM_JOB_DERIVED_EC="0", SLURM_JOB_EXIT_CODE="0", SLURM_JOB_EXIT_CODE2="0:0")
    if comment is not None:
        env["SLURM_JOB_COMMENT"] = comment
    env.update(extra)
    return env


def script(box: Sandbox, verb: str) -> Path:
    """The script slurmd would run for verb, in the sandbox: for setup and teardown the
    project's own Prolog/Epilog with this jobns and the sandbox's config swapped in
    (nothing else changed); for any other command a /bin/sh script that execs it."""
    path = box.root / f"slurmd-{verb}"
    if verb in SCRIPTS:
        text = (REPO / "jobns" / "slurm" / "scripts" / SCRIPTS[verb]).read_text()
        call = f"{INSTALLED} {verb} "
        assert text.count(call) >= 1, (
            f"jobns/slurm/scripts/{SCRIPTS[verb]} no longer runs `{call}...`"
        )
        text = text.replace(call, f"{JOBNS} {verb} --config {box.config} ")
        assert text.count(STATE_DIR) == 1, (
            f"jobns/slurm/scripts/{SCRIPTS[verb]} no longer sets {STATE_DIR}"
        )
        text = text.replace(STATE_DIR, f"STATE_DIR={box.state}")
    else:
        text = f'#!/bin/sh\nexec {JOBNS} {verb} --config {box.config} "$@"\n'
    path.write_text(text)
    path.chmod(0o755)
    return path


def as_slurmd(
    box: Sandbox,
    verb: str,
    job: str = "",
    user: OsUser | None = None,
    comment: str | None = None,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """jobns <verb> run as slurmd runs its Prolog (setup) or Epilog (teardown): the
    script executed directly, cwd /, stdin /dev/null, and only slurmd's variables (env:
    more of them, e.g. SLURM_JOB_NAME). gc and recover get an empty environment."""
    if verb in SCRIPTS:
        assert user is not None, "a prolog or epilog is always for a job and its user"
        context = "prolog_slurmd" if verb == "setup" else "epilog_slurmd"
        environ = slurmd_env(job, user, context, comment, **(env or {}))
    else:
        environ = dict(env or {})
    assert "PATH" not in environ
    done = subprocess.run(
        [str(script(box, verb)), *args],
        env=environ,
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if verb in SCRIPTS:
        wait_background(box, verb, job, timeout)
    return done


def background(box: Sandbox, verb: str, job: str) -> list[int]:
    """The pids of `jobns VERB --background` of job under box's config (what the
    packaged scripts leave running when they return), and of the script's own processes
    (once the script has exited: the child that will exec it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if verb in words and "--background" in words and str(box.config) in words and job in words:
            found.append(int(pid))
        elif str(box.root / f"slurmd-{verb}") in words:
            found.append(int(pid))  # the script's own child, not yet jobns (its exec is to come)
    return found


def wait_background(box: Sandbox, verb: str, job: str, timeout: float = 120) -> None:
    """Until the script's background jobns (if it left one) has ended: the epilog always
    leaves its teardown running; an enforced node's prolog its setup."""
    deadline = time.monotonic() + timeout
    quiet = 0
    # Three empty looks in a row: a process in the middle of an exec (the script's child
    # becoming jobns, jobns re-executing itself isolated) can show no command line for
    # an instant, and one empty look ended the wait while a teardown still staged out
    # (seen once on CI, test_prolog_env's stage-out under load).
    while quiet < 3:
        quiet = 0 if background(box, verb, job) else quiet + 1
        assert time.monotonic() < deadline, f"jobns {verb} --background of {job} still runs"
        time.sleep(0.01)
