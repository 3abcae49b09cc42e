"""A small Slurm 22.05 cluster inside a rig: slurm.conf, munge, daemons.

    with Rig(image, hostnames=["ctl", "node1", "node2"]) as rig:
        cluster = SlurmCluster(rig, controller="ctl", computes=["node1", "node2"])
        cluster.start()
        cluster.controller.exec(["srun", "-N2", "hostname"]).check("srun")

The image carries slurm-wlm + munge (containers/images.py) and one munge key, made
when the base image was debootstrapped: every node of a rig has the same key, which
is all munge needs. Daemons run as root (SlurmUser=root), as in MACHINE.md's
single-node recipe; proctrack/linuxproc and task/none keep cgroups out of it.
jobns hooks in through `extra` (Prolog=, Epilog=, PrologFlags=, TaskProlog=...).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from containers.errors import RigError
from containers.rig import Node, Rig

CONF = "/etc/slurm/slurm.conf"


def render_conf(controller: str, computes: Sequence[str], *, cpus: int = 1,
                memory_mb: int = 500, kill_wait: int = 2, cluster: str = "rig",
                extra: Mapping[str, str] | None = None) -> str:
    """slurm.conf for one controller and `computes` (hostnames that resolve in the rig).

    CPUs and RealMemory are deliberately below what a container sees: a node that
    reports less than slurm.conf says is drained ("Low socket*core*thread count").
    """
    if not computes:
        raise RigError("render slurm.conf: no compute nodes")
    settings = {
        "ClusterName": cluster,
        "SlurmctldHost": controller,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "StateSaveLocation": "/var/spool/slurmctld",
        "SlurmdSpoolDir": "/var/spool/slurmd",
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
        "SlurmdLogFile": "/var/log/slurm/slurmd.log",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "MpiDefault": "none",
        "ReturnToService": "2",
        "KillWait": str(kill_wait),
        **(extra or {}),
    }
    lines = [f"{k}={v}" for k, v in settings.items()]
    lines += [f"NodeName={h} NodeHostname={h} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
              for h in computes]
    lines.append(f"PartitionName=rig Nodes={','.join(computes)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


class SlurmCluster:
    def __init__(self, rig: Rig, controller: str, computes: Sequence[str], *,
                 extra: Mapping[str, str] | None = None) -> None:
        self.rig = rig
        self.controller = rig.node(controller)
        self.computes = [rig.node(h) for h in computes]
        self.conf = render_conf(controller, computes, extra=extra)

    @property
    def members(self) -> list[Node]:
        return [self.controller, *self.computes]

    def start(self, timeout: float = 60) -> None:
        """Write slurm.conf everywhere, start munged, slurmctld, slurmd; wait until idle."""
        for n in self.members:
            n.put_file(CONF, self.conf)
            start_munge(n)
        self.controller.exec(["slurmctld"]).check("start slurmctld on "
                                                  f"{self.controller.hostname}")
        for n in self.computes:
            n.exec(["slurmd"]).check(f"start slurmd on {n.hostname}")
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float) -> None:
        want = {n.hostname for n in self.computes}
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            r = self.controller.exec(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
            states = r.stdout.strip()
            idle = {ln.split()[0] for ln in states.splitlines() if ln.endswith(" idle")}
            if r.exit_code == 0 and want <= idle:
                return
            time.sleep(0.5)
        logs = self.controller.exec(["tail", "-n", "20", "/var/log/slurm/slurmctld.log"]).stdout
        raise RigError(f"wait for Slurm nodes {sorted(want)} to be idle: after {timeout:g}s "
                       f"sinfo says {states!r}\nslurmctld.log:\n{logs}")


def start_munge(node: Node) -> None:
    # munged refuses a socket directory it does not own; /run is fresh in a container
    node.exec(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"]
              ).check(f"mkdir /run/munge on {node.hostname}")
    node.exec(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"]).check(
        f"start munged on {node.hostname}")
