"""The jobns SPANK plugin: named in plugstack.conf exactly where the config says
[slurm] enforce = true, installed, `required`, and built for the Slurm this node runs;
and the hint that enables it (the packaged plugstack.conf.d line, or the from-source one)."""

from __future__ import annotations

import fnmatch
import glob
import os
import sys

from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding, _regular_text
from jobns.launcher.commands.doctor.slurm_versions import _plugin_version, _slurmd_version
from jobns.launcher.commands.doctor.slurmconf import plugstack_of, slurm_conf_values, spank_plugins

SPANK_PLUGIN = "jobns_spank.so"


def installed_spank_plugin() -> str:
    """The SPANK plugin of this installation: the jobns-slurm package puts it in the
    multiarch slurm-wlm directory (with jobns under /usr), ci/build-spank in
    /opt/jobns/lib."""
    if not sys.executable.startswith("/usr/"):
        return f"/opt/jobns/lib/{SPANK_PLUGIN}"
    found = sorted(glob.glob(f"/usr/lib/*/slurm-wlm/{SPANK_PLUGIN}"))
    return found[0] if found else f"/usr/lib/<multiarch>/slurm-wlm/{SPANK_PLUGIN}"


PACKAGED_PLUGSTACK = "/etc/slurm/plugstack.conf.d/jobns.conf"  # shipped by jobns-slurm


def enable_plugin_hint(plugstack: str, packaged: str = PACKAGED_PLUGSTACK) -> str:
    """How to make plugstack load the plugin on this node: the package's way (uncomment
    the line jobns-slurm ships, which Debian's plugstack.conf includes) where that file
    is installed, else the from-source line."""
    so = installed_spank_plugin()
    lines = [ln.strip() for ln in (_regular_text(packaged) or "").splitlines()]
    active = any(ln.split()[:1] == ["required"] for ln in lines)
    commented = any(
        ln.startswith("#") and ln.lstrip("#").split()[:1] == ["required"] for ln in lines
    )
    if not (active or commented):
        if sys.executable.startswith("/usr/") and not os.path.isfile(so):
            return f"apt-get install jobns-slurm, then uncomment the line it ships in {packaged}"
        return f"add 'required {so}' to {plugstack}"
    steps = [] if active else [f"uncomment the 'required' line in {packaged} (package jobns-slurm)"]
    includes = []
    for raw in (_regular_text(plugstack) or "").splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "include":
            includes.append(os.path.join(os.path.dirname(plugstack), words[1]))
    if not any(fnmatch.fnmatch(packaged, pattern) for pattern in includes):
        steps.append(f"add 'include {os.path.dirname(packaged)}/*.conf' to {plugstack}")
    return " and ".join(steps)


def spank(plugstack: str, enforce: bool = False) -> list[Finding]:
    """A `required|optional /path/jobns*.so` line in plugstack.conf (or a file it
    includes): the plugin must exist, and the config must say [slurm] enforce = true
    (and only then). None is a note (the prolog pair suffices)."""
    plugins = [so for _, so in spank_plugins(plugstack)]
    if not plugins:
        if enforce:
            return [
                (
                    PROBLEM,
                    f"[slurm] enforce = true, but {plugstack} loads no jobns SPANK "
                    "plugin: jobs get root's namespaces that no task enters; fix: "
                    f"{enable_plugin_hint(plugstack)}, then restart slurmd "
                    '(docs/admin.md "Enforced by Slurm"); or unset enforce',
                )
            ]
        return [
            (
                NOTE,
                f"no jobns SPANK plugin in {plugstack} (optional: the Prolog/Epilog "
                "pair and jobns run are the whole deployment)",
            )
        ]
    out: list[Finding] = []
    if not enforce:
        out.append(
            (
                PROBLEM,
                f"{plugstack} loads the jobns SPANK plugin, but the config does "
                "not say [slurm] enforce = true: every task fails; fix: set it in "
                "jobns.toml on this node",
            )
        )
    for so in plugins:
        if os.path.isfile(so):
            out.append((OK, f"SPANK plugin {so} (named in {plugstack})"))
        else:
            out.append(
                (
                    PROBLEM,
                    f"{plugstack} names the SPANK plugin {so}, which does not "
                    "exist (slurmd will fail for 'required' lines); fix: install it, or "
                    "remove the line",
                )
            )
    return out


def spank_build(plugstack: str, enforce: bool, slurm_version: str | None = None) -> list[Finding]:
    """Each jobns SPANK plugin was built for the Slurm this node runs, and is `required`
    where jobs are enforced. Slurm loads a plugin only into the major.minor release whose
    headers built it (its `plugin_version` symbol, SLURM_VERSION_NUMBER) and refuses
    another ("Incompatible Slurm plugin version"): a `required` line then keeps slurmd
    from starting and fails every step, while an `optional` one lets every job run
    outside its namespace without a word (measured on 26.05 with a 22.05 build: tests/
    e2e/test_rig_slurm_upgrade.py). slurm_version: `slurmd -V`'s (asked when None)."""
    plugins = [(kind, so) for kind, so in spank_plugins(plugstack) if os.path.isfile(so)]
    if not plugins:
        return []  # spank() says whether that is a problem
    version = slurm_version if slurm_version is not None else _slurmd_version()
    out: list[Finding] = []
    for kind, so in plugins:
        if kind == "optional" and enforce:
            out.append(
                (
                    PROBLEM,
                    f"{plugstack} loads {so} as 'optional' while [slurm] enforce = true: if "
                    "it cannot be loaded (built for another Slurm, removed), jobs run outside "
                    "their namespaces and nothing says so; fix: make the line 'required' "
                    "(then such a node runs no job at all), restart slurmd",
                )
            )
        built = _plugin_version(so)
        rebuild = (
            f"fix: rebuild it against this node's Slurm headers (apt-get install gcc "
            f"libslurm-dev; ci/build-spank --output {so}; or the jobns-slurm package "
            "built for this Slurm: ci/build-deb), then restart slurmd"
        )
        if built is None:
            out.append(
                (
                    PROBLEM,
                    f"SPANK plugin {so} has no plugin_version symbol: not a SPANK plugin "
                    f"Slurm can load; {rebuild}",
                )
            )
        elif not version:
            out.append(
                (
                    NOTE,
                    f"SPANK plugin {so} was built for Slurm {built}; this node's Slurm is "
                    f"unknown (no slurmd -V): it loads only into Slurm {built}",
                )
            )
        elif built.split(".")[:2] != version.split(".")[:2]:
            out.append(
                (
                    PROBLEM,
                    f"SPANK plugin {so} was built for Slurm {built}, but this node runs "
                    f"Slurm {version}: Slurm refuses it (a 'required' line keeps slurmd "
                    "from starting, an 'optional' one runs jobs outside their namespaces); "
                    f"{rebuild}",
                )
            )
        else:
            out.append((OK, f"SPANK plugin {so} was built for Slurm {built} (node: {version})"))
    return out


def enforcement_problems(conf: str) -> list[str]:
    """For `jobns status` on a node whose config says [slurm] enforce = true: what keeps
    its jobs from being enforced (the plugin not named, missing, `optional`, or built
    for another Slurm), as doctor's problem texts; [] when all is well or there is no
    slurm.conf to read."""
    try:
        values = slurm_conf_values(conf)
    except OSError:
        return []
    plugstack = plugstack_of(conf, values)
    found = spank(plugstack, True) + spank_build(plugstack, True)
    return [text for kind, text in found if kind == PROBLEM]
