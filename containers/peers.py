"""jobns's peers, configured in a rig: Slurm's own per-job namespace plugins, and the
baselines a prolog design is measured against.

    mode = peers.mode("ns-linux")
    cluster = peers.slurm_cluster(rig, mode, "ctl", ["node1"])
    cluster.start()

Each Mode is what one cluster runs (slurm.conf settings, files on every node, executable
scripts); `for_release(slurm)` lists those a Slurm release has:
  none            no namespace plugin, no prolog
  noop            Prolog/Epilog that are `/bin/sh` scripts exiting 0: the floor of any
                  prolog design
  contain         PrologFlags=Contain alone (what the Slurm plugins need, doing nothing)
  jc-tmpfs        JobContainerType=job_container/tmpfs + job_container.conf (22.05, 24.11;
                  22.05 knows no Dirs=: /tmp and /dev/shm only)
  ns-tmpfs        NamespaceType=namespace/tmpfs + job_container.conf (25.11+)
  ns-linux        NamespaceType=namespace/linux + namespace.yaml with dir_confs (26.05)
  jobns           jobns voluntary: Prolog/Epilog, tasks wrapped in `jobns run`
  jobns-enforced  the same + the SPANK plugin and `[slurm] enforce = true`
Every Slurm peer gets the same directories: /tmp, /var/tmp, /dev/shm and EXTRA (an extra
node-local directory; namespace/linux also mounts it noexec and sizes /tmp and /dev/shm,
which only it can). MACHINE.md's "Slurm 24.11 and 26.05 in rig containers" has the
recipes these follow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from containers.rig import Node, Rig
from containers.slurm import SlurmCluster

PEER_BASE = "/var/spool/slurmns"  # root's, 0755 (AutoBasePath); never under a private dir
EXTRA = "/scratch/local"  # an extra private directory every mode that can offers
DIRS = ("/tmp", "/var/tmp", "/dev/shm", EXTRA)
NS_LINUX_TMP_SIZE = "48m"  # namespace/linux's per-node sizes (dir_confs): fixed, not per job
NS_LINUX_SHM_SIZE = "32m"
NOOP = "#!/bin/sh\nexit 0\n"
# Linux 6.18 refuses to pin (bind-mount /proc/PID/ns/mnt) a mount namespace whose id is
# smaller than the pinning process's (mnt_ns_loop), and hands ids out in per-CPU batches,
# so a namespace made in a container on a CPU whose batch is older than the container's
# own namespace cannot be pinned (containers/README.md, "Known failure"). jobns re-makes
# such a namespace; Slurm's plugins fail the job ("_create_ns: ns mnt mount failed:
# Invalid argument") and requeue it. A node where slurmd runs in the host's first
# namespace never sees this, so before Slurm starts, every CPU of a node is moved onto a
# batch newer than the node's namespace: the same footing for every mode.
FRESH_NS_IDS = """\
import ctypes, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def ns_id():
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    try:
        return int.from_bytes(fcntl.ioctl(fd, 0x8008B705, bytes(8)), sys.byteorder)
    finally:
        os.close(fd)
mine = ns_id()
for cpu in sorted(os.sched_getaffinity(0)):
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpu})
        for made in range(9000):
            if libc.unshare(0x00020000) != 0:
                os._exit(2)
            if ns_id() > mine:
                print(cpu, made)
                os._exit(0)
        os._exit(3)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        sys.exit(f"CPU {cpu}: no mount namespace id above {mine}")
"""
CONTAIN = {"PrologFlags": "Contain"}


def version(slurm: str) -> tuple[int, ...]:
    return tuple(int(p) for p in slurm.split("."))


@dataclass(frozen=True)
class Mode:
    key: str  # pytest ids, bench labels
    title: str  # what the table says
    conf: Mapping[str, str] = field(default_factory=dict)  # slurm.conf settings
    files: Mapping[str, str] = field(default_factory=dict)  # written on every node
    scripts: Mapping[str, str] = field(default_factory=dict)  # ... root 0755
    jobns: bool = False
    enforce: bool = False
    peer: bool = False  # one of Slurm's own namespace plugins

    @property
    def wrap(self) -> str:
        """What a user puts before a step's command to get the job's namespace."""
        return "jobns run -- " if self.jobns and not self.enforce else ""


def job_container_conf(slurm: str, dirs: Sequence[str] = DIRS) -> str:
    """job_container.conf for job_container/tmpfs and namespace/tmpfs (both read it)."""
    lines = ["AutoBasePath=true", f"BasePath={PEER_BASE}"]
    if version(slurm) >= (23, 2):  # 22.05 refuses Dirs= (and then starts no job)
        lines[-1] += f" Dirs={','.join(dirs)}"
    return "\n".join(lines) + "\n"


def namespace_yaml(dir_confs: Sequence[Mapping[str, str | bool]]) -> str:
    """namespace.yaml for namespace/linux: `defaults` with the base and dir_confs."""
    lines = ["defaults:", "  auto_base_path: true", f'  base_path: "{PEER_BASE}"', "  dir_confs:"]
    for entry in dir_confs:
        first = True
        for key, value in entry.items():
            text = ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'
            lines.append(f"    {'- ' if first else '  '}{key}: {text}")
            first = False
    return "\n".join(lines) + "\n"


NS_LINUX_DIRS: tuple[Mapping[str, str | bool], ...] = (
    {"path": "/tmp", "tmpfs": True, "options": f"size={NS_LINUX_TMP_SIZE}"},
    {"path": "/var/tmp"},
    {"path": "/dev/shm", "options": f"size={NS_LINUX_SHM_SIZE}"},
    {"path": EXTRA, "options": "noexec"},
)


def inside_conf(slurm: str) -> dict[str, str]:
    """slurm.conf lines that load jobns's plugin of Slurm's own type (docs/admin.md
    "Inside Slurm"): job_container/jobns before 25.11 (with Alloc: every node's prolog
    at allocation, before an sbcast), namespace/jobns from 25.11 (Slurm forces Contain)."""
    if version(slurm) >= (25, 11):
        return {"NamespaceType": "namespace/jobns", **CONTAIN}
    return {"JobContainerType": "job_container/jobns", "PrologFlags": "Alloc"}


def for_release(slurm: str, *, contain: bool = False, inside: bool = False) -> list[Mode]:
    """The modes Slurm `slurm` (major.minor) can run, baselines first, jobns last;
    inside: also jobns enforced with its job_container/namespace plugin."""
    v = version(slurm)
    modes = [
        Mode("none", "no namespace plugin"),
        Mode(
            "noop",
            "no-op Prolog/Epilog",
            {"Prolog": "/etc/slurm/noop-prolog", "Epilog": "/etc/slurm/noop-epilog"},
            scripts={"/etc/slurm/noop-prolog": NOOP, "/etc/slurm/noop-epilog": NOOP},
        ),
    ]
    if contain:
        modes.append(Mode("contain", "PrologFlags=Contain alone", CONTAIN))
    jc_conf = {"/etc/slurm/job_container.conf": job_container_conf(slurm)}
    if v < (25, 11):
        modes.append(
            Mode(
                "jc-tmpfs",
                "job_container/tmpfs",
                {"JobContainerType": "job_container/tmpfs", **CONTAIN},
                jc_conf,
                peer=True,
            )
        )
    else:
        modes.append(
            Mode(
                "ns-tmpfs",
                "namespace/tmpfs",
                {"NamespaceType": "namespace/tmpfs", **CONTAIN},
                jc_conf,
                peer=True,
            )
        )
    if v >= (26, 5):  # dir_confs came in 26.05
        modes.append(
            Mode(
                "ns-linux",
                "namespace/linux",
                {"NamespaceType": "namespace/linux", **CONTAIN},
                {"/etc/slurm/namespace.yaml": namespace_yaml(NS_LINUX_DIRS)},
                peer=True,
            )
        )
    modes.append(Mode("jobns", "jobns voluntary", jobns=True))
    modes.append(Mode("jobns-enforced", "jobns enforced", jobns=True, enforce=True))
    if inside:
        conf = inside_conf(slurm)
        modes.append(
            Mode("jobns-inside", "jobns enf. + its plugin", conf, jobns=True, enforce=True)
        )
        if conf.get("PrologFlags") == "Alloc":
            # what Alloc costs (a synchronous prolog at allocation), apart from the plugin
            plain = {k: v for k, v in conf.items() if k != "PrologFlags"}
            modes.append(
                Mode("jobns-inside-noalloc", "... without Alloc", plain, jobns=True, enforce=True)
            )
    return modes


def slurm_cluster(
    rig: Rig,
    mode: Mode,
    controller: str,
    computes: Sequence[str],
    *,
    extra: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    cpus: int = 1,
    tmp_disk_mb: int = 0,
) -> SlurmCluster:
    """A configured (not started) cluster running `mode`; `extra` and `files` are the
    caller's own settings on top (e.g. SchedulerParameters, jobns.toml)."""
    cluster = SlurmCluster(
        rig,
        controller,
        computes,
        jobns=mode.jobns,
        enforce=mode.enforce,
        extra={**mode.conf, **(extra or {})},
        files={**mode.files, **(files or {})},
        cpus=cpus,
        tmp_disk_mb=tmp_disk_mb,
    )
    cluster.configure()
    for n in cluster.members:
        # the mount point of the extra directory (a peer fails every job without it)
        n.exec(["mkdir", "-p", EXTRA]).check(f"mkdir {EXTRA} on {n.hostname}")
        for path, text in mode.scripts.items():
            n.put_file(path, text, mode=0o755)
        fresh_mount_ns_ids(n)
    return cluster


def fresh_mount_ns_ids(node: Node) -> str:
    """Move every CPU of `node` onto mount namespace ids above the node's own (FRESH_NS_IDS);
    its output says how many namespaces each CPU had to make ("CPU MADE" lines)."""
    r = node.exec(["/usr/bin/python3", "-c", FRESH_NS_IDS], timeout=60)
    return r.check(f"fresh mount namespace ids on {node.hostname}").stdout
