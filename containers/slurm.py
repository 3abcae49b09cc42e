"""A small Slurm cluster inside a rig: slurm.conf, munge, daemons, jobns hooks.

    with Rig(image, hostnames=["ctl", "node1", "node2"]) as rig:
        cluster = SlurmCluster(rig, controller="ctl", computes=["node1", "node2"], jobns=True)
        cluster.start()
        job_id = cluster.sbatch("alice", "#!/bin/sh\\n#SBATCH -N2\\nsrun jobns run -- id\\n")
        print(cluster.output(job_id))

The image carries slurm-wlm + munge of its Debian release (containers/images.py: 22.05,
24.11 or 26.05; the settings below work in each) and one munge key, made
when the base image was debootstrapped: every node of a rig has the same key, which
is all munge needs. Daemons run as root (SlurmUser=root), as in MACHINE.md's
single-node recipe; proctrack/linuxproc and task/none keep cgroups out of it.

jobns=True deploys jobns as docs/admin.md "Deploying on a Slurm cluster" documents for the
packaged install (the node images have the jobns and jobns-slurm packages,
containers/images.py): slurm.conf gets Prolog= and Epilog= naming the scripts the jobns
package ships, /etc/jobns/slurm/{prolog,epilog} (JOBNS_CONF; no PrologFlags: a node's
prolog runs before its first step); they are checked to be in place (root, 0755, /usr/bin/jobns).
Tasks then run as `srun jobns run -- CMD`. enforce=True (with jobns=True) deploys as
docs/admin.md "Enforced by Slurm" says: the line jobns-slurm ships commented in
/etc/slurm/plugstack.conf.d/jobns.conf is uncommented on every node (sbatch and srun read
it too; Debian's /etc/slurm/plugstack.conf includes that directory), and `[slurm] enforce
= true` goes into every compute's jobns.toml. Other settings (TaskProlog=, ...) go
through `extra`, which wins over both; `files` ({path: text}) are written on every node
before the daemons start (e.g. /etc/slurm/oci.conf).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from containers.errors import RigError
from containers.rig import ExecResult, Node, Rig

CONF = "/etc/slurm/slurm.conf"
# The scripts an administrator installs (the ones ci/start-slurm installs on the host).
SHIPPED_SLURM = Path(__file__).resolve().parents[1] / "jobns" / "slurm"
JOBNS_HOOKS = "/etc/jobns/slurm"
JOBNS_CONF = {
    "Prolog": f"{JOBNS_HOOKS}/prolog",
    "Epilog": f"{JOBNS_HOOKS}/epilog",
}
# Debian's plugstack.conf (slurm.conf's default) includes plugstack.conf.d/*.conf
PLUGSTACK_D = "/etc/slurm/plugstack.conf.d/jobns.conf"  # shipped by jobns-slurm
ENFORCE_CONF = {"PlugStackConfig": "/etc/slurm/plugstack.conf"}
# Batch scripts and their output, on the shared volume: written on the controller
# (where sbatch reads the script), written to by the batch step on the first node.
WORK = "/lustre/slurm"
# Job states after which nothing of the job runs any more (scontrol reports COMPLETING,
# not one of these, until every node's epilog has finished).
FINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
# Node states in which the node takes no job: a failed prolog or epilog drains it.
UNUSABLE = ("drain", "drng", "drained", "down", "fail", "failg")


def render_conf(
    controller: str,
    computes: Sequence[str],
    *,
    cpus: int = 1,
    memory_mb: int = 500,
    tmp_disk_mb: int = 0,
    kill_wait: int = 2,
    cluster: str = "rig",
    extra: Mapping[str, str] | None = None,
) -> str:
    """slurm.conf for one controller and `computes` (hostnames that resolve in the rig).

    CPUs and RealMemory are deliberately below what a container sees: a node that
    reports less than slurm.conf says is drained ("Low socket*core*thread count").
    TmpDisk (MB, of the node's /tmp) lets jobs ask for `--tmp`; Slurm refuses a job whose
    --tmp is larger than any node's.
    """
    if not computes:
        raise RigError("render slurm.conf: no compute nodes")
    settings = {
        "ClusterName": cluster,
        "SlurmctldHost": controller,
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "AuthType": "auth/munge",
        # A requeued job starts again once its last credential expired (default 120 s,
        # 1200 on 22.05): 30 s keeps the requeue tests short; sooner (an administrator's
        # StartTime=now), slurmd may skip the new run's prolog (it still holds the id).
        "AuthInfo": "cred_expire=30",
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
        "MailProg": "/bin/true",
        "ReturnToService": "2",
        "KillWait": str(kill_wait),
        **(extra or {}),
    }
    lines = [f"{k}={v}" for k, v in settings.items()]
    tmp = f" TmpDisk={tmp_disk_mb}" if tmp_disk_mb else ""
    lines += [
        f"NodeName={h} NodeHostname={h} CPUs={cpus} RealMemory={memory_mb}{tmp} State=UNKNOWN"
        for h in computes
    ]
    lines.append(
        f"PartitionName=rig Nodes={','.join(computes)} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


class SlurmCluster:
    def __init__(
        self,
        rig: Rig,
        controller: str,
        computes: Sequence[str],
        *,
        jobns: bool = False,
        enforce: bool = False,
        extra: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        cpus: int = 1,
        tmp_disk_mb: int = 0,
    ) -> None:
        if enforce and not jobns:
            raise RigError("SlurmCluster: enforce=True needs jobns=True")
        self.rig = rig
        self.controller = rig.node(controller)
        self.computes = [rig.node(h) for h in computes]
        self.jobns = jobns
        self.enforce = enforce
        self.conf = render_conf(
            controller,
            computes,
            extra={
                **(JOBNS_CONF if jobns else {}),
                **(ENFORCE_CONF if enforce else {}),
                **(extra or {}),
            },
            cpus=cpus,
            tmp_disk_mb=tmp_disk_mb,
        )
        self.files = dict(files or {})
        self.configured = False
        self.timings: dict[str, float] = {}

    @property
    def members(self) -> list[Node]:
        """Every node once (the controller may be a compute node too)."""
        return [self.controller, *(n for n in self.computes if n is not self.controller)]

    def configure(self) -> None:
        """Everything start() does before the Slurm daemons: slurm.conf, `files`, munged,
        jobns's prolog/epilog, plugstack.conf and `[slurm] enforce` (once)."""
        if self.configured:
            return
        for n in self.members:
            n.put_file(CONF, self.conf)
            for path, text in self.files.items():
                n.put_file(path, text)
            start_munge(n)
        if self.jobns:
            for n in self.computes:
                check_jobns_hooks(n)
        if self.enforce:
            for n in self.members:
                enable_plugin(n)
            for n in self.computes:
                n.sh("printf '[slurm]\\nenforce = true\\n' >> /etc/jobns/jobns.toml").check(
                    f"enforce in {n.hostname}'s jobns.toml"
                )
        self.controller.exec(["install", "-d", "-m", "1777", WORK]).check(
            f"create {WORK} on the shared volume"
        )
        self.configured = True

    def start(self, timeout: float = 60) -> None:
        """Write slurm.conf everywhere, start munged, slurmctld, slurmd; wait until idle."""
        t0 = time.monotonic()
        self.configure()
        self.controller.exec(["slurmctld"]).check(f"start slurmctld on {self.controller.hostname}")
        if self.jobns:
            for n in self.computes:
                start_helper(n)
        for n in self.computes:
            n.exec(["slurmd"]).check(f"start slurmd on {n.hostname}")
        self.wait_idle(timeout)
        self.timings["start"] = time.monotonic() - t0

    def version(self) -> str:
        """The Slurm release of the computes' slurmd (`slurmd -V`: "slurm 24.11.5")."""
        r = self.computes[0].exec(["slurmd", "-V"], timeout=10).check("slurmd -V")
        return r.stdout.split()[-1]

    def node_states(self) -> dict[str, str]:
        """sinfo's compact state of every compute node (idle, alloc, drain, ...)."""
        return {h: state for h, (state, _) in self._sinfo().items()}

    def unusable(self) -> dict[str, str]:
        """Compute nodes Slurm will not use (drained, down), with its reason."""
        return {
            h: f"{state}: {reason}"
            for h, (state, reason) in self._sinfo().items()
            if state.rstrip("*~#!%$@^-") in UNUSABLE
        }

    def _sinfo(self) -> dict[str, tuple[str, str]]:
        r = self.controller.exec(["sinfo", "-h", "-N", "-o", "%N|%t|%E"], timeout=10)
        found = {}
        for line in r.stdout.strip().splitlines() if r.exit_code == 0 else []:
            host, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            found[host] = (state, reason)
        return found

    def wait_idle(self, timeout: float) -> None:
        want = {n.hostname for n in self.computes}
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(h) == "idle" for h in want):
                return
            time.sleep(0.5)
        raise RigError(
            f"wait for Slurm nodes {sorted(want)} to be idle: after {timeout:g}s "
            f"sinfo says {states}\n{self.logs()}"
        )

    def logs(self, lines: int = 20) -> str:
        """The tails of slurmctld's and every slurmd's log (for failure messages)."""
        parts = []
        for n, name in [(self.controller, "slurmctld"), *((c, "slurmd") for c in self.computes)]:
            r = n.exec(["tail", "-n", str(lines), f"/var/log/slurm/{name}.log"], timeout=10)
            parts.append(f"--- {n.hostname}: {name}.log\n{r.stdout}{r.stderr}")
        return "".join(parts)

    # -- jobs --------------------------------------------------------------------------
    def sbatch(
        self, user: str, script: str, *options: str, wait: bool = True, timeout: float = 120
    ) -> str:
        """Submit `script` as `user` from the controller; returns the job id.

        The script and the job's output (WORK/slurm-<id>.out, read by `output`) live on
        the shared volume; the batch step starts in WORK. With wait it returns once the
        job has ended on every node, epilogs included (`wait_done`), and raises RigError
        unless it COMPLETED with exit code 0.
        """
        path = f"{WORK}/job-{time.monotonic_ns()}.sh"
        self.controller.put_file(path, script, mode=0o755)
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={WORK}",
            f"--output={WORK}/slurm-%j.out",
            *options,
            path,
        ]
        r = self.controller.exec(argv, user=user, timeout=30)
        first = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
        job_id = first.split(";")[0]
        if r.exit_code != 0 or not job_id.isdigit():
            raise RigError(
                f"{shlex.join(argv)} as {user}: no job id: exit {r.exit_code}\n"
                f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}"
            )
        if wait:
            state, code = self.wait_done(job_id, timeout)
            if (state, code) != ("COMPLETED", "0:0"):
                raise RigError(
                    f"job {job_id} ({shlex.join(argv)} as {user}) ended {state} "
                    f"with exit code {code}\n--- job output\n"
                    f"{self.output(job_id)}{self.logs()}"
                )
        return job_id

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(JobState, ExitCode) as scontrol says (kept MinJobAge=300 s after the end).

        Asked up to 3 times: on a loaded machine an exec has come back with exit 0 and
        no output at all (seen once in a run of tests/e2e/test_rig_peers.py).
        """
        for _ in range(3):
            r = self.controller.exec(["scontrol", "-o", "show", "job", job_id], timeout=10)
            state = re.search(r"\bJobState=(\S+)", r.stdout)
            code = re.search(r"\bExitCode=(\S+)", r.stdout)
            if r.exit_code == 0 and state is not None:
                return state.group(1), code.group(1) if code else "?"
            time.sleep(0.5)
        raise RigError(
            f"scontrol show job {job_id}: exit {r.exit_code}: "
            f"{r.stderr.strip() or r.stdout.strip()}"
        )

    def wait_done(self, job_id: str, timeout: float = 120) -> tuple[str, str]:
        """Until the job is in a final state; its (JobState, ExitCode).

        Fails at once, instead of at the timeout, when the job waits for a node that
        Slurm will not use any more (a failed prolog or epilog drains the node).
        """
        deadline = time.monotonic() + timeout
        state = code = "?"
        while time.monotonic() < deadline:
            state, code = self.job_state(job_id)
            if state in FINAL:
                return state, code
            if state == "PENDING" and (bad := self.unusable()):
                raise RigError(
                    f"job {job_id} is pending and will stay so: Slurm does not "
                    f"use {bad}\n{self.logs()}"
                )
            time.sleep(0.2)
        raise RigError(
            f"job {job_id} still {state} after {timeout:g}s\n"
            f"--- job output\n{self.output(job_id)}{self.logs()}"
        )

    def output(self, job_id: str) -> str:
        r = self.controller.exec(["cat", f"{WORK}/slurm-{job_id}.out"], timeout=10)
        return r.stdout if r.exit_code == 0 else ""

    def in_queue(self, job_id: str) -> bool:
        r = self.controller.exec(["squeue", "-h", "-j", job_id, "-o", "%i %T"], timeout=10)
        # an id slurmctld has already purged is an error ("Invalid job id"), not a line
        return r.exit_code == 0 and bool(r.stdout.strip())

    def scancel(self, job_id: str, *options: str) -> ExecResult:
        return self.controller.exec(["scancel", *options, job_id], timeout=30).check(
            f"scancel {job_id}"
        )


def check_jobns_hooks(node: Node) -> None:
    """The jobns package's /etc/jobns/slurm/{prolog,epilog} are in place: root, 0755,
    running the packaged /usr/bin/jobns."""
    for name in ("prolog", "epilog"):
        path = f"{JOBNS_HOOKS}/{name}"
        r = node.sh(f"stat -c '%U %a' {path} && grep -cE '(^|[[:space:]])/usr/bin/jobns ' {path}")
        if r.exit_code != 0 or r.stdout.split()[:2] != ["root", "755"]:
            raise RigError(
                f"the jobns {name} on {node.hostname}: {path} is not the packaged script "
                f"(root 0755, exec /usr/bin/jobns): {r.stdout}{r.stderr}; is the jobns "
                "package installed in the image (containers/images.py install_jobns)?"
            )


def start_helper(node: Node) -> None:
    """`jobns helper` on a compute node, before slurmd, as jobns-helper.service starts it
    on a site's node (the rig has no systemd); its log in /var/log/jobns-helper.log."""
    node.sh(
        "setsid /usr/bin/jobns helper </dev/null >>/var/log/jobns-helper.log 2>&1 & "
        "for i in $(seq 300); do "
        '[ -f /run/jobns/helper/pid ] && kill -0 "$(cat /run/jobns/helper/pid)" && exit 0; '
        "sleep 0.02; done; cat /var/log/jobns-helper.log; exit 1"
    ).check(f"start jobns helper on {node.hostname}")


def enable_plugin(node: Node) -> None:
    """Uncomment the `required` line jobns-slurm ships in plugstack.conf.d, as its
    comment tells a site to."""
    node.sh(
        f"sed -i 's|^#required |required |' {PLUGSTACK_D} && grep -q '^required ' {PLUGSTACK_D}"
    ).check(f"enable the jobns SPANK plugin in {node.hostname}:{PLUGSTACK_D}")


def start_munge(node: Node) -> None:
    # munged refuses a socket directory it does not own; /run is fresh in a container
    node.exec(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"]).check(
        f"mkdir /run/munge on {node.hostname}"
    )
    node.exec(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"]).check(
        f"start munged on {node.hostname}"
    )
