"""`jobns doctor`: is this node ready for jobns, and what is there to fix?

One line per check on stdout: `ok: ...`, `note: ...` (worth knowing, not a problem) or
`problem: ...; fix: ...`. Exit 0 when there is no problem, 125 otherwise. It changes
nothing, except a file it makes and removes at once to try POSIX ACLs where the state
directory lives.

This module is the runner: check() asks every subject in the report's order, main()
prints the report and its verdict. The checks live in one module per subject: `host` (the
kernel, a container, mount propagation), `node` (state_dir, the bases, [[dirs]]),
`capacity` (disk images, loop devices, scratch_base), `executables` (the programs root
runs), `scripts` (slurm.conf's Prolog= and Epilog=), `spank_plugin`, `namespace_plugins`
(Slurm's and jobns's namespace plugins), `ssh` (sshd's PAM stack), `burst_buffer`
(Slurm's burst_buffer/lua running jobns's) and `containers` (CDI);
below them `slurmconf` (reading slurm.conf and plugstack.conf), `slurm_versions` and
`common` (the kinds of finding and the helpers several subjects share). A module imports
only modules below it, never one that imports it back.
"""

from __future__ import annotations

import os

from jobns.launcher.commands.doctor.burst_buffer import burst_buffer_findings
from jobns.launcher.commands.doctor.capacity import disk_users, loop_devices, scratch_base
from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding, _inside_any, _shown
from jobns.launcher.commands.doctor.containers import DEFAULT_CDI_DIR, cdi
from jobns.launcher.commands.doctor.executables import (
    disk_programs,
    pid_namespace,
    programs,
    slurm_commands,
)
from jobns.launcher.commands.doctor.host import in_container, kernel, propagation
from jobns.launcher.commands.doctor.namespace_plugins import slurm_namespace_plugins
from jobns.launcher.commands.doctor.node import base, extra_dir, reachable, state_dir
from jobns.launcher.commands.doctor.scripts import (
    prolog_waits,
    scripts_by_name,
    slurm,
    state_dir_names,
)
from jobns.launcher.commands.doctor.slurmconf import (
    _slurm_values_or_none,
    plugstack_of,
    spank_plugins,
)
from jobns.launcher.commands.doctor.spank_plugin import enforcement_problems
from jobns.launcher.commands.doctor.ssh import DEFAULT_SSHD_PAM, sshd_pam
from jobns.launcher.lifecycle.lifecycle import require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import Options
from jobns.launcher.mountns.cdi import settings
from jobns.launcher.protocol.state import TASKS_WAIT
from jobns.launcher.system.errors import EXIT_JOBNS_FAILED, JobnsError

__all__ = [
    "DEFAULT_SLURM_CONF",
    "NOTE",
    "OK",
    "PROBLEM",
    "Finding",
    "Pending",
    "check",
    "config_problem",
    "enforcement_problems",
    "main",
    "not_checked_yet",
    "slurm_conf_path",
    "verdict",
]

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def check(
    config: config_mod.Config,
    slurm_conf: str,
    cdi_dir: str,
    cdi_configured: bool = False,
    sshd_pam_file: str = DEFAULT_SSHD_PAM,
    *,
    use_slurm: bool = True,
    container: str | None = None,
) -> list[Finding]:
    """Every check; use_slurm False (--no-slurm): a node that runs jobns without Slurm.
    container: in_container()'s answer (asked when None)."""
    found: list[Finding] = []
    found += kernel()
    found += loop_devices(
        users=disk_users(config), container=in_container() if container is None else container
    )
    found += state_dir(config.state_dir)
    # A base inside none of the job's mount points is covered in its namespace.
    points = ["/tmp", "/var/tmp", "/dev/shm", *(d.path for d in config.dirs)]
    for role in ("local_base", "shm_base", "shared_base"):
        where = str(getattr(config, role))
        found += base(role, where)
        found += reachable(role, where, config.enforce, not _inside_any(where, points))
    for d in config.dirs:
        found += extra_dir(d)
        covered = not _inside_any(d.base, points)
        found += reachable(f"[[dirs]] base of {d.path}:", d.base, config.enforce, covered)
    found += scratch_base(config)
    found += disk_programs(config)
    found += programs(config)
    found += pid_namespace(config)
    found += propagation()
    if use_slurm:
        found += _slurm_checks(config, slurm_conf, sshd_pam_file)
    else:
        found.append((NOTE, "--no-slurm: Slurm's configuration not checked"))
    found += cdi(cdi_dir, cdi_configured)
    return found


def _slurm_checks(config: config_mod.Config, slurm_conf: str, sshd_pam_file: str) -> list[Finding]:
    found = slurm(slurm_conf, config.enforce)
    found += scripts_by_name(slurm_conf)
    found += state_dir_names(config, slurm_conf)
    found += slurm_commands(config, slurm_conf)
    values = _slurm_values_or_none(slurm_conf)
    if values is None:
        return found
    found += burst_buffer_findings(config, values, os.path.dirname(slurm_conf))
    loaded = bool(spank_plugins(plugstack_of(slurm_conf, values)))
    found += prolog_waits(config.state_dir, loaded)
    if config.enforce:
        found += slurm_namespace_plugins(values, conf_dir=os.path.dirname(slurm_conf))
        found += sshd_pam(sshd_pam_file, values)
    return found


Pending = tuple[str, str]  # (what doctor cannot check yet, after what to run it again)


def not_checked_yet(
    config: config_mod.Config, slurm_conf: str, use_slurm: bool = True
) -> list[Pending]:
    """The parts of the deployment doctor cannot judge yet: they make the node not ready
    (exit 125) although no check failed, and the last line says when to run it again.
    No slurm.conf: nothing of Slurm's side was checked (a fresh node: the docs'
    steps configure Slurm after installing jobns). An enforced node whose slurmd has not
    loaded the plugin (no <state_dir>/tasks-wait, which the plugin makes in slurmd):
    the running slurmd predates the plugstack.conf line, or does not run."""
    if not use_slurm:
        return []
    if not os.path.exists(slurm_conf):
        return [(f"Slurm is not configured yet (no {slurm_conf})", "configuring Slurm")]
    values = _slurm_values_or_none(slurm_conf)
    if values is None or not config.enforce:
        return []  # unreadable: a problem already
    if spank_plugins(plugstack_of(slurm_conf, values)) and not os.path.exists(
        f"{config.state_dir}/{TASKS_WAIT}"
    ):
        return [
            (
                "slurmd has not loaded the jobns SPANK plugin since it started (no "
                f"{config.state_dir}/{TASKS_WAIT})",
                "(re)starting slurmd",
            )
        ]
    return []


def verdict(found: list[Finding], pending: list[Pending]) -> tuple[str, int]:
    """doctor's last line and exit status: 0 only with no problem and nothing pending."""
    problems = sum(1 for kind, _ in found if kind == PROBLEM)
    what = "; ".join(w for w, _ in pending)
    after = [a for _, a in pending]
    if problems:
        line = f"jobns doctor: {problems} problem(s) to fix before this node runs jobs"
        if pending:
            line += f"; not checked yet: {what}"
        return f"{line}; run jobns doctor again after {' and '.join(['fixing them', *after])}", (
            EXIT_JOBNS_FAILED
        )
    if pending:
        return (
            f"jobns doctor: not ready yet: {what}; run jobns doctor again after "
            f"{' and '.join(after)}",
            EXIT_JOBNS_FAILED,
        )
    return "jobns doctor: this node is ready", 0


def config_problem(error: JobnsError, where: str) -> str:
    """The problem line for a jobns.toml that does not load (every check needs it)."""
    return (
        f"{error}; fix: correct {where} (every key: docs/config.md and man jobns; the "
        "packaged /etc/jobns/jobns.toml lists each one, commented out), or remove it to "
        "use the built-in defaults"
    )


def slurm_conf_path(given: object = None) -> str:
    """--slurm-conf, else $SLURM_CONF, else /etc/slurm/slurm.conf."""
    return str(given or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def main(opts: Options, _command: list[str]) -> int:
    require_root("doctor")
    slurm_conf = slurm_conf_path(opts.get("slurm_conf"))
    use_slurm = not opts.get("no_slurm")
    given = str(opts["config"]) if opts.get("config") else None
    try:
        config = config_mod.load(given)
    except JobnsError as e:
        where = config_mod.config_path(given, dict(os.environ))[0] or config_mod.DEFAULT_PATH
        print(f"{PROBLEM}: {config_problem(e, _shown(where))}")
        print(
            "jobns doctor: 1 problem(s) to fix before this node runs jobs; nothing else "
            "was checked (every check needs the config): run jobns doctor again after fixing it"
        )
        return EXIT_JOBNS_FAILED
    cdi_conf = settings(config)
    cdi_dir = str(opts.get("cdi_dir") or (cdi_conf.dir if cdi_conf else DEFAULT_CDI_DIR))
    found = check(config, slurm_conf, cdi_dir, cdi_conf is not None, use_slurm=use_slurm)
    for kind, text in found:
        print(f"{kind}: {text}")
    line, code = verdict(found, not_checked_yet(config, slurm_conf, use_slurm))
    print(line)
    return code
