"""The burst-buffer rig tests' shared parts (tests/e2e/test_rig_burst_buffer*.py): the
deployment docs/admin.md "The burst buffer" describes, and what the tests ask of Slurm."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from containers.errors import RigError
from containers.rig import Rig
from containers.slurm import SlurmCluster

ALICE, BOB = "alice", "bob"
LUA = "/usr/share/jobns/slurm/lua"
SHARED = "/lustre/bb"  # shared_base
DATA = "/lustre/data"  # alice's: stage roots below it
POOL_MIB = 100
JOBNS_TOML = f"""\
shared_base = "{SHARED}"
[staging]
stage_roots = ["{DATA}"]
timeout = 600
[burst_buffer]
enabled = true
granularity = "1MiB"
size = "{POOL_MIB}MiB"
"""
EXAMPLES = "/usr/share/doc/jobns/examples"  # the package's burst_buffer.conf
PAUSE = "JOBNS_TEST_PAUSE_IN"
SAVE_INTERVAL = 35.0  # seconds: burst_buffer/lua saves its state every 30 s
# Slurm's burst-buffer states of a job, in the order it goes through them.
LIFE = (
    "pending",
    "staging-in",
    "staged-in",
    "pre-run",
    "running",
    "post-run",
    "staging-out",
    "staged-out",
    "teardown",
    "complete",
)


def deployed(
    rig: Rig,
    computes: list[str],
    extra: dict[str, str] | None = None,
    toml: str = JOBNS_TOML,
    before: Callable[[SlurmCluster], None] | None = None,
) -> SlurmCluster:
    """A cluster of `ctl` and `computes` with jobns's burst buffer deployed as an
    administrator does, not started yet: BurstBufferType=burst_buffer/lua (and `extra`)
    in slurm.conf, `toml` as every jobns.toml; on the controller (after `before`, if
    given), burst_buffer.lua and burst_buffer.conf beside slurm.conf from the package,
    the shared base, alice's data, and the pool measured before slurmctld starts."""
    c = SlurmCluster(
        rig,
        "ctl",
        computes,
        jobns=True,
        extra={"BurstBufferType": "burst_buffer/lua", **(extra or {})},
        files={"/etc/jobns/jobns.toml": toml},
    )
    c.configure()
    if before is not None:
        before(c)
    ctl = c.controller
    ctl.exec(
        ["cp", f"{LUA}/burst_buffer.lua", f"{EXAMPLES}/burst_buffer.conf", "/etc/slurm/"]
    ).check("install burst_buffer.lua and burst_buffer.conf")
    ctl.sh(f"install -d -m 0755 {SHARED} && install -d -o alice -m 0755 {DATA}").check(
        "make the shared base and alice's data"
    )
    ctl.exec(["jobns", "bb", "pools"]).check("measure the pool before slurmctld starts")
    return c


def doctor_lines(node: Any) -> list[str]:
    """What `jobns doctor` on node says about the burst buffer."""
    r = node.exec(["jobns", "doctor"], timeout=60)
    return [line for line in r.stdout.splitlines() if "burst" in line]


def show(cluster: SlurmCluster, *what: str) -> str:
    r = cluster.controller.exec(["scontrol", "show", *what], timeout=30).check(
        f"scontrol show {' '.join(what)}"
    )
    return r.stdout


def field(text: str, key: str) -> str:
    m = re.search(rf"\b{key}=(\S*)", text)
    return m.group(1) if m else ""


def wait_for(what: str, check: Any, cluster: SlurmCluster, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RigError(f"waited {timeout:g} s for {what}\n{cluster.logs(40)}")
        time.sleep(0.5)


def submit(cluster: SlurmCluster, script: str) -> str:
    return cluster.sbatch(ALICE, script, wait=False)


def put_input(cluster: SlurmCluster, name: str, text: str) -> str:
    path = f"{DATA}/{name}"
    cluster.controller.sh(
        'install -d -o alice "$1" && printf %s "$2" >"$1/f" && chown alice "$1/f"', path, text
    ).check(f"make {path}")
    return path


def gone(cluster: SlurmCluster, job_id: str) -> None:
    """Nothing of the job is left: no shared tree, no burst-buffer record, no node state."""
    ls = cluster.controller.sh(f"ls -A {SHARED} {SHARED}/.jobns-bb").stdout
    assert f"job-{job_id}" not in ls, ls
    for n in cluster.computes:
        r = n.sh(
            f"ls -A /run/jobns/jobs /tmp /dev/shm 2>/dev/null | grep -w 'job-{job_id}' || true"
        )
        assert not r.stdout.strip(), (n.hostname, r.stdout)


def buffer_done(cluster: SlurmCluster, job_id: str) -> bool:
    """The job's buffer is complete, or (a job slurmctld lost) its record is gone."""
    r = cluster.controller.exec(["scontrol", "show", "job", job_id], timeout=30)
    if r.exit_code == 0:
        return field(r.stdout, "BurstBufferState") == "complete"
    record = f"{SHARED}/.jobns-bb/job-{job_id}.json"
    return cluster.controller.exec(["test", "-e", record]).exit_code != 0


def bb_state(cluster: SlurmCluster, job_id: str) -> str:
    return field(show(cluster, "job", job_id), "BurstBufferState")
