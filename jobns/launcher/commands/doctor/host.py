"""The host under jobns: the kernel's user namespaces, whether this node is a container,
and the propagation of its / (host mounts made later reach running jobs)."""

from __future__ import annotations

import os

from jobns.launcher.commands.doctor.common import OK, PROBLEM, Finding
from jobns.launcher.system.mountinfo import propagation_warning


def kernel(proc_sys: str = "/proc/sys") -> list[Finding]:
    """Unprivileged user namespaces: every Slurm task joins (or makes) one."""
    out: list[Finding] = []
    value = _read_int(f"{proc_sys}/user/max_user_namespaces")
    if value is None:
        out.append(
            (
                PROBLEM,
                "the kernel has no user namespaces (no "
                "/proc/sys/user/max_user_namespaces); fix: a kernel with "
                "CONFIG_USER_NS=y",
            )
        )
    elif value <= 0:
        out.append(
            (
                PROBLEM,
                f"user.max_user_namespaces = {value}: no task can make or join "
                "a user namespace; fix: sysctl -w user.max_user_namespaces=15000 (and "
                "the same in /etc/sysctl.d/)",
            )
        )
    else:
        out.append((OK, f"user.max_user_namespaces = {value}"))
    for name, bad, why in (
        ("kernel/unprivileged_userns_clone", 0, "Debian's switch"),
        ("kernel/apparmor_restrict_unprivileged_userns", 1, "Ubuntu's AppArmor switch"),
    ):
        value = _read_int(f"{proc_sys}/{name}")
        key = name.replace("/", ".")
        if value is None:
            continue
        if value == bad:
            want = 1 - bad
            out.append(
                (
                    PROBLEM,
                    f"{key} = {value} ({why}): ordinary users cannot make user "
                    f"namespaces; fix: sysctl -w {key}={want} (and the same in "
                    "/etc/sysctl.d/)",
                )
            )
        else:
            out.append((OK, f"{key} = {value}"))
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def in_container(root: str = "/") -> str:
    """Why this node looks like a container ("" if it does not): docker's /.dockerenv,
    podman's /run/.containerenv, or a container manager in /proc/1/cgroup (cgroup v1).
    A module cannot be loaded from inside one: the host must, and give it the device."""
    for marker in (".dockerenv", "run/.containerenv"):
        if os.path.exists(os.path.join(root, marker)):
            return f"/{marker} exists"
    try:
        with open(os.path.join(root, "proc/1/cgroup")) as f:
            cgroup = f.read(65536)
    except OSError:
        return ""
    for hint in ("docker", "containerd", "kubepods", "libpod", "lxc"):
        if hint in cgroup:
            return f"/proc/1/cgroup names {hint}"
    return ""


def propagation() -> list[Finding]:
    warning = propagation_warning()
    if warning:
        return [(PROBLEM, warning.replace("; make it shared", "; fix: make it shared", 1))]
    return [(OK, "/ is a shared mount: host mounts made later reach running jobs")]
