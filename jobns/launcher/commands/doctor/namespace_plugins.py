"""With [slurm] enforce = true: Slurm's own namespace plugins (none besides jobns's),
jobns's job_container/namespace plugin (installed, built for exactly this Slurm,
PrologFlags), SlurmdSpoolDir, and what the release needs around it (mpi.conf's
PMIxCliTmpDirBase, X11Parameters)."""

from __future__ import annotations

import os
import platform

from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding, _inside_any
from jobns.launcher.commands.doctor.slurm_versions import _plugin_version, _slurmd_version

JOBNS_CONTAINER = ("job_container/jobns", "namespace/jobns")

PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # what every job's namespace covers


def slurm_namespace_plugins(
    slurm_values: dict[str, str], slurm_version: str | None = None, conf_dir: str = "/etc/slurm"
) -> list[Finding]:
    """With [slurm] enforce = true: no Slurm namespace plugin besides jobns's own
    (job_container/tmpfs, namespace/tmpfs, namespace/linux would put every task in a
    namespace of their own too, and a task can be in only one); jobns's own
    (job_container/jobns, namespace/jobns: docs/admin.md "Inside Slurm: the job_container
    and namespace plugin") built for exactly this Slurm, with what its release needs
    around it; and SlurmdSpoolDir outside the job's private directories.
    slurm_version: `slurmd -V`'s (asked when None)."""
    out: list[Finding] = []
    ours = ""
    for key, shown, none in (
        ("jobcontainertype", "JobContainerType", "job_container/none"),
        ("namespacetype", "NamespaceType", "namespace/none"),
    ):
        value = slurm_values.get(key, "")
        if value.lower() in JOBNS_CONTAINER:
            ours = value.lower()
        elif value and value.lower() != none:
            out.append(
                (
                    PROBLEM,
                    f"{shown}={value} is configured while jobns enforces every job's "
                    "namespace ([slurm] enforce = true): each task would be put in two "
                    f"namespaces and ends up in whichever came last; fix: {shown}="
                    f"{'namespace' if key == 'namespacetype' else 'job_container'}/jobns "
                    "(jobns's own plugin of that type) instead, or remove the line",
                )
            )
    spool = slurm_values.get("slurmdspooldir", "/var/spool/slurmd")
    if _inside_any(spool, list(PRIVATE)):
        out.append(
            (
                PROBLEM,
                f"SlurmdSpoolDir={spool} lies in a directory every job gets its own of: "
                "what Slurm does for a job inside its namespace (sbcast, the step's daemon) "
                "would not find it; fix: SlurmdSpoolDir=/var/spool/slurmd",
            )
        )
    if not ours:
        missing = (
            "no JobContainerType=/NamespaceType= of jobns's: what Slurm itself does for a "
            "job (sbcast to /tmp, srun -o /tmp/..., mpi/pmix's directory, TaskEpilog) "
            "happens in the node's namespace, not the job's; fix: JobContainerType="
            "job_container/jobns (22.05, 24.11), or NamespaceType=namespace/jobns and "
            "PrologFlags=Contain (25.11 and later)"
        )
        return [*out, (NOTE, missing)]
    return out + _jobns_container(ours, slurm_values, slurm_version, conf_dir)


def _jobns_container(
    ours: str, values: dict[str, str], slurm_version: str | None, conf_dir: str
) -> list[Finding]:
    """jobns's job_container/namespace plugin, configured: installed, built for exactly
    this Slurm, and what its release needs besides."""
    multiarch = f"{platform.machine()}-linux-gnu"
    dirs = (values.get("plugindir") or f"/usr/lib/{multiarch}/slurm-wlm").split(":")
    name = ours.replace("/", "_") + ".so"
    found = [f"{d}/{name}" for d in dirs if os.path.isfile(f"{d}/{name}")]
    fix = (
        "fix: install jobns-slurm built for this node's Slurm (ci/build-deb on a machine "
        "of this release), then restart slurmd"
    )
    if not found:
        return [
            (
                PROBLEM,
                f"{ours} is configured but {name} is in no PluginDir ({':'.join(dirs)}): "
                f"slurmd does not start; {fix}",
            )
        ]
    so = found[0]
    version = slurm_version if slurm_version is not None else _slurmd_version()
    built = _plugin_version(so)
    out: list[Finding] = []
    if built is None or (version and built != version):
        out.append(
            (
                PROBLEM,
                f"{so} was built for Slurm {built or 'nothing Slurm knows'}, but this node "
                f"runs Slurm {version}: a plugin of this type loads only into the exact "
                f"release it was built for, so slurmd does not start; {fix}",
            )
        )
    flags = values.get("prologflags", "").lower().split(",")
    if ours == "namespace/jobns" and "contain" not in flags:
        out.append(
            (
                PROBLEM,
                "NamespaceType=namespace/jobns needs PrologFlags=Contain (Slurm 25.11 and "
                "later run no namespace plugin without it: slurmd does not start); fix: "
                "add Contain to PrologFlags=",
            )
        )
    if not {"alloc", "contain"} & set(flags):
        out.append(
            (
                NOTE,
                f"{ours} without PrologFlags=Alloc: a node's prolog runs at its first step, "
                "so an sbcast to it before then fails (no namespace to land in); fix: "
                "PrologFlags=Alloc (Contain includes it)",
            )
        )
    release = _release_of(version)
    # From 24.11 slurmd asks the plugin to join the child that execs each step's daemon;
    # 22.05 has no such hook (docs/admin.md "Inside Slurm: the job_container and
    # namespace plugin"), so its slurmstepd makes PMIx's client directory in the node's.
    base = _mpi_conf_value(f"{conf_dir}/mpi.conf", "pmixclitmpdirbase")
    if (release is None or release < (24, 11)) and (
        base is None or _inside_any(base, list(PRIVATE)) or base in PRIVATE
    ):
        out.append(
            (
                NOTE,
                f"Slurm {version or '(version unknown)'} cannot put a step's daemon in the "
                "job's namespace: mpi/pmix makes its client directory (spmix_appdir_*) in "
                f"{base or 'TmpFS (/tmp)'} of the node, where the job's tasks cannot see "
                f"it; fix: PMIxCliTmpDirBase=/var/spool/slurmd/pmix in {conf_dir}/mpi.conf "
                "(a directory of root's outside /tmp, /var/tmp and /dev/shm)",
            )
        )
    if (
        (release is None or release < (25, 11))
        and "x11" in flags
        and "home_xauthority" not in values.get("x11parameters", "")
    ):
        out.append(
            (
                NOTE,
                "X11 forwarding: the xauth file is written outside the job's namespace "
                "(before 25.11 Slurm joins there only for a plugin named tmpfs); fix: "
                "X11Parameters=home_xauthority",
            )
        )
    return out or [(OK, f"{ours} ({so}) built for Slurm {built} (node: {version or '?'})")]


def _release_of(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a Slurm version such as 24.11.5, or None."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def _mpi_conf_value(path: str, key: str) -> str | None:
    """A Key=Value of mpi.conf (keys compared lower-cased), or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    value = None
    for raw in text.splitlines():
        k, eq, v = raw.split("#", 1)[0].strip().partition("=")
        if eq and k.strip().lower() == key:
            value = v.strip()
    return value
