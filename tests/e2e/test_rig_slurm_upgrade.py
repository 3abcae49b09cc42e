"""A Slurm upgrade under an enforced node: the jobns SPANK plugin built for 22.05 (Debian
bookworm's node image) on a 26.05 node (forky's), as after `apt upgrade` without a rebuild.

Measured here, and what docs/admin.md "Upgrading Slurm: rebuild the plugin first" says: `jobns
doctor` names the mismatch
and the rebuild; with the plugin `required` (jobns-slurm's plugstack.conf.d line) slurmd refuses to
start, so the node runs nothing; with `optional` slurmd starts and every job runs outside
its namespace without a word from Slurm (doctor calls that line a problem, and `jobns
status` warns that the node's jobs are not enforced); reinstalling the plugin
with the jobns-slurm package built for 26.05 and restarting slurmd enforces again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from containers import images
from containers.images import DEB_DIR, spank_plugin
from containers.rig import Node, Rig
from containers.slurm import PLUGSTACK_D, SlurmCluster

pytestmark = pytest.mark.docker

OLD, NEW = "bookworm", "forky"  # Slurm 22.05 and 26.05
PLUGSTACK = PLUGSTACK_D  # jobns-slurm's line, uncommented by enforce=True


def wanted() -> bool:
    names = os.environ.get("JOBNS_RIG_RELEASES", "")
    return not names or {OLD, NEW} <= {n.strip() for n in names.split(",")}


@pytest.fixture(scope="module")
def old_plugin(docker_client: Any) -> bytes:
    if not wanted():
        pytest.skip(f"JOBNS_RIG_RELEASES does not name both {OLD} and {NEW}")
    image = images.build(docker_client, release_name=OLD).node
    with Rig(image, 1, client=docker_client) as rig:
        return rig.nodes[0].get_file(spank_plugin())


@pytest.fixture
def upgraded(docker_client: Any, old_plugin: bytes) -> Iterator[SlurmCluster]:
    """A 26.05 controller and node1, deployed enforced, node1 with the 22.05 plugin and
    slurmd not started yet."""
    image = images.build(docker_client, release_name=NEW).node
    with Rig(image, hostnames=["ctl", "node1"], client=docker_client) as rig:
        rig.node("node1").put_file(spank_plugin(), old_plugin, mode=0o644)
        yield SlurmCluster(rig, "ctl", ["node1"], jobns=True, enforce=True)


def doctor(node: Node) -> list[str]:
    """doctor's lines about the SPANK plugin's build and line (the rest, e.g. a
    container's private /, is not this test's business)."""
    r = node.exec(["jobns", "doctor"])
    return [ln for ln in r.stdout.splitlines() if "built for Slurm" in ln or "'optional'" in ln]


def status_warnings(node: Node) -> list[str]:
    r = node.exec(["jobns", "status"]).check("jobns status")
    return [ln for ln in r.stderr.splitlines() if "jobs are not enforced" in ln]


def slurmd_running(node: Node) -> bool:
    return node.exec(["pgrep", "-x", "slurmd"]).exit_code == 0


def restart_slurmd(cluster: SlurmCluster, node: Node) -> None:
    node.sh('kill "$(cat /run/slurmd.pid)" 2>/dev/null; true')
    deadline = time.monotonic() + 30
    while slurmd_running(node):
        assert time.monotonic() < deadline, "slurmd does not stop"
        time.sleep(0.2)
    node.exec(["slurmd"]).check("start slurmd")
    cluster.wait_idle(30)


def task_namespace(cluster: SlurmCluster, node: Node) -> tuple[str, str]:
    """(a task's mount namespace, node1's own) for a one-task job of alice's."""
    r = cluster.controller.exec(
        ["srun", "-w", node.hostname, "readlink", "/proc/self/ns/mnt"], user="alice"
    ).check("srun readlink")
    own = node.exec(["readlink", "/proc/1/ns/mnt"]).check("readlink").stdout
    return r.stdout.strip(), own.strip()


def test_a_plugin_built_for_another_slurm_is_caught_and_rebuilt(upgraded: SlurmCluster) -> None:
    node = upgraded.computes[0]
    version = node.exec(["slurmd", "-V"]).check("slurmd -V").stdout.split()[-1]
    assert version.startswith("26.05."), version
    # 1. Before slurmd starts: doctor names the mismatch and the rebuild.
    upgraded.configure()
    (line,) = doctor(node)
    assert line.startswith("problem: SPANK plugin") and "built for Slurm 22.05" in line, line
    assert f"runs Slurm {version}" in line and "the jobns-slurm package" in line, line

    # 2. `required` (the plugstack.conf.d line): slurmd refuses the plugin, does not run.
    with pytest.raises(Exception, match=r"slurmd|idle"):
        upgraded.start(timeout=15)
    assert not slurmd_running(node)
    log = node.exec(["cat", "/var/log/slurm/slurmd.log"]).stdout
    assert "Incompatible Slurm plugin" in log, log[-3000:]

    # 3. `optional`: slurmd starts, and jobs run outside their namespaces, silently.
    node.sh(f"sed -i 's/^required /optional /' {PLUGSTACK}").check("make it optional")
    node.exec(["slurmd"]).check("start slurmd")
    upgraded.wait_idle(30)
    task, own = task_namespace(upgraded, node)
    assert task == own  # un-enforced: the node's own /tmp
    lines = doctor(node)
    assert len(lines) == 2 and all(ln.startswith("problem: ") for ln in lines), lines
    assert "'optional' while [slurm] enforce = true" in lines[0], lines
    warned = status_warnings(node)  # jobns status says so too
    assert len(warned) == 2 and "'optional'" in warned[0] and "22.05" in warned[1], warned

    # 4. The upgrade procedure: the jobns-slurm package built for the installed Slurm
    # (the node image's, DEB_DIR), `required`, restart.
    node.sh(f"sed -i 's/^optional /required /' {PLUGSTACK}").check("make it required")
    node.sh(f"dpkg --force-confold -i {DEB_DIR}/jobns-slurm_*.deb").check("reinstall jobns-slurm")
    (line,) = doctor(node)
    assert line.startswith("ok: SPANK plugin") and f"built for Slurm {version}" in line, line
    assert status_warnings(node) == []
    restart_slurmd(upgraded, node)
    task, own = task_namespace(upgraded, node)
    assert task != own  # enforced: the job's namespace
    upgraded.wait_idle(30)  # in service again once the epilog is done
