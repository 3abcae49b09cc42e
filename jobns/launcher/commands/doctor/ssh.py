"""ssh logins with [slurm] enforce = true: sshd's PAM stack, where pam_jobns must follow
pam_slurm_adopt to put an adopted session in the job's namespace."""

from __future__ import annotations

import glob
import os

from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding

DEFAULT_SSHD_PAM = "/etc/pam.d/sshd"


PAM_MODULE = "pam_jobns.so"


def pam_stack(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """(type, module file name) of each line of a PAM service file, in order, with
    `@include`d files (relative to its directory) spliced in; a leading `-` (use the
    module if it exists) dropped."""
    out: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for raw in lines:
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "@include":
            inc = words[1] if words[1].startswith("/") else f"{os.path.dirname(path)}/{words[1]}"
            if depth < 8:  # includes nest rarely; never loop
                try:
                    out += pam_stack(inc, depth + 1)
                except OSError:
                    pass
            continue
        module = 2
        if len(words) > 1 and words[1].startswith("["):  # [value=action ...] spans words
            module = next((i + 1 for i, w in enumerate(words) if w.endswith("]")), len(words))
        if len(words) > module:
            out.append((words[0].lstrip("-"), os.path.basename(words[module])))
    return out


def sshd_pam(path: str, slurm_values: dict[str, str]) -> list[Finding]:
    """With [slurm] enforce = true: an ssh session that pam_slurm_adopt adopts into a job
    reaches the job's namespace only through pam_jobns, stacked after pam_slurm_adopt in
    sshd's account stack (which sets SLURM_JOB_ID there) and in its session stack (where
    it joins); pam_slurm_adopt adopts only into jobs with an extern step (Contain)."""
    try:
        stack = pam_stack(path)
    except FileNotFoundError:
        return [(NOTE, f"no {path}: ssh logins to this node not checked")]
    except OSError as e:
        return [(PROBLEM, f"read {path}: {e.strerror}")]
    account = [m for t, m in stack if t == "account"]
    session = [m for t, m in stack if t == "session"]
    adopt = "pam_slurm_adopt.so"
    if adopt not in account:
        return [
            (
                NOTE,
                f"{path} has no pam_slurm_adopt: ssh logins to this node run outside "
                'every job\'s namespace (docs/admin.md "Enforced by Slurm", ssh)',
            )
        ]
    fix = (
        f"fix: 'account required {PAM_MODULE}' right after pam_slurm_adopt and 'session "
        f"required {PAM_MODULE}' in {path} (man pam_jobns)"
    )
    out: list[Finding] = []
    if PAM_MODULE not in account[account.index(adopt) :] or PAM_MODULE not in session:
        out.append(
            (
                PROBLEM,
                f"{path}: pam_slurm_adopt adopts ssh sessions into jobs, but pam_jobns "
                "does not follow it in the account stack and join in the session stack: "
                f"adopted sessions run in the node's own /tmp and /dev/shm; {fix}",
            )
        )
    else:
        out.append((OK, f"{path}: pam_jobns follows pam_slurm_adopt (account, session)"))
    if (
        not any(glob.glob(f"{d}/{PAM_MODULE}") for d in ("/usr/lib/*/security", "/lib/*/security"))
        and PAM_MODULE in account + session
    ):
        out.append(
            (
                PROBLEM,
                f"{path} names {PAM_MODULE}, which is not installed (every ssh login "
                "fails); fix: apt-get install jobns-slurm",
            )
        )
    flags = slurm_values.get("prologflags", "").lower().split(",")
    if "contain" not in flags:
        out.append(
            (
                PROBLEM,
                "pam_slurm_adopt adopts only into a job with an extern step, and "
                "slurm.conf has no PrologFlags=Contain: every ssh login of a job's user is "
                "refused; fix: PrologFlags=Contain in slurm.conf",
            )
        )
    return out
