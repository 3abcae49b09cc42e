"""The programs root finds and runs that jobns does not ship: mkfs for a disk backing,
the PID namespace's init, the site's [lifecycle] pre_run/post_run and [arc] movetool,
and Slurm's squeue."""

from __future__ import annotations

import os
import shlex

from jobns.launcher.backing import diskimage
from jobns.launcher.commands.doctor.capacity import disk_users
from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding
from jobns.launcher.model import config as config_mod
from jobns.launcher.system import sysprog


def disk_programs(config: config_mod.Config) -> list[Finding]:
    """mkfs.<fs_type> where a disk backing is configured: without it every job with a
    disk capacity fails its prolog (the node drains)."""
    users = disk_users(config)
    if not users:
        return []
    name = f"mkfs.{diskimage.fs_type(config)}"
    try:
        return [(OK, f"{name} is {sysprog.find(name)} (for {', '.join(users)})")]
    except sysprog.NotFound as e:
        return [(PROBLEM, f"{name} (for {', '.join(users)}): {e.strerror}")]


def pid_namespace(config: config_mod.Config) -> list[Finding]:
    """[namespace] pid: honoured only with [slurm] enforce (launcher.mountns.pins), and its init is
    /usr/bin/sleep, found as root finds every program (a prolog fails without it)."""
    if not config.pid_ns:
        return []
    if not config.enforce:
        return [(PROBLEM, config_mod.PID_NS_IGNORED)]
    try:
        sleep = sysprog.find("sleep")
    except sysprog.NotFound as e:
        return [(PROBLEM, f"[namespace] pid: the job's init: {e}; fix: install coreutils")]
    return [(OK, f"[namespace] pid: each job gets a PID namespace (its init: {sleep})")]


def programs(config: config_mod.Config) -> list[Finding]:
    """The site's programs: [lifecycle] pre_run/post_run (root runs them: only root may
    replace them; one that cannot run fails every prolog, and the node drains) and
    [arc] movetool (the job user runs it; staging fails without it)."""
    named = [
        ("[lifecycle] pre_run", config.lifecycle.pre_run, True),
        ("[lifecycle] post_run", config.lifecycle.post_run, True),
        ("[arc] movetool", config.arc.movetool if config.arc else "", False),
    ]
    out: list[Finding] = []
    for key, command, as_root in named:
        if not command:
            continue
        try:
            path = sysprog.find(shlex.split(command)[0])
        except (ValueError, IndexError):
            continue  # config.load refused it already
        except sysprog.NotFound as e:
            out.append((PROBLEM, f"{key} = {command!r}: {e}; fix: install it, or change {key}"))
            continue
        why = sysprog.untrusted(path)
        if why and (as_root or why in ("missing", "not an executable file")):
            why = f"{path}: {'no such file' if why == 'missing' else why}"
            out.append((PROBLEM, f"{key} = {command!r}: {why}; fix: a program of root's"))
        else:
            out.append((OK, f"{key}: {path}"))
    return out


def slurm_commands(config: config_mod.Config, conf: str) -> list[Finding]:
    """Slurm's commands jobns runs, where root finds them (launcher.system.sysprog, then
    [slurm] bin_dir first): squeue for tmp_from_slurm (without it every job gets the
    site default) and for gc on a Slurm node (without it gc judges by records)."""
    wanted = []
    if config.capacity.get("tmp_from_slurm") == "scontrol":
        wanted.append(("squeue", '[capacity] tmp_from_slurm = "scontrol"', PROBLEM))
    elif os.path.exists(conf):
        wanted.append(("squeue", "jobns gc", NOTE))
    out: list[Finding] = []
    for name, user, kind in wanted:
        try:
            out.append((OK, f"{name} is {sysprog.find(name, config.slurm_bin)} (for {user})"))
        except sysprog.NotFound as e:
            out.append((kind, f"{user} needs {e}"))
    return out
