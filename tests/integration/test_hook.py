"""`jobns hook` and `jobns oci-config` as root, against a stand-in container (no runtime).

The "container" is a process in its own mount namespace (`unshare --mount`), with a
bundle directory holding config.json and a rootfs, exactly what a runtime hands a
createRuntime hook: the init's host pid before pivot_root. The real runtimes are in
tests/e2e/test_oci_runtimes.py; here every input and failure is driven precisely.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import JOBNS, Sandbox, require
from tests.conftest import host_mounts as all_host_mounts

pytestmark = pytest.mark.root


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The sandbox, plus what hooks leave for the test to tear down."""
    require(os.path.exists("/usr/bin/nsenter"), "nsenter (util-linux) missing")
    yield sandbox
    # state.ensure_state_dir bind-mounts the state directory onto itself.
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


class Container:
    """A stand-in container: a bundle and an init in its own mount namespace."""

    def __init__(
        self,
        box: Sandbox,
        cid: str,
        annotations: dict[str, str] | None = None,
        process: dict[str, Any] | None = None,
        dirs: tuple[str, ...] = ("tmp", "var/tmp", "dev/shm", "etc"),
    ) -> None:
        self.box = box
        self.id = cid
        self.bundle = box.root / f"bundle-{cid}"
        self.rootfs = self.bundle / "rootfs"
        for d in dirs:
            (self.rootfs / d).mkdir(parents=True, exist_ok=True)
        self.config: dict[str, Any] = {
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": process
            or {"args": ["sh"], "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}},
            "annotations": annotations if annotations is not None else {},
            "linux": {"namespaces": [{"type": "mount"}]},
        }
        self.write_config()
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> None:
        (self.bundle / "config.json").write_text(json.dumps(self.config))

    def start(self) -> int:
        mine = os.stat("/proc/self/ns/mnt").st_ino
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "sleep", "300"]
        )
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{self.proc.pid}/ns/mnt").st_ino == mine:
            assert time.monotonic() < deadline, "unshare did not enter a mount namespace"
            time.sleep(0.005)
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def state(self, status: str = "creating", **extra: Any) -> bytes:
        doc: dict[str, Any] = {
            "ociVersion": "1.0.2-dev",
            "id": self.id,
            "status": status,
            "bundle": str(self.bundle),
            "annotations": self.config["annotations"],
        }
        if status != "stopped" and self.proc is not None:
            doc["pid"] = self.proc.pid
        doc.update(extra)
        return json.dumps(doc).encode()

    def hook(
        self, stage: str | None = "createRuntime", data: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        if data is None:
            data = self.state("stopped" if stage == "poststop" else "creating")
        cmd = self.box.cmd(["hook", *([stage] if stage else [])])
        r = subprocess.run(
            cmd,
            input=data.decode(errors="surrogateescape"),
            capture_output=True,
            text=True,
            timeout=60,
            env=self.box.env(None, None),
            cwd="/",
        )
        return r

    def inside(self, rel: str) -> os.stat_result:
        """stat of a rootfs path as the container's mount namespace sees it."""
        assert self.proc is not None
        return os.stat(f"/proc/{self.proc.pid}/root{self.rootfs}/{rel}")

    def sh(self, script: str) -> str:
        assert self.proc is not None
        return subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", "sh", "-c", script],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    def finish(self) -> subprocess.CompletedProcess[str]:
        """The container exits; then the runtime runs poststop."""
        self.stop()
        return self.hook("poststop")


@pytest.fixture
def containers(box: Sandbox) -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for c in made:
        c.stop()


def new(box: Sandbox, made: list[Container], cid: str, **kw: Any) -> Container:
    c = Container(box, cid, **kw)
    made.append(c)
    return c


WATCHED = ("/etc", "/tmp", "/var/tmp", "/dev/shm")


def host_mounts(box: Sandbox) -> list[str]:
    """The host's mounts a hook could wrongly touch: on this test's files, or over the
    host's /etc, /tmp, /var/tmp, /dev/shm (other tests may mount elsewhere meanwhile). The
    state directory's bind onto itself (state.ensure_state_dir) is left out."""
    mine = (f"{box.root}/", f"{box.shm}/")
    out = []
    for line in all_host_mounts().splitlines():
        point = line.split()[4]
        if point == str(box.state):
            continue
        if point in WATCHED or f"{point}/".startswith(mine):
            out.append(line)
    return out


def same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def holds_left(box: Sandbox) -> list[str]:
    d = box.state / "holds"
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def lock_files(box: Sandbox) -> list[str]:
    d = box.state / "jobs"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def holders() -> list[int]:
    """Live holder processes (not zombies: an init that does not reap, as on these VMs,
    leaves those around)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except (OSError, ValueError):
            continue
        comm, _, rest = stat.partition("(")[2].rpartition(")")
        if comm == "jobns-holder" and rest.split()[0] != "Z":
            out.append(int(d.name))
    return out


def wait_gone(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path} still there after {timeout}s"
        time.sleep(0.02)


def one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode == 125, (r.returncode, r.stderr)
    assert r.stderr.startswith("jobns: ") and r.stderr.count("\n") == 1, r.stderr
    assert needle in r.stderr, r.stderr
    assert r.stdout == ""


# --- the happy path ------------------------------------------------------------------


def test_binds_inside_the_container_only_and_cleans_up(
    box: Sandbox, containers: list[Container]
) -> None:
    c = new(box, containers, "c1", annotations={"org.jobns.job-id": "H1"})
    c.start()
    mounts_before = host_mounts(box)
    rootfs_tmp_before = os.stat(c.rootfs / "tmp")
    r = c.hook()
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "")
    job = box.local / "job-H1"
    assert same(c.inside("tmp"), os.stat(job / "tmp"))
    assert same(c.inside("var/tmp"), os.stat(job / "var_tmp"))
    assert same(c.inside("dev/shm"), os.stat(box.shm / "job-H1"))
    # The host's namespace is untouched: the binds exist only in the container's.
    assert host_mounts(box) == mounts_before
    assert same(os.stat(c.rootfs / "tmp"), rootfs_tmp_before)
    mountinfo = c.sh("cat /proc/self/mountinfo")
    for target in ("tmp", "var/tmp", "dev/shm"):
        opts = [
            ln.split()[5]
            for ln in mountinfo.splitlines()
            if ln.split()[4] == f"{c.rootfs}/{target}"
        ]
        assert opts and "nosuid" in opts[-1] and "nodev" in opts[-1], (target, opts)
    c.sh(f"echo inside > {c.rootfs}/tmp/f")
    assert (job / "tmp" / "f").read_text() == "inside\n"
    assert (job.stat().st_mode & 0o7777, (job / "tmp").stat().st_mode & 0o7777) == (0o700, 0o1777)
    assert holds_left(box) == ["H1", "H1/c1"]
    r = c.finish()
    assert (r.returncode, r.stderr) == (0, "")
    assert box.leftovers() == []
    assert holds_left(box) == [] and lock_files(box) == []


def test_stage_from_status_and_stdout_never_held(box: Sandbox, containers: list[Container]) -> None:
    """No STAGE argument: the status decides. And the hook returns (its stdout reaches
    EOF) while the holder lives on: runc waits for that EOF."""
    c = new(box, containers, "c2", annotations={"org.jobns.job-id": "H2"})
    c.start()
    t0 = time.monotonic()
    r = c.hook(None, c.state("created"))  # crun's status at createRuntime
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    assert holders(), "no holder process"
    assert same(c.inside("tmp"), os.stat(box.local / "job-H2" / "tmp"))
    c.stop()
    r = c.hook(None, c.state("stopped"))
    assert r.returncode == 0, r.stderr
    assert box.leftovers() == [] and holds_left(box) == []


def test_missing_mount_points_are_made(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "c3", annotations={"org.jobns.job-id": "H3"}, dirs=("dev",))
    c.start()
    r = c.hook()
    assert r.returncode == 0, r.stderr
    for rel, mode in (("tmp", 0o1777), ("var", 0o755), ("var/tmp", 0o1777), ("dev/shm", 0o1777)):
        st = os.lstat(c.rootfs / rel)  # the mount point itself, seen from the host
        assert (st.st_mode & 0o7777, st.st_uid) == (mode, 0), rel
    assert same(c.inside("var/tmp"), os.stat(box.local / "job-H3" / "var_tmp"))
    c.finish()
    assert box.leftovers() == []


def test_repeated_create_call_is_idempotent(box: Sandbox, containers: list[Container]) -> None:
    """prestart and createRuntime both configured: the second call binds nothing new."""
    c = new(box, containers, "c4", annotations={"org.jobns.job-id": "H4"})
    c.start()
    assert c.hook("prestart").returncode == 0
    mountinfo = c.sh("cat /proc/self/mountinfo")
    assert c.hook("createRuntime").returncode == 0
    assert c.sh("cat /proc/self/mountinfo") == mountinfo
    assert len(holders()) == 1
    c.finish()
    assert box.leftovers() == [] and holds_left(box) == []


# --- sharing -------------------------------------------------------------------------


def test_two_containers_of_a_job_share_another_job_does_not(
    box: Sandbox, containers: list[Container]
) -> None:
    a = new(box, containers, "a", annotations={"org.jobns.job-id": "S1"})
    b = new(box, containers, "b", annotations={"org.jobns.job-id": "S1"})
    other = new(box, containers, "o", annotations={"org.jobns.job-id": "S2"})
    for c in (a, b, other):
        c.start()
        assert c.hook().returncode == 0
    a.sh(f"echo from-a > {a.rootfs}/tmp/shared")
    assert b.sh(f"cat {b.rootfs}/tmp/shared") == "from-a\n"
    assert other.sh(f"ls -A {other.rootfs}/tmp") == ""
    # a leaves first: b still uses the tree, so it stays.
    assert a.finish().returncode == 0
    assert b.sh(f"cat {b.rootfs}/tmp/shared") == "from-a\n"
    assert b.finish().returncode == 0
    assert not (box.local / "job-S1").exists()
    assert other.finish().returncode == 0
    assert box.leftovers() == [] and holds_left(box) == []


def test_container_and_bare_jobns_run_share_either_order(
    box: Sandbox, containers: list[Container]
) -> None:
    gate, ready = box.root / "gate", box.root / "ready"
    # 1. The container is there first and outlives the task.
    c = new(box, containers, "r1", annotations={"org.jobns.job-id": "R1"})
    c.start()
    assert c.hook().returncode == 0
    c.sh(f"echo c > {c.rootfs}/tmp/from-container")
    r = box.run(
        [
            "run",
            "--job-id",
            "R1",
            "--",
            "sh",
            "-c",
            "cat /tmp/from-container; echo t > /tmp/from-task",
        ],
        cwd="/",
    )
    assert (r.returncode, r.stdout) == (0, "c\n"), r.stderr
    # The task ended while the container held the tree: it must still be there.
    assert c.sh(f"cat {c.rootfs}/tmp/from-task") == "t\n"
    assert c.finish().returncode == 0
    assert box.leftovers() == []
    # 2. The task is there first and outlives the container.
    task = box.popen(
        [
            "run",
            "--job-id",
            "R2",
            "--",
            "sh",
            "-c",
            f"touch {ready}; while [ ! -e {gate} ]; do sleep 0.02; done; cat /tmp/from-container",
        ],
        stdout=subprocess.PIPE,
        cwd="/",
    )
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    c2 = new(box, containers, "r2", annotations={"org.jobns.job-id": "R2"})
    c2.start()
    assert c2.hook().returncode == 0
    c2.sh(f"echo c2 > {c2.rootfs}/tmp/from-container")
    assert c2.finish().returncode == 0
    assert (box.local / "job-R2" / "tmp" / "from-container").exists()  # the task holds it
    gate.touch()
    out, _ = task.communicate(timeout=30)
    assert (task.returncode, out) == (0, "c2\n")
    assert box.leftovers() == [] and holds_left(box) == []


def test_prolog_job_is_reused_and_left_to_the_epilog(
    box: Sandbox, containers: list[Container]
) -> None:
    r = box.run(["setup", "--job-id", "P1"])
    assert r.returncode == 0, r.stderr
    c = new(box, containers, "p1", annotations={"org.jobns.job-id": "P1"})
    c.start()
    r = c.hook()
    assert r.returncode == 0, r.stderr
    assert same(c.inside("tmp"), os.stat(box.local / "job-P1" / "tmp"))
    assert holds_left(box) == []  # the record owns the trees
    assert c.finish().returncode == 0
    assert (box.local / "job-P1").is_dir()  # the epilog's to remove
    assert box.run(["teardown", "--job-id", "P1"]).returncode == 0
    assert box.leftovers() == []


def as_user(user: Any, env: tuple[str, ...] = ()) -> dict[str, Any]:
    """config.json's process for a container that runs as user (DESIGN.md rule 7: a job's
    directories go only to containers of the job's user)."""
    return {"args": ["sh"], "env": ["PATH=/bin", *env], "user": {"uid": user.uid, "gid": user.gid}}


def test_prolog_job_of_a_user_is_given_to_her_container(
    box: Sandbox, containers: list[Container], users: list[Any]
) -> None:
    alice = users[0]
    assert box.run(["setup", "--job-id", "PU1", "--user", alice.name]).returncode == 0
    # Named or not, by annotation or by Slurm's variables: she is the container's user.
    for cid, ann, env in (
        ("pu1", {}, ()),
        ("pu2", {"org.jobns.user": alice.name}, ()),
        ("pu3", {}, (f"SLURM_JOB_UID={alice.uid}",)),
    ):
        c = new(
            box,
            containers,
            cid,
            annotations={"org.jobns.job-id": "PU1", **ann},
            process=as_user(alice, env),
        )
        c.start()
        r = c.hook()
        assert (r.returncode, r.stderr) == (0, ""), cid
        assert same(c.inside("tmp"), os.stat(box.local / "job-PU1" / "tmp"))
        assert c.finish().returncode == 0
    assert holds_left(box) == []
    assert box.run(["teardown", "--job-id", "PU1"]).returncode == 0
    assert box.leftovers() == []


def test_prolog_job_of_another_user_is_refused(
    box: Sandbox, containers: list[Container], users: list[Any]
) -> None:
    """bob's container naming himself is still not alice's (tests/security has the rest)."""
    alice, bob = users
    assert box.run(["setup", "--job-id", "P2", "--user", alice.name]).returncode == 0
    c = new(
        box,
        containers,
        "p2",
        annotations={"org.jobns.job-id": "P2", "org.jobns.user": bob.name},
        process=as_user(bob),
    )
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(
        c.hook(),
        f"container p2 runs as uid {bob.uid} (process.user, mapped to "
        f"the host), but job P2 belongs to {alice.name} (uid {alice.uid})",
    )
    assert host_mounts(box) == mounts_before and holds_left(box) == []
    assert not same(c.inside("tmp"), os.stat(box.local / "job-P2" / "tmp"))
    assert box.run(["teardown", "--job-id", "P2"]).returncode == 0


def test_root_container_may_use_only_roots_job(
    box: Sandbox, containers: list[Container], users: list[Any]
) -> None:
    """A job owned by root goes to a root container; a user's job does not, named or not."""
    alice = users[0]
    assert box.run(["setup", "--job-id", "RT1"]).returncode == 0
    c = new(box, containers, "rt1", annotations={"org.jobns.job-id": "RT1"})
    c.start()
    assert c.hook().returncode == 0
    assert same(c.inside("tmp"), os.stat(box.local / "job-RT1" / "tmp"))
    assert c.finish().returncode == 0
    assert box.run(["teardown", "--job-id", "RT1"]).returncode == 0
    c = new(
        box,
        containers,
        "rt2",
        annotations={"org.jobns.job-id": "RT2", "org.jobns.user": alice.name},
    )
    c.start()
    one_line_error(
        c.hook(),
        "container rt2 runs as uid 0 (process.user, mapped to the host), "
        f"but annotation org.jobns.user names {alice.name}",
    )
    assert box.leftovers() == [] and holds_left(box) == [] and lock_files(box) == []


class UsernsContainer(Container):
    """A container with a user namespace of its own, whose uid/gid 0 is `host` on the host
    (written into the live init's uid_map/gid_map, as a runtime does)."""

    host: tuple[int, int] = (0, 0)

    def start(self) -> int:
        mine = os.stat("/proc/self/ns/mnt").st_ino
        self.proc = subprocess.Popen(
            ["unshare", "--user", "--mount", "--propagation", "slave", "sleep", "300"]
        )
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{self.proc.pid}/ns/mnt").st_ino == mine:
            assert time.monotonic() < deadline, "unshare did not enter a mount namespace"
            time.sleep(0.005)
        for name, host in (("uid_map", self.host[0]), ("gid_map", self.host[1])):
            Path(f"/proc/{self.proc.pid}/{name}").write_text(f"0 {host} 1\n")
        return self.proc.pid


def test_container_user_is_mapped_through_its_live_user_namespace(
    box: Sandbox, containers: list[Container], users: list[Any]
) -> None:
    """process.user uid 0 in a user namespace whose 0 is alice on the host: her container.
    The live init's maps count, not config.json's (which here claims nothing)."""
    alice = users[0]
    assert box.run(["setup", "--job-id", "UN1", "--user", alice.name]).returncode == 0
    c = UsernsContainer(box, "un1", annotations={"org.jobns.job-id": "UN1"})
    c.host = (alice.uid, alice.gid)
    containers.append(c)
    c.start()
    r = c.hook()
    assert (r.returncode, r.stderr) == (0, "")
    assert same(c.inside("tmp"), os.stat(box.local / "job-UN1" / "tmp"))
    assert c.finish().returncode == 0
    assert box.run(["teardown", "--job-id", "UN1"]).returncode == 0
    # A standalone job of a container whose root is alice: hers, made for her.
    c = UsernsContainer(box, "un2", annotations={"org.jobns.job-id": "UN2"})
    c.host = (alice.uid, alice.gid)
    containers.append(c)
    c.start()
    assert c.hook().returncode == 0
    assert (box.local / "job-UN2").stat().st_uid == alice.uid
    assert c.finish().returncode == 0
    assert box.leftovers() == [] and holds_left(box) == []


def test_killed_holder_poststop_finishes_the_work(
    box: Sandbox, containers: list[Container]
) -> None:
    c = new(box, containers, "k1", annotations={"org.jobns.job-id": "K1"})
    c.start()
    assert c.hook().returncode == 0
    (holder,) = holders()
    os.kill(holder, signal.SIGKILL)
    r = c.finish()
    assert (r.returncode, r.stderr) == (0, "")
    assert box.leftovers() == [] and holds_left(box) == [] and lock_files(box) == []


def test_gc_finishes_holds_whose_holder_and_poststop_are_gone(
    box: Sandbox, containers: list[Container]
) -> None:
    """`jobns gc` (hook.holds.sweep): a killed holder, no poststop."""
    c = new(box, containers, "w1", annotations={"org.jobns.job-id": "W1"})
    c.start()
    assert c.hook().returncode == 0
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert (box.local / "job-W1").is_dir()  # its holder lives: untouched
    (holder,) = holders()
    os.kill(holder, signal.SIGKILL)
    c.stop()
    deadline = time.monotonic() + 10
    while holders():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert box.leftovers() == [] and holds_left(box) == [] and lock_files(box) == []


def test_holder_cleans_up_without_poststop(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "n1", annotations={"org.jobns.job-id": "N1"})
    c.start()
    assert c.hook().returncode == 0
    c.stop()
    wait_gone(box.local / "job-N1")
    wait_gone(box.state / "holds" / "N1")
    assert box.leftovers() == [] and lock_files(box) == []


def test_gc_sees_a_containers_directories_in_use(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "g1", annotations={"org.jobns.job-id": "G1"})
    c.start()
    assert c.hook().returncode == 0
    r = box.run(["gc", "--no-slurm"], cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (box.local / "job-G1" / "tmp").is_dir()
    assert same(c.inside("tmp"), os.stat(box.local / "job-G1" / "tmp"))
    assert c.finish().returncode == 0
    assert box.leftovers() == []


# --- refusals: one clear line, nothing left ------------------------------------------


def nothing_left(box: Sandbox, c: Container, mounts_before: list[str]) -> None:
    assert box.leftovers() == []
    assert holds_left(box) == [] and lock_files(box) == []
    assert host_mounts(box) == mounts_before
    assert holders() == []


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "OCI state on stdin: it is empty"),
        (b"{]", "OCI state on stdin: not JSON"),
        (b'{"ociVersion": "1", "id": "x", "status": "creating", "pid": 1}', "names no bundle"),
        (b'{"ociVersion": "1", "id": "x", "status": 5, "bundle": "/b"}', "'status' must be one of"),
        (
            b'{"ociVersion": "1", "id": "../x", "status": "creating", "bundle": "/b", "pid": 1}',
            "container id '../x' is not a safe path component",
        ),
        (
            b'{"ociVersion": "1", "id": "x", "status": "creating", "bundle": "/b"}',
            "the OCI state has no pid",
        ),
    ],
)
def test_malformed_state(
    box: Sandbox, containers: list[Container], data: bytes, needle: str
) -> None:
    c = new(box, containers, "m")
    mounts_before = host_mounts(box)
    one_line_error(c.hook(None, data), needle)
    nothing_left(box, c, mounts_before)


def test_missing_bundle(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "mb", annotations={"org.jobns.job-id": "MB"})
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(
        c.hook("createRuntime", c.state(bundle=str(box.root / "gone"))),
        f"open bundle {box.root}/gone: No such file or directory",
    )
    nothing_left(box, c, mounts_before)


@pytest.mark.parametrize(
    ("link", "target", "needle"),
    [
        ("tmp", "/etc", "refuse {rootfs}/tmp: it is a symbolic link (to '/etc')"),
        ("var", "/etc", "refuse {rootfs}/var: it is a symbolic link (to '/etc')"),
        ("var/tmp", "../etc", "refuse {rootfs}/var/tmp: it is a symbolic link (to '../etc')"),
        ("dev/shm", "/etc", "refuse {rootfs}/dev/shm: it is a symbolic link (to '/etc')"),
        ("dev", "/etc", "refuse {rootfs}/dev: it is a symbolic link (to '/etc')"),
    ],
)
def test_symlinked_mount_point_is_refused(
    box: Sandbox, containers: list[Container], link: str, target: str, needle: str
) -> None:
    c = new(
        box,
        containers,
        "sl",
        annotations={"org.jobns.job-id": "SL"},
        dirs=("etc", "dev/shm", "var/tmp", "tmp"),
    )
    if link in ("var", "dev"):
        (c.rootfs / link).rename(c.rootfs / f"{link}.real")
    else:
        (c.rootfs / link).rmdir()
    os.symlink(target, c.rootfs / link)
    (c.rootfs / "etc" / "marker").write_text("image")
    etc_before = sorted(os.listdir("/etc"))
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(c.hook(), needle.format(rootfs=c.rootfs))
    nothing_left(box, c, mounts_before)
    # Neither the host's /etc nor the image's was mounted over, in any namespace.
    assert sorted(os.listdir("/etc")) == etc_before
    assert "/etc" not in c.sh("cut -d' ' -f5 /proc/self/mountinfo").split()
    assert (c.rootfs / "etc" / "marker").read_text() == "image"
    assert c.proc is not None
    assert sorted(os.listdir(f"/proc/{c.proc.pid}/root/etc")) == etc_before


def test_rootfs_through_roots_link_is_followed(box: Sandbox, containers: list[Container]) -> None:
    """A site's link (root's, say /home -> /data/home) on the way to the rootfs is
    followed; only a user's is refused (tests/security)."""
    c = new(box, containers, "rl", annotations={"org.jobns.job-id": "RL"})
    c.rootfs.rename(c.bundle / "image")
    os.symlink("image", c.rootfs)  # relative, like the kernel resolves it
    c.start()
    r = c.hook()
    assert (r.returncode, r.stderr) == (0, "")
    assert c.proc is not None
    assert same(
        os.stat(f"/proc/{c.proc.pid}/root{c.bundle}/image/tmp"),
        os.stat(box.local / "job-RL" / "tmp"),
    )
    assert c.finish().returncode == 0
    assert box.leftovers() == []


def test_mount_points_made_are_removed_on_failure(
    box: Sandbox, containers: list[Container]
) -> None:
    """tmp/ and var/ are missing (made), then dev/shm is a file: the hook fails and takes
    back what it made."""
    c = new(box, containers, "rb", annotations={"org.jobns.job-id": "RB"}, dirs=("dev",))
    (c.rootfs / "dev" / "shm").write_text("not a directory")
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(c.hook(), f"refuse {c.rootfs}/dev/shm: it is not a directory")
    assert sorted(os.listdir(c.rootfs)) == ["dev"]
    nothing_left(box, c, mounts_before)


@pytest.mark.parametrize(
    ("annotations", "needle"),
    [
        ({"org.jobns.job-id": "a/b"}, "annotation org.jobns.job-id 'a/b' is not a safe path"),
        (
            {"org.jobns.job-id": "B1", "org.jobns.no-rm-tmpdir": "maybe"},
            "annotation org.jobns.no-rm-tmpdir='maybe': expected 'true' or 'false'",
        ),
        (
            {"org.jobns.job-id": "B2", "org.jobns.shared-tmpdir": "all"},
            "annotation org.jobns.shared-tmpdir='all': expected",
        ),
        (
            {"org.jobns.job-id": "B3", "org.jobns.user": "nobody-jobns-x"},
            "look up user 'nobody-jobns-x' from annotation org.jobns.user: no such user",
        ),
    ],
)
def test_bad_annotation(
    box: Sandbox, containers: list[Container], annotations: dict[str, str], needle: str
) -> None:
    c = new(box, containers, "ba", annotations=annotations)
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(c.hook(), needle)
    nothing_left(box, c, mounts_before)


def test_container_in_the_host_namespace_is_refused(
    box: Sandbox, containers: list[Container]
) -> None:
    c = new(box, containers, "hn", annotations={"org.jobns.job-id": "HN"})
    mounts_before = host_mounts(box)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        one_line_error(
            c.hook(None, c.state(pid=sleeper.pid)), "container hn shares the host's mount namespace"
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    nothing_left(box, c, mounts_before)


def test_late_stage_is_refused(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "ls", annotations={"org.jobns.job-id": "LS"})
    c.start()
    one_line_error(c.hook(None, c.state("running")), "poststart")
    one_line_error(c.hook("poststart"), "too late")


# --- oci-config ----------------------------------------------------------------------


def test_oci_config_prepares_a_bundle(
    box: Sandbox, containers: list[Container], users: list[Any]
) -> None:
    alice = users[0]
    c = new(
        box,
        containers,
        "oc",
        process={
            "args": ["sh"],
            "env": ["PATH=/bin"],
            "user": {"uid": alice.uid, "gid": alice.gid},
        },
    )
    r = box.run(["oci-config", "--job-id", "OC1", str(c.bundle)], cwd="/")
    assert (r.returncode, r.stderr) == (0, "")
    doc = json.loads((c.bundle / "config.json").read_text())
    job = box.local / "job-OC1"
    assert [(m["destination"], m["source"], m["options"]) for m in doc["mounts"]] == [
        ("/tmp", f"{job}/tmp", ["rbind", "nosuid", "nodev"]),
        ("/var/tmp", f"{job}/var_tmp", ["rbind", "nosuid", "nodev"]),
        ("/dev/shm", f"{box.shm}/job-OC1", ["rbind", "nosuid", "nodev"]),
    ]
    env = dict(e.split("=", 1) for e in doc["process"]["env"])
    assert env["TMPDIR"] == "/tmp" and env["JOBNS_JOB_ID"] == "OC1"
    assert env["PMIX_SERVER_TMPDIR"] == "/tmp/pmix" and "PMIX_NSDIR" not in env
    assert doc["annotations"] == {"org.jobns.job-id": "OC1"}
    # One stage: the holder notices the container's exit; no poststop hook.
    assert [h["args"] for h in doc["hooks"]["createRuntime"]] == [
        ["jobns", "hook", "--config", str(box.config), "createRuntime"]
    ]
    assert "poststop" not in doc["hooks"]
    assert doc["hooks"]["createRuntime"][0]["path"] == JOBNS
    # The directories exist now, owned by the container's user.
    assert (job.stat().st_uid, (job / "tmp").stat().st_uid) == (alice.uid, alice.uid)
    again = box.run(["oci-config", "--job-id", "OC1", str(c.bundle)], cwd="/")
    assert again.returncode == 0
    assert json.loads((c.bundle / "config.json").read_text()) == doc
    # The hooks it added work: the runtime's binds are recognised, a hold is taken.
    c.config = doc
    pid = c.start()
    for target, source in (("tmp", job / "tmp"), ("dev/shm", box.shm / "job-OC1")):
        subprocess.run(
            [
                "nsenter",
                "-t",
                str(pid),
                "-m",
                "mount",
                "--rbind",
                str(source),
                str(c.rootfs / target),
            ],
            check=True,
        )
    mountinfo = c.sh("cat /proc/self/mountinfo")
    assert c.hook().returncode == 0
    after = c.sh("cat /proc/self/mountinfo").splitlines()
    ids = {ln.split()[0] for ln in mountinfo.splitlines()}
    assert [ln.split()[4] for ln in after if ln.split()[0] not in ids] == [f"{c.rootfs}/var/tmp"]
    # The runtime's own binds are kept, and get the job's flags whatever the bundle said.
    for target in ("tmp", "dev/shm"):
        (line,) = [ln for ln in after if ln.split()[4] == f"{c.rootfs}/{target}"]
        assert {"nosuid", "nodev"} <= set(line.split()[5].split(",")), line
    assert holds_left(box) == ["OC1", "OC1/oc"]
    assert c.finish().returncode == 0
    assert box.leftovers() == []


def test_oci_config_for_a_prolog_job_adds_no_hooks(
    box: Sandbox, containers: list[Container]
) -> None:
    assert box.run(["setup", "--job-id", "OC2"]).returncode == 0
    c = new(box, containers, "oc2", annotations={"org.jobns.job-id": "OC2"})
    r = box.run(["oci-config", str(c.bundle)], cwd="/")
    assert r.returncode == 0, r.stderr
    doc = json.loads((c.bundle / "config.json").read_text())
    assert "hooks" not in doc
    # Root's own mount point of the verified tree, never the tree's path (SECURITY.md).
    point = Path(doc["mounts"][0]["source"])
    assert point == box.state / "mounts" / "OC2" / "oci" / "0-tmp"
    assert point.stat().st_ino == (box.local / "job-OC2" / "tmp").stat().st_ino
    assert box.run(["teardown", "--job-id", "OC2"]).returncode == 0
    assert not point.exists()


def test_oci_config_dry_run_and_errors(box: Sandbox, containers: list[Container]) -> None:
    c = new(box, containers, "oc3")
    before = (c.bundle / "config.json").read_text()
    r = box.run(["oci-config", "--dry-run", "--job-id", "OC3", str(c.bundle)], cwd="/")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["annotations"] == {"org.jobns.job-id": "OC3"}
    assert (c.bundle / "config.json").read_text() == before
    assert box.leftovers() == []
    r = box.run(["oci-config", str(c.bundle)], cwd="/")
    assert r.returncode == 125 and "no job id" in r.stderr and r.stderr.count("\n") == 1
    r = box.run(["oci-config", "--job-id", "OC3", str(box.root / "nope")], cwd="/")
    assert r.returncode == 125 and "open bundle" in r.stderr
