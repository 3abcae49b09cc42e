"""What a node container is allowed to do: the capability sets the rig can use.

`--privileged` fails on these VMs ("unable to apply caps": the VM's bounding set
lacks CAP_SYS_RESOURCE), and would be far more than jobns needs anyway. MINIMUM
is the measured smallest set (containers/README.md, "Privileges", has the table
of what fails without each capability; `python -m containers.capprobe` re-measures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Privileges:
    name: str
    cap_add: tuple[str, ...]
    cap_drop: tuple[str, ...]
    security_opt: tuple[str, ...]

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for docker's containers.create/run."""
        return {
            "cap_add": list(self.cap_add),
            "cap_drop": list(self.cap_drop),
            "security_opt": list(self.security_opt),
        }

    def without(self, cap: str) -> Privileges:
        return Privileges(
            f"{self.name}-{cap}",
            tuple(c for c in self.cap_add if c != cap),
            self.cap_drop,
            self.security_opt,
        )


# Everything the VM allows: the fallback when MINIMUM is suspected of hiding a bug.
BROAD = Privileges(
    "broad", ("ALL",), ("SYS_RESOURCE",), ("seccomp=unconfined", "apparmor=unconfined")
)

# Start from nothing (cap_drop ALL) so the set does not depend on dockerd's defaults.
# Each one is needed: `python -m containers.capprobe` shows what fails without it.
MINIMUM = Privileges(
    "minimum",
    cap_add=(
        "SYS_ADMIN",  # unshare(CLONE_NEWNS|CLONE_NEWNET), mount(2): binds, propagation
        "SYS_CHROOT",  # setns(CLONE_NEWNS) checks it too (kernel mntns_install)
        "SYS_PTRACE",  # open /proc/PID/ns/mnt of a task running as another user
        "SETUID",  # switch to the job user (--user; su; slurmstepd)
        "SETGID",  # ... and to its gid and groups (setgroups)
        "CHOWN",  # hand the job's directories to the job user
        "DAC_OVERRIDE",  # root creates/walks trees the job user owns (mode 0700)
        "FOWNER",  # root removes the user's files from sticky (1777) tmp and var_tmp
        "KILL",  # SIGKILL a task of the job user after kill_wait
        "NET_ADMIN",  # bring lo up in a root-made private network (--net none)
    ),
    cap_drop=("ALL",),
    # Docker's default seccomp profile allows mount/unshare/setns once SYS_ADMIN is in
    # the set (measured: all probes pass with it), so seccomp stays on. AppArmor is not
    # in this kernel, making the option inert here; where it is, docker-default denies
    # mount(2), hence unconfined.
    security_opt=("apparmor=unconfined",),
)


# MINIMUM, plus what rootless runc needs inside a node (`srun --container`): its
# container init makes a session keyring (keyctl(2)), which docker's default seccomp
# profile refuses ("unable to join session keyring: ... operation not permitted").
# charliecloud's ch-run needs it too: under that profile its pivot_root(2) fails with
# EPERM (measured on forky's charliecloud 0.45).
ROOTLESS_RUNC = Privileges(
    "rootless-runc",
    MINIMUM.cap_add,
    MINIMUM.cap_drop,
    (*MINIMUM.security_opt, "seccomp=unconfined"),
)

# ROOTLESS_RUNC, plus what root's Podman 5.8 with crun 1.28 needs inside a node
# (tests/e2e/test_rig_hpc_runtimes.py), given to that one node only. The node's cgroup
# file system is read-only, so Podman runs with --cgroups=disabled, which it allows with
# crun only ("requested OCI runtime runc is not compatible with NoCgroups"); crun then
# makes the container's /dev nodes itself (MKNOD: "mknodat `/dev/null`: Operation not
# permitted") and narrows its bounding set (SETPCAP: "prctl drop bounding"). seccomp
# stays unconfined for crun's session keyring, as for rootless runc.
PODMAN = Privileges(
    "podman",
    (*ROOTLESS_RUNC.cap_add, "MKNOD", "SETPCAP"),
    ROOTLESS_RUNC.cap_drop,
    ROOTLESS_RUNC.security_opt,
)

BY_NAME = {p.name: p for p in (BROAD, MINIMUM, ROOTLESS_RUNC, PODMAN)}
