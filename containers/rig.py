"""A throw-away cluster of node containers sharing one volume as the cluster file system.

    with Rig(image, nodes=2) as rig:
        rig.node("node1").exec(["jobns", "run", "--", "true"]).check("jobns run")

Each rig has its own run id; it creates
  - an *internal* user-defined bridge network (no route out, no published ports: the
    nodes can talk only to each other), nodes reachable by their hostnames;
  - one named volume, mounted at `shared_mount` (/lustre) in every node;
  - nodes node1..nodeN (hostname = nodeN, so per-node paths use it), each running
    `sleep infinity` under docker's init, with /etc/jobns/jobns.toml written in.
Everything carries labels (containers/labels.py). Leaving the `with` removes all of
it, whatever the way out: an exception, KeyboardInterrupt, or SIGTERM/SIGHUP (turned
into RigTerminated, a KeyboardInterrupt, so the `with` unwinds). Signals are deferred
while removing, so a second Ctrl-C cannot leave half a rig behind. A run killed with
SIGKILL leaves its resources: the sweeper removes those of dead owners, and runs at
every rig start.

    python -m containers.rig sweep [--all]      # remove leftovers of crashed runs
    python -m containers.rig up [-n N]          # a rig to poke at by hand; Ctrl-C ends it
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import shlex
import signal
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, NamedTuple

from containers import labels
from containers.dockerapi import connect, not_found
from containers.errors import RigError
from containers.privileges import MINIMUM, Privileges

Log = Callable[[str], None]
CONFIG_PATH = "/etc/jobns/jobns.toml"
SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # SIGINT already raises KeyboardInterrupt


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class RigTerminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP arrived while a rig was up: unwind the `with` like Ctrl-C."""


class ExecResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str

    def check(self, what: str) -> ExecResult:
        if self.exit_code != 0:
            raise RigError(
                f"{what}: exit {self.exit_code}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
            )
        return self


def as_user(user: str, argv: Sequence[str]) -> list[str]:
    """argv run by `user` through su (a login-less switch, as a batch system does)."""
    if user == "root":
        return list(argv)
    return ["su", user, "-s", "/bin/sh", "-c", shlex.join(argv)]


def toml(config: Mapping[str, object]) -> str:
    """The TOML jobns reads: key = value lines (strings, numbers, booleans), then a
    [table] for each Mapping value (e.g. {"capacity": {"tmp_backing": "disk"}})."""
    lines = [f"{key} = {_toml_value(v)}" for key, v in config.items() if not isinstance(v, Mapping)]
    for table, values in config.items():
        if isinstance(values, Mapping):
            lines.append(f"[{table}]")
            lines += [f"{key} = {_toml_value(v)}" for key, v in values.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def loop_devices() -> dict[str, Any]:
    """docker's run() arguments that give a node the host's loop devices (disk
    capacities attach images to them): /dev/loop-control and every /dev/loopN the host
    has now (a container's /dev is its own: a device the kernel adds later, e.g. when
    all of these are busy, does not appear in it), and the device cgroup's leave to use
    any loop device (block major 7) and loop-control (char 10:237)."""
    found = sorted(glob.glob("/dev/loop[0-9]*"), key=lambda d: int(d[len("/dev/loop") :]))
    return {
        "devices": [f"{d}:{d}:rwm" for d in ["/dev/loop-control", *found]],
        "device_cgroup_rules": ["b 7:* rwm", "c 10:237 rwm"],
    }


class Node:
    """One node container."""

    def __init__(self, container: Any, hostname: str) -> None:
        self.container = container
        self.hostname = hostname

    def __repr__(self) -> str:
        return f"Node({self.hostname})"

    def exec(
        self,
        argv: Sequence[str],
        *,
        user: str = "root",
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run argv in the node as `user` (through su) and wait; never hangs past timeout.

        docker exec has no timeout of its own, so coreutils' timeout bounds the command
        inside the node (then SIGKILL 5 s later); exit 124 means it ran out of time.
        """
        cmd = ["timeout", "--kill-after=5", f"{timeout:g}", *as_user(user, argv)]
        try:
            res = self.container.exec_run(cmd, demux=True, environment=dict(env or {}))
        except Exception as e:
            raise RigError(f"exec {shlex.join(cmd)} in {self.hostname}: {e}") from None
        out, err = res.output
        return ExecResult(
            int(res.exit_code),
            (out or b"").decode(errors="replace"),
            (err or b"").decode(errors="replace"),
        )

    def sh(self, script: str, *args: str, user: str = "root", timeout: float = 120) -> ExecResult:
        return self.exec(["sh", "-c", script, "sh", *args], user=user, timeout=timeout)

    def get_file(self, path: str) -> bytes:
        """The bytes of one regular file of the node."""
        try:
            chunks, _ = self.container.get_archive(path)
            raw = b"".join(chunks)
        except Exception as e:
            raise RigError(f"read {path} from {self.hostname}: {e}") from None
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None else None
            if f is None:
                raise RigError(f"read {path} from {self.hostname}: not a regular file")
            return f.read()

    def put_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else data
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(os.path.basename(path))
            info.size, info.mode, info.mtime = len(raw), mode, int(time.time())
            tar.addfile(info, io.BytesIO(raw))
        directory = os.path.dirname(path) or "/"
        self.exec(["mkdir", "-p", directory]).check(f"mkdir {directory} in {self.hostname}")
        if not self.container.put_archive(directory, buf.getvalue()):
            raise RigError(f"write {path} in {self.hostname}: put_archive refused")


def labelled(client: Any, run_id: str | None = None) -> dict[str, list[Any]]:
    """Containers, networks and volumes carrying the rig label (of run_id, or any)."""
    flt = {"label": f"{labels.RIG}={run_id}" if run_id else labels.RIG}
    return {
        # sparse: no per-container inspect, which races with another rig removing its own
        "containers": list(client.containers.list(all=True, filters=flt, sparse=True)),
        "networks": list(client.networks.list(filters=flt)),
        "volumes": list(client.volumes.list(filters=flt)),
    }


def _labels_of(obj: Any) -> dict[str, str]:
    attrs = obj.attrs or {}
    found = attrs.get("Labels") or attrs.get("Config", {}).get("Labels") or {}
    return dict(found)


def name_of(obj: Any) -> str:
    """A resource's name; sparse container listings carry "Names" ("/x"), not "Name"."""
    attrs = obj.attrs or {}
    names = attrs.get("Names") or [attrs.get("Name") or obj.id]
    return str(names[0]).lstrip("/")


def sweep(
    client: Any, *, run_id: str | None = None, everything: bool = False, log: Log = _stderr
) -> list[str]:
    """Remove labelled resources: of run_id; else of dead owners (all with everything).

    Containers go first (a network or volume in use cannot be removed). Returns what
    was removed; failures are logged and left for the next sweep, except that the
    caller can check `labelled()` afterwards.
    """
    removed: list[str] = []
    nf = not_found()
    found = labelled(client, run_id)
    for kind in ("containers", "networks", "volumes"):
        for obj in found[kind]:
            lab = _labels_of(obj)
            if run_id is None and not everything and labels.owner_alive(lab.get(labels.OWNER)):
                continue  # another live rig's: not ours to remove
            name = name_of(obj)
            try:
                if kind == "containers":
                    obj.remove(force=True, v=True)
                elif kind == "volumes":
                    obj.remove(force=True)
                else:
                    obj.remove()
                removed.append(f"{kind[:-1]} {name}")
            except nf:
                pass  # gone meanwhile (e.g. auto-removed): that is what we wanted
            except Exception as e:
                log(f"rig: sweep: remove {kind[:-1]} {name}: {e}")
    return removed


class Rig:
    def __init__(
        self,
        image: str,
        nodes: int = 2,
        *,
        hostnames: Sequence[str] = (),
        client: Any | None = None,
        shared_mount: str = "/lustre",
        shared_base: str = "/lustre/jobns",
        config: Mapping[str, object] | None = None,
        privileges: Privileges = MINIMUM,
        loop: bool = False,
        run_id: str | None = None,
        log: Log = _stderr,
    ) -> None:
        # hostnames overrides the node1..nodeN default (e.g. a Slurm controller "ctl")
        self.hostnames = list(hostnames) or [f"node{i}" for i in range(1, nodes + 1)]
        if not self.hostnames or len(set(self.hostnames)) != len(self.hostnames):
            raise RigError(f"create rig: need distinct hostnames, not {self.hostnames}")
        self.image = image
        self.client = client
        self.shared_mount = shared_mount
        self.shared_base = shared_base
        self.config = {"shared_base": shared_base, **(config or {})}
        self.privileges = privileges
        self.loop = loop  # the host's loop devices in every node (loop_devices())
        self.run_id = run_id or labels.new_run_id()
        self.prefix = f"jobns-rig-{self.run_id}"
        self.network_name = f"{self.prefix}-net"
        self.volume_name = f"{self.prefix}-shared"
        self.log = log
        self.nodes: list[Node] = []
        self.timings: dict[str, float] = {}
        self._old_handlers: dict[int, Any] = {}

    def node(self, hostname: str) -> Node:
        for n in self.nodes:
            if n.hostname == hostname:
                return n
        raise RigError(f"find node {hostname}: the rig has {[n.hostname for n in self.nodes]}")

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Rig:
        self._install_handlers()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except RigError as e:
            if exc is None:
                raise
            # don't hide the test's own failure behind a cleanup problem
            self.log(f"rig: {e}")

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works only there; the sweeper covers this case

        def terminated(signum: int, frame: FrameType | None) -> None:
            raise RigTerminated(f"rig {self.run_id}: {signal.Signals(signum).name}")

        for sig in SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, terminated)

    def _start(self) -> None:
        t0 = time.monotonic()
        self.client = self.client or connect()
        swept = sweep(self.client, log=self.log)
        if swept:
            self.log(f"rig: swept leftovers of earlier runs: {', '.join(swept)}")
        client = self.client
        api_error = _api_error()
        try:
            # internal: no gateway/NAT, so node traffic cannot leave the rig
            client.networks.create(
                self.network_name,
                driver="bridge",
                internal=True,
                check_duplicate=True,
                labels=labels.for_run(self.run_id, "network"),
            )
            client.volumes.create(
                self.volume_name,
                driver="local",
                labels=labels.for_run(self.run_id, "shared-volume"),
            )
            for hostname in self.hostnames:
                self.nodes.append(self._start_node(hostname))
        except api_error as e:
            raise RigError(f"start rig {self.run_id}: {e}") from None
        self._configure()
        self.timings["start"] = time.monotonic() - t0

    def _start_node(self, hostname: str) -> Node:
        assert self.client is not None
        endpoint = self.client.api.create_endpoint_config(aliases=[hostname])
        container = self.client.containers.run(
            self.image,
            ["sleep", "infinity"],
            detach=True,
            init=True,
            name=f"{self.prefix}-{hostname}",
            hostname=hostname,
            network=self.network_name,
            networking_config={self.network_name: endpoint},
            volumes={self.volume_name: {"bind": self.shared_mount, "mode": "rw"}},
            labels=labels.for_run(self.run_id, "node"),
            # /dev/shm as on a node (Debian: rw,nosuid,nodev), not docker's noexec one:
            # rootless runc cannot bind a job's /dev/shm tree from a noexec mount without
            # noexec (a locked flag), which jobns oci-config does not ask for
            # jobns's state_dir on a tmpfs, as /run is on a systemd node (the image's
            # /run is on the container's overlay: every record write would be fsynced)
            tmpfs={
                "/dev/shm": "rw,nosuid,nodev,exec,size=512m",
                "/run/jobns": "rw,nosuid,nodev,mode=0755,size=64m",
            },
            **self.privileges.kwargs(),
            **(loop_devices() if self.loop else {}),
        )
        container.reload()
        if container.status != "running":
            raise RigError(
                f"start node {hostname}: container is {container.status}:\n"
                f"{container.logs().decode(errors='replace')[-2000:]}"
            )
        return Node(container, hostname)

    def _configure(self) -> None:
        text = toml(self.config)
        for n in self.nodes:
            n.put_file(CONFIG_PATH, text)
            # An internal network drops forwarded traffic (dockerd's iptables rules) but
            # docker 20.10 still gives a default route via the bridge: delete it, so a
            # stray connection fails at once (ENETUNREACH) instead of reaching the host's
            # bridge address. Needs NET_ADMIN; a probe set without it keeps the route.
            r = n.exec(["ip", "route", "del", "default"])
            if r.exit_code != 0 and "No such process" not in r.stderr:
                self.log(f"rig: {n.hostname}: keep the default route: {r.stderr.strip()}")
        # world-writable and sticky like /tmp: unprivileged users make their own job-ID
        self.nodes[0].exec(["install", "-d", "-m", "1777", self.shared_base]).check(
            f"create {self.shared_base} on the shared volume"
        )

    def close(self) -> None:
        """Remove everything of this run (idempotent); signals wait until it is done.

        While removing, SIGINT/SIGTERM/SIGHUP are only recorded (a handler that defers,
        rather than a blocked mask: the mask is per thread, and CPython runs Python
        handlers in the main thread whichever thread the kernel picked). Afterwards the
        handlers from before the rig are back and each deferred signal is re-raised,
        so Ctrl-C still interrupts and SIGTERM still terminates, just after cleanup.
        """
        deferred: list[int] = []
        is_main = threading.current_thread() is threading.main_thread()
        during: dict[int, Any] = {}
        if is_main:
            for sig in (*SIGNALS, signal.SIGINT):
                during[sig] = signal.signal(sig, lambda signum, _f: deferred.append(signum))
        try:
            t0 = time.monotonic()
            if self.client is not None:
                # by label, not by the objects we hold: also catches a container the
                # daemon created while an interrupt kept the SDK from returning it
                sweep(self.client, run_id=self.run_id, log=self.log)
                left = {k: v for k, v in labelled(self.client, self.run_id).items() if v}
                if left:
                    names = {k: [name_of(o) for o in v] for k, v in left.items()}
                    raise RigError(
                        f"remove rig {self.run_id}: still present: {names}; "
                        "`python -m containers.rig sweep --all` removes them"
                    )
            self.nodes.clear()
            self.timings["close"] = time.monotonic() - t0
        finally:
            for signum, current in during.items():
                # the handler from before the rig (ours, `terminated`, is in `current`)
                old = self._old_handlers.get(signum, current)
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
            self._old_handlers.clear()
            for signum in dict.fromkeys(deferred):
                signal.raise_signal(signum)


def _api_error() -> type[Exception]:
    from containers.dockerapi import api_error

    return api_error()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m containers.rig", description="The jobns docker test rig."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="remove leftovers of crashed rig runs")
    s.add_argument(
        "--all", action="store_true", help="also resources of rigs whose owner is still running"
    )
    u = sub.add_parser("up", help="start a rig and keep it until Ctrl-C / SIGTERM")
    u.add_argument("-n", "--nodes", type=int, default=2)
    u.add_argument("--image", help="node image (default: build or reuse the current one)")
    args = ap.parse_args(argv)
    try:
        client = connect()
        if args.cmd == "sweep":
            removed = sweep(client, everything=args.all)
            print("\n".join(removed) if removed else "nothing to sweep")
            return 0
        image = args.image
        if image is None:
            from containers import images

            image = images.build(client).node
        with Rig(image, args.nodes, client=client) as rig:
            for n in rig.nodes:
                print(f"{n.hostname}: docker exec -it {n.container.name} bash")
            print(f"rig {rig.run_id} up in {rig.timings['start']:.1f}s; Ctrl-C removes it")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 130
    except RigError as e:
        print(f"containers.rig: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
