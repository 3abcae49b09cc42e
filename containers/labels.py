"""Labels on everything the rig creates, and who owns it.

Every container, network and volume of a rig carries
  org.jobns.rig=<run id>              which rig made it (tests filter on it)
  org.jobns.rig.owner=<boot>:<pid>:<start>   the process that made it
so the sweeper can tell a leftover of a crashed run (owner gone) from the
resources of a rig another process is using right now (owner alive), and leave
the latter alone: two test sessions on one dockerd must not destroy each other.
A pid alone is not an identity (pids are reused); pid + its start time in clock
ticks since boot is, within one boot, and the boot id covers a reboot.
"""

from __future__ import annotations

import os
import secrets

RIG = "org.jobns.rig"
OWNER = "org.jobns.rig.owner"
ROLE = "org.jobns.rig.role"  # "node", "network", "shared-volume", "probe"
IMAGE = "org.jobns.rig.image"  # on images: "base" or "node"
RELEASE = "org.jobns.rig.release"  # on images: the Debian suite (containers.images.RELEASES)
INPUTS = "org.jobns.rig.inputs"  # on images: the content hash in the tag


def new_run_id() -> str:
    # short enough for container names, random enough that runs never collide
    return secrets.token_hex(4)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown-boot"


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time); None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    return stat.rsplit(")", 1)[1].split()[19]


def owner_of(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{boot_id()}:{pid}:{_start_time(pid) or 'gone'}"


def owner_alive(owner: str | None) -> bool:
    """Is the process named by an owner label still running (on this boot)?"""
    if not owner:
        return False
    try:
        boot, pid_s, start = owner.split(":")
        pid = int(pid_s)
    except ValueError:
        return False  # not written by us: treat as a leftover
    return boot == boot_id() and _start_time(pid) == start


def for_run(run_id: str, role: str) -> dict[str, str]:
    return {RIG: run_id, OWNER: owner_of(), ROLE: role}
