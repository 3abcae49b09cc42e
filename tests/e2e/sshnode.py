"""A node installed from the Debian packages and reached by ssh, as a site runs it.

Two rig containers from the node image of one Slurm release (containers/images.py:
bookworm 22.05, trixie 24.11 or forky 26.05; the default is bookworm): `ctl` (the
controller, where users submit and ssh from) and `node1` (the compute node). The image
has everything installed already, cached by content: the release's openssh-server and
libpam-slurm-adopt in its base, the project's jobns and jobns-slurm .debs built for that
release. Nothing is installed at test time; node1 is configured as docs/admin.md
"Enforced by Slurm" says for a packaged install (containers/slurm.py, jobns=True, enforce=True):
  - /etc/jobns/jobns.toml: [slurm] enforce = true (node1);
  - /etc/slurm/plugstack.conf.d/jobns.conf: the shipped line uncommented (both);
  - slurm.conf: Prolog=/etc/jobns/slurm/prolog, Epilog=/etc/jobns/slurm/epilog,
    PrologFlags=Contain (pam_slurm_adopt adopts only into jobs with an extern step);
  - /etc/pam.d/sshd (node1): Debian's, plus `account required pam_slurm_adopt.so` and
    `account required pam_jobns.so` after common-account and `session required
    pam_jobns.so` at the end; pam_loginuid made optional (a container has no
    CAP_AUDIT_CONTROL: that is the container's limit, not the site's);
  - sshd on node1 port 2222 (NET_BIND_SERVICE is not in the rig's capability set), key
    authentication only, AcceptEnv also SLURM_JOB_ID (the worst a site could allow).
The same configuration works on all three releases (openssh 9.2, 10.0, 10.6; Debian's
sshd_config has UsePAM yes in each; pam_slurm_adopt needs no cgroup plugin for this:
proctrack/linuxproc and task/none, as in every rig cluster).
Users alice, bob (ordinary, in the image) and carol (in group jobnsadmin, pam_jobns's
admin_group, added here) log in with keys made on ctl. `packages()` builds the .debs on
this host for tests/e2e/test_packages.py.
"""

from __future__ import annotations

import functools
import re
import shlex
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from containers import debs as debs_mod
from containers import images
from containers.errors import RigError
from containers.rig import ExecResult, Node, Rig
from containers.slurm import SlurmCluster

USERS = ("alice", "bob", "carol")
ADMIN = ("carol", 1003)  # not in the image: the one user only these tests need
ADMIN_GROUP = "jobnsadmin"
PORT = 2222
PAM_ARGS = f"admin_group={ADMIN_GROUP}"
SSH = [
    "ssh",
    "-p",
    str(PORT),
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=INFO",
    "-o",
    "ConnectTimeout=20",
]
STATE = "/run/jobns/jobs"


@functools.cache
def packages(client: Any) -> tuple[str, list[Path], Path]:
    """(bookworm base image, [jobns .deb, jobns-slurm .deb] built on this host, their
    dependency repository), built once per test session (tests/e2e/test_packages.py)."""
    base, _ = images.build_base(client, images.host_mirror(), False, lambda _m: None)
    out = Path(tempfile.mkdtemp(prefix="jobns-debs-"))
    built = debs_mod.build(out)
    repo = debs_mod.dependency_repo(client, base, out / "repo", packages=[str(d) for d in built])
    return base, built, repo


def add_admin(node: Node) -> None:
    """carol, in pam_jobns's admin_group (alice and bob are the image's)."""
    name, uid = ADMIN
    node.sh(
        f"useradd --create-home --user-group --uid {uid} --shell /bin/sh {name}"
        f" && groupadd {ADMIN_GROUP} && usermod -aG {ADMIN_GROUP} {name}"
    ).check(f"add {name} on {node.hostname}")


PAM_EDIT = r"""
set -e
f=/etc/pam.d/sshd
sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' $f
sed -i "/^@include common-account/a account required pam_slurm_adopt.soACCOUNT" $f
printf 'SESSION' >> $f
# each edit took (a release whose file differs fails here, not in a login)
grep -q '^account required pam_slurm_adopt.so' $f
! grep -q '^session\s\+required\s\+pam_loginuid.so' $f
grep -q '^UsePAM yes' /etc/ssh/sshd_config
ssh-keygen -A  # host keys: made by openssh-server's postinst in the image, else now
mkdir -p /run/sshd
/usr/sbin/sshd -p PORT -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
    -o "AcceptEnv=LANG LC_* SLURM_JOB_ID"
"""


class SshCluster:
    def __init__(self, rig: Rig, slurm: SlurmCluster) -> None:
        self.rig = rig
        self.slurm = slurm
        self.ctl = rig.node("ctl")
        self.node = rig.node("node1")

    # -- jobs ------------------------------------------------------------------------
    def allocate(self, user: str, *options: str) -> str:
        """`salloc --no-shell` as user on node1: a job with no step but its extern one;
        returns its id once jobns setup finished there (running, or refused)."""
        r = self.ctl.exec(["salloc", "--no-shell", "-w", "node1", "-t", "10", *options], user=user)
        m = re.search(r"Granted job allocation (\d+)", r.stdout + r.stderr)
        if m is None:
            raise RigError(f"salloc as {user}: {r}\n{self.slurm.logs()}")
        job = m.group(1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            env = self.node.exec(["cat", f"{STATE}/{job}/run.env"])
            ready = env.exit_code == 0 and (
                "closed=refused" in env.stdout or "closed=" not in env.stdout
            )
            if ready and self.slurm.job_state(job)[0] == "RUNNING":
                return job
            time.sleep(0.2)
        raise RigError(f"job {job} of {user} not set up on node1 after 60s\n{self.slurm.logs()}")

    def end(self, job: str, timeout: float = 60) -> None:
        """scancel, then wait until its epilog (jobns teardown) removed its state."""
        self.slurm.scancel(job)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            gone = self.node.exec(["test", "-e", f"{STATE}/{job}"]).exit_code != 0
            if gone and not self.slurm.in_queue(job):
                return
            time.sleep(0.2)
        raise RigError(f"job {job} still on node1 {timeout:g}s after scancel")

    def step(self, user: str, job: str, command: str) -> ExecResult:
        """An `srun --overlap` step of the job on node1."""
        return self.ctl.exec(
            ["srun", f"--jobid={job}", "--overlap", "-w", "node1", "sh", "-c", command],
            user=user,
            timeout=60,
        )

    # -- ssh -------------------------------------------------------------------------
    def ssh(
        self, user: str, command: str, env: dict[str, str] | None = None, login: str = ""
    ) -> ExecResult:
        """`ssh -p 2222 [login@]node1 COMMAND` as user from ctl (with user's key); env is
        sent with SendEnv."""
        send = [a for k in env or {} for a in ("-o", f"SendEnv={k}")]
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())]
        target = f"{login}@node1" if login else "node1"
        return self.ctl.exec([*prefix, *SSH, *send, target, command], user=user, timeout=60)

    def ssh_background(self, user: str, command: str, log: str) -> None:
        """The same, left running (its output in log on ctl)."""
        argv = shlex.join([*SSH, "node1", command])
        self.ctl.sh(f"setsid {argv} >{log} 2>&1 </dev/null &", user=user).check("ssh in bg")

    def host(self, command: str) -> ExecResult:
        """A command on node1 in the node's own namespaces, as root."""
        return self.node.sh(command)


@contextmanager
def ssh_cluster(
    client: Any,
    image: str | None = None,
    extra: dict[str, str] | None = None,
    pam_jobns: bool = True,
) -> Iterator[SshCluster]:
    """ctl + node1 of `image` (a node image of containers/images.py; default: bookworm's)
    with Slurm up, jobns enforced and sshd on node1. extra: more slurm.conf lines;
    pam_jobns False: pam_slurm_adopt alone in sshd's PAM stack."""
    image = image or images.build(client).node
    with Rig(image, hostnames=["ctl", "node1"], client=client) as rig:
        ctl, node = rig.node("ctl"), rig.node("node1")
        for n in rig.nodes:
            add_admin(n)
        for name in USERS:
            key = f"/home/{name}/.ssh/id_ed25519"
            ctl.exec(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], user=name).check(
                f"ssh key of {name}"
            )
            pub = ctl.exec(["cat", f"{key}.pub"]).check(f"{name}'s public key").stdout
            node.put_file(f"/home/{name}/.ssh/authorized_keys", pub, mode=0o600)
            node.exec(["chown", "-R", f"{name}:{name}", f"/home/{name}/.ssh"]).check("chown")
            if name == "alice":  # the key root's login is tried with
                node.put_file("/root/.ssh/authorized_keys", pub, mode=0o600)
        # node1's jobns.toml: `[slurm] enforce = true` (SlurmCluster) and nothing of the
        # rig's (its shared_base): a site's node with only what docs/admin.md asks for
        node.put_file("/etc/jobns/jobns.toml", "")
        slurm = SlurmCluster(
            rig,
            "ctl",
            ["node1"],
            jobns=True,
            enforce=True,
            cpus=2,
            extra={"PrologFlags": "Contain", **(extra or {})},
        )
        # several users' jobs at once on the one node
        slurm.conf = slurm.conf.replace(" State=UP", " OverSubscribe=FORCE:4 State=UP")
        slurm.start()
        script = (
            PAM_EDIT.replace("ACCOUNT", f"\\naccount required pam_jobns.so {PAM_ARGS}").replace(
                "SESSION", f"session required pam_jobns.so {PAM_ARGS}\\n"
            )
            if pam_jobns
            else PAM_EDIT.replace("ACCOUNT", "").replace("SESSION", "")
        ).replace("PORT", str(PORT))
        node.sh(script).check("configure and start sshd on node1")
        yield SshCluster(rig, slurm)
