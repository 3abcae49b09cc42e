"""The rig removes everything it made, whatever way the `with` is left, and sweeps
what crashed runs (SIGKILL) left behind; its network keeps traffic inside the rig."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from containers import labels
from containers.rig import Rig, labelled, name_of, sweep
from tests.e2e.rig.jobs import concurrently

pytestmark = pytest.mark.docker

REPO = str(Path(__file__).resolve().parents[2])


def leftovers(client: Any, run_id: str) -> dict[str, list[str]]:
    return {k: [name_of(o) for o in v] for k, v in labelled(client, run_id).items() if v}


def test_removes_everything_on_normal_exit(docker_client: Any, rig_image: str) -> None:
    with Rig(rig_image, 2, client=docker_client) as rig:
        made = leftovers(docker_client, rig.run_id)
        assert (
            len(made.get("containers", [])) == 2 and made.get("networks") and made.get("volumes")
        ), made
    assert leftovers(docker_client, rig.run_id) == {}


def test_removes_everything_after_an_exception(docker_client: Any, rig_image: str) -> None:
    run_id = ""
    with pytest.raises(RuntimeError, match="boom"), Rig(rig_image, 1, client=docker_client) as rig:
        run_id = rig.run_id
        raise RuntimeError("boom")
    assert run_id and leftovers(docker_client, run_id) == {}


def test_removes_everything_after_keyboard_interrupt(docker_client: Any, rig_image: str) -> None:
    run_id = ""
    with pytest.raises(KeyboardInterrupt), Rig(rig_image, 1, client=docker_client) as rig:
        run_id = rig.run_id
        raise KeyboardInterrupt
    assert run_id and leftovers(docker_client, run_id) == {}


# The rig in a child process, signalled from outside as a CI runner or a user would.
CHILD = """
import sys, time
from containers.rig import Rig
with Rig(sys.argv[1], 1) as rig:
    print(rig.run_id, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_removes_everything_when_signalled(
    docker_client: Any, rig_image: str, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, rig_image],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert run_id, f"the child rig did not start: {proc.communicate(timeout=30)}"
        assert leftovers(docker_client, run_id)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftovers(docker_client, run_id) == {}, err
    assert "RigTerminated" in err or "KeyboardInterrupt" in err, err


def test_second_signal_during_removal_waits_for_it(docker_client: Any, rig_image: str) -> None:
    """Ctrl-C, then SIGTERM while the rig is being removed: removal still completes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, rig_image],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run_id = proc.stdout.readline().strip()
        assert run_id, f"the child rig did not start: {proc.communicate(timeout=30)}"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.15)  # removing one node takes ~0.4 s: land inside it
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftovers(docker_client, run_id) == {}, err


def _dead_owner() -> str:
    """An owner label naming no live process: a pid above the kernel's pid_max limit."""
    return f"{labels.boot_id()}:{2**22 + 1}:0"


def test_sweep_removes_only_leftovers_of_dead_owners(docker_client: Any, rig_image: str) -> None:
    dead, live = "sweeptest" + labels.new_run_id(), "sweeptest" + labels.new_run_id()
    for run_id, owner in ((dead, _dead_owner()), (live, labels.owner_of())):
        lab = {labels.RIG: run_id, labels.OWNER: owner, labels.ROLE: "test"}
        docker_client.volumes.create(f"jobns-rig-{run_id}-v", labels=lab)
        docker_client.networks.create(f"jobns-rig-{run_id}-n", internal=True, labels=lab)
        docker_client.containers.create(
            rig_image, ["true"], name=f"jobns-rig-{run_id}-c", labels=lab, network_mode="none"
        )
    try:
        out = subprocess.run(
            [sys.executable, "-m", "containers.rig", "sweep"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert leftovers(docker_client, dead) == {}, out.stdout
        assert f"jobns-rig-{dead}-c" in out.stdout
        still = leftovers(docker_client, live)
        assert len(still) == 3, f"the sweeper removed a live owner's resources: {still}"
    finally:
        sweep(docker_client, run_id=live)
        sweep(docker_client, run_id=dead)
    assert leftovers(docker_client, live) == {}


def test_network_is_internal_and_nodes_reach_each_other(docker_client: Any, rig: Rig) -> None:
    net = docker_client.networks.get(rig.network_name)
    assert net.attrs["Internal"] is True, "the rig network must have no way out"
    for n in rig.nodes:
        n.container.reload()
        ports = n.container.attrs["NetworkSettings"]["Ports"] or {}
        assert not any(ports.values()), f"{n.hostname} publishes {ports}"
        route = n.exec(["ip", "route"]).check("ip route").stdout
        assert "default" not in route, f"{n.hostname} has a route out: {route}"
    # node1 -> node2 by hostname, over the rig network only
    server = (
        "import socket;s=socket.socket();s.bind(('0.0.0.0',7777));s.listen();"
        "c,_=s.accept();c.sendall(b'pong');c.close()"
    )
    client = (
        "import socket,time\nfor i in range(100):\n try:\n"
        "  c=socket.create_connection(('node2',7777),timeout=2);break\n"
        " except OSError: time.sleep(0.1)\nprint(c.recv(4).decode())"
    )
    # the client retries until the server listens
    served, got = concurrently(
        [
            lambda: rig.node("node2").exec(["python3", "-c", server], timeout=30),
            lambda: rig.node("node1").exec(["python3", "-c", client], timeout=30),
        ]
    )
    assert got.stdout.strip() == "pong" and served.exit_code == 0, (served, got)
