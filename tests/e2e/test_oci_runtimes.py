"""`jobns hook` under real runtimes: runc and crun with hand-made bundles, Podman with a
hooks.d directory and --rootfs. Root only; the root file system is busybox-static's
/bin/busybox plus applet links (no registry, built once, cached by the binary's hash).

crun refuses to start on these VMs while a cgroup2 hierarchy with controllers is
mounted next to cgroup v1 ("cgroups in hybrid mode not supported"): it runs in a mount
namespace of its own where /sys/fs/cgroup/unified is unmounted (a no-op elsewhere).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import JOBNS, REPO, OsUser, Sandbox, require

pytestmark = [pytest.mark.root, pytest.mark.runtime]

BUSYBOX = Path("/bin/busybox")
CACHE = Path("/var/cache/jobns-tests")
APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "touch",
    "mkdir",
    "stat",
    "grep",
    "sleep",
    "test",
    "id",
    "cut",
    "true",
    "rm",
    "[",
)
PODMAN_CONF = Path("/etc/containers/containers.conf")
GATE_LOOP = "while [ ! -e /tmp/gate ]; do sleep 0.05; done"


def busybox_rootfs() -> Path:
    """A tiny root file system, made once per busybox binary."""
    require(
        BUSYBOX.is_file(),
        "busybox-static is not installed (apt-get install busybox-static; "
        "ci/install-system installs it)",
    )
    digest = hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()[:16]
    image = CACHE / f"rootfs-busybox-{digest}"
    if image.is_dir():
        return image
    tmp = CACHE / f".rootfs-{uuid.uuid4().hex[:8]}"
    for d in ("bin", "tmp", "var/tmp", "dev", "proc", "sys", "etc", "root"):
        (tmp / d).mkdir(parents=True)
    (tmp / "tmp").chmod(0o1777)
    (tmp / "var/tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, tmp / "bin/busybox")
    for applet in APPLETS:
        os.symlink("busybox", tmp / "bin" / applet)
    (tmp / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (tmp / "etc/group").write_text("root:x:0:\n")
    try:
        tmp.rename(image)
    except OSError:  # made concurrently by another session: use that one
        shutil.rmtree(tmp)
    return image


class Rig:
    def __init__(self, box: Sandbox, image: Path) -> None:
        self.box = box
        self.image = image
        self.tag = box.root.name[:8]
        self.runtime_root = box.root / "runtime-root"
        self.hooks_d = box.root / "hooks.d"
        self.hooks_err = box.root / "hooks.err"
        self.podman_names: list[str] = []

    def job(self, n: int) -> str:
        return f"E{self.tag}-{n}"

    def hook_args(self, stage: str) -> list[str]:
        return ["jobns", "hook", "--config", str(self.box.config), stage]

    def bundle(
        self,
        name: str,
        script: str,
        annotations: dict[str, str],
        hooks: dict[str, list[dict[str, Any]]] | None = None,
        user: tuple[int, int] = (0, 0),
    ) -> Path:
        """A bundle made the documented way: `runc spec`, then edited. user: the (uid, gid)
        it runs as (a job's directories go only to containers of the job's user)."""
        b = self.box.root / f"bundle-{name}"
        b.mkdir()
        shutil.copytree(self.image, b / "rootfs", symlinks=True)
        subprocess.run(["runc", "spec"], cwd=b, check=True)
        doc = json.loads((b / "config.json").read_text())
        doc["process"]["terminal"] = False
        doc["process"]["args"] = ["sh", "-c", script]
        doc["process"]["user"] = {"uid": user[0], "gid": user[1]}
        # crun shows a hook's output only in this file (runc: in its own error message).
        doc["annotations"] = {"run.oci.hooks.stderr": str(self.hooks_err), **annotations}
        # One stage (the shipped setup): the holder notices the container's exit.
        doc["hooks"] = (
            hooks
            if hooks is not None
            else {
                "createRuntime": [{"path": JOBNS, "args": self.hook_args("createRuntime")}],
            }
        )
        (b / "config.json").write_text(json.dumps(doc, indent=1))
        return b

    def cmd(self, runtime: str, bundle: Path, cid: str) -> list[str]:
        if runtime == "runc":
            return ["runc", "--root", str(self.runtime_root), "run", "-b", str(bundle), cid]
        return [
            "unshare",
            "--mount",
            "sh",
            "-c",
            'umount /sys/fs/cgroup/unified 2>/dev/null; exec "$@"',
            "sh",
            "crun",
            "--root",
            str(self.runtime_root),
            "run",
            "-b",
            str(bundle),
            cid,
        ]

    def run(self, runtime: str, bundle: Path, cid: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(runtime, bundle, cid),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )

    def start(self, runtime: str, bundle: Path, cid: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.cmd(runtime, bundle, cid),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )

    def write_hooks_d(self) -> Path:
        """The shipped hooks.d files, pointed at this test's config."""
        self.hooks_d.mkdir(exist_ok=True)
        for src in (REPO / "jobns" / "hook" / "hooks.d").glob("*.json"):
            doc = json.loads(src.read_text())
            args = doc["hook"]["args"]
            doc["hook"]["args"] = [*args[:2], "--config", str(self.box.config), *args[2:]]
            (self.hooks_d / src.name).write_text(json.dumps(doc))
        return self.hooks_d

    def podman(
        self, name: str, job: str, script: str, rootfs: Path, extra: tuple[str, ...] = ()
    ) -> list[str]:
        self.podman_names.append(name)
        return [
            "podman",
            "--runtime",
            "runc",
            "--cgroup-manager=cgroupfs",
            "run",
            "--rm",
            "--name",
            name,
            "--network=none",
            "--hooks-dir",
            str(self.write_hooks_d()),
            "--annotation",
            f"org.jobns.job-id={job}",
            *extra,
            "--rootfs",
            str(rootfs),
            "sh",
            "-c",
            script,
        ]

    def rootfs_copy(self, name: str) -> Path:
        dest = self.box.root / f"rootfs-{name}"
        shutil.copytree(self.image, dest, symlinks=True)
        return dest

    def holds_left(self) -> list[str]:
        d = self.box.state / "holds"
        return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []

    def clean(self) -> bool:
        return self.box.leftovers() == [] and self.holds_left() == []


def start(cmd: list[str]) -> subprocess.Popen[str]:
    """A container run in the background, its output captured."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        stdin=subprocess.DEVNULL,
    )


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.02)


def wait_clean(rig: Rig, timeout: float = 30) -> None:
    """The holder removes a standalone job's directories once it sees the container's init
    exit, concurrently with the runtime's return (no poststop hook)."""
    deadline = time.monotonic() + timeout
    while not rig.clean():
        assert time.monotonic() < deadline, (rig.box.leftovers(), rig.holds_left())
        time.sleep(0.05)


@pytest.fixture(scope="session")
def image() -> Path:
    return busybox_rootfs()


@pytest.fixture
def rig(sandbox: Sandbox, image: Path) -> Iterator[Rig]:
    r = Rig(sandbox, image)
    yield r
    if r.runtime_root.exists():
        for runtime in ("runc", "crun"):
            if shutil.which(runtime):
                ids = subprocess.run(
                    [runtime, "--root", str(r.runtime_root), "list", "-q"],
                    capture_output=True,
                    text=True,
                ).stdout.split()
                for cid in ids:
                    subprocess.run(
                        [runtime, "--root", str(r.runtime_root), "delete", "-f", cid],
                        capture_output=True,
                    )
    for name in r.podman_names:
        subprocess.run(["podman", "rm", "-f", "--time", "0", name], capture_output=True)
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True)


def need(runtime: str) -> None:
    require(shutil.which(runtime) is not None, f"{runtime} is not installed (ci/install-system)")
    if runtime == "podman":
        require(
            PODMAN_CONF.is_file() and "default_ulimits" in PODMAN_CONF.read_text(),
            f"{PODMAN_CONF} must set default_ulimits = [] here (ci/install-system)",
        )


# --- runc and crun -------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_private_tmp_is_the_job_directory_and_goes_with_it(rig: Rig, runtime: str) -> None:
    need(runtime)
    job = rig.job(1)
    etc_before = sorted(os.listdir("/etc"))
    b = rig.bundle(
        "one",
        "echo f > /tmp/f; echo g > /var/tmp/g; echo h > /dev/shm/h; "
        "touch /tmp/ready; " + GATE_LOOP + "; "
        "grep -E ' /(tmp|var/tmp|dev/shm) ' /proc/self/mountinfo; ls -A /tmp",
        {"org.jobns.job-id": job},
    )
    p = rig.start(runtime, b, "one")
    tree = rig.box.local / f"job-{job}"
    wait_for(tree / "tmp" / "ready")
    assert (tree / "tmp" / "f").read_text() == "f\n"
    assert (tree / "var_tmp" / "g").read_text() == "g\n"
    assert (rig.box.shm / f"job-{job}" / "h").read_text() == "h\n"
    assert rig.holds_left() == [job, f"{job}/one"]
    (tree / "tmp" / "gate").touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = out.splitlines()
    for target in ("/tmp", "/var/tmp", "/dev/shm"):
        # The last mount at the target is the one the container sees.
        opts = [ln.split()[5] for ln in lines if ln.split()[4:5] == [target]]
        assert opts and "nosuid" in opts[-1] and "nodev" in opts[-1], (target, opts)
    assert lines[-3:] == ["f", "gate", "ready"]
    # No poststop: the holder saw the container's init exit and removed everything.
    wait_clean(rig)
    assert sorted(os.listdir("/etc")) == etc_before


def test_containers_of_a_job_share_and_other_jobs_do_not(rig: Rig) -> None:
    need("runc")
    j1, j2 = rig.job(1), rig.job(2)
    a = rig.bundle("a", "echo from-a > /tmp/a; " + GATE_LOOP, {"org.jobns.job-id": j1})
    b = rig.bundle("b", "cat /tmp/a", {"org.jobns.job-id": j1})
    c = rig.bundle("c", "ls -A /tmp /var/tmp /dev/shm", {"org.jobns.job-id": j2})
    pa = rig.start("runc", a, "a")
    tree = rig.box.local / f"job-{j1}" / "tmp"
    wait_for(tree / "a")
    rb = rig.run("runc", b, "b")
    assert (rb.returncode, rb.stdout) == (0, "from-a\n"), rb.stderr
    assert (tree / "a").exists()  # b ended, but a still holds the tree
    rc = rig.run("runc", c, "c")
    assert rc.returncode == 0, rc.stderr
    assert sorted(rc.stdout.split()) == ["/dev/shm:", "/tmp:", "/var/tmp:"]  # all empty
    (tree / "gate").touch()
    assert pa.wait(timeout=60) == 0
    wait_clean(rig)


def test_bare_jobns_run_task_shares_with_a_container(rig: Rig) -> None:
    need("runc")
    job = rig.job(3)
    b = rig.bundle(
        "t",
        "echo c > /tmp/from-container; " + GATE_LOOP + "; cat /tmp/from-task",
        {"org.jobns.job-id": job},
    )
    p = rig.start("runc", b, "t")
    tree = rig.box.local / f"job-{job}" / "tmp"
    wait_for(tree / "from-container")
    r = rig.box.run(
        [
            "run",
            "--job-id",
            job,
            "--",
            "sh",
            "-c",
            "cat /tmp/from-container; echo t > /tmp/from-task; ls /dev/shm",
        ],
        cwd="/",
    )
    assert (r.returncode, r.stdout) == (0, "c\n"), r.stderr
    assert (tree / "from-task").exists()  # the task ended; the container still holds it
    (tree / "gate").touch()
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (0, "t\n"), err
    wait_clean(rig)


def aborted(r: subprocess.CompletedProcess[str], needle: str, rig: Rig | None = None) -> None:
    assert r.returncode != 0, r
    said = r.stderr
    if rig is not None and rig.hooks_err.exists():
        said += rig.hooks_err.read_text()
    assert f"jobns: {needle}" in said or (needle in said and "jobns: " in said), said
    assert "ran" not in r.stdout  # the container's process never started


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_tmp_symlink_to_etc_aborts_the_container(rig: Rig, runtime: str) -> None:
    need(runtime)
    etc_before = {n: os.lstat(f"/etc/{n}").st_mtime_ns for n in os.listdir("/etc")}
    b = rig.bundle("sl", "echo ran; echo x > /tmp/x", {"org.jobns.job-id": rig.job(4)})
    (b / "rootfs" / "tmp").rmdir()
    os.symlink("/etc", b / "rootfs" / "tmp")
    r = rig.run(runtime, b, "sl")
    aborted(r, f"refuse {b}/rootfs/tmp: it is a symbolic link (to '/etc')", rig)
    assert {n: os.lstat(f"/etc/{n}").st_mtime_ns for n in os.listdir("/etc")} == etc_before
    assert not Path("/etc/x").exists()
    assert rig.clean(), (rig.box.leftovers(), rig.holds_left())


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_bad_annotation_aborts_the_container(rig: Rig, runtime: str) -> None:
    need(runtime)
    b = rig.bundle(
        "ba", "echo ran", {"org.jobns.job-id": rig.job(5), "org.jobns.no-rm-tmpdir": "perhaps"}
    )
    aborted(
        rig.run(runtime, b, "ba"),
        "annotation org.jobns.no-rm-tmpdir='perhaps': expected 'true' or 'false'",
        rig,
    )
    assert rig.clean()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ("s/.*/{ not json/", "read the OCI state on stdin: not JSON"),
        (
            's#"bundle":"[^"]*"#"bundle":"/nonexistent-bundle"#',
            "open bundle /nonexistent-bundle: No such file or directory",
        ),
    ],
)
def test_malformed_state_or_missing_bundle_aborts_the_container(
    rig: Rig, edit: str, needle: str
) -> None:
    """runc's state, spoilt on its way to the hook by a shell in between."""
    need("runc")
    script = f"sed -e '{edit}' | exec {JOBNS} hook --config {rig.box.config} createRuntime"
    hooks = {
        "createRuntime": [{"path": "/bin/sh", "args": ["sh", "-c", script]}],
        "poststop": [{"path": JOBNS, "args": rig.hook_args("poststop")}],
    }
    b = rig.bundle("ms", "echo ran", {"org.jobns.job-id": rig.job(6)}, hooks)
    aborted(rig.run("runc", b, "ms"), needle)
    assert rig.clean()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_prolog_job_goes_only_to_its_users_container(
    rig: Rig, runtime: str, users: list[OsUser]
) -> None:
    """A job set up by a prolog for alice: her container gets its directories; bob's, or a
    root container, with her job id is aborted (DESIGN.md rule 7)."""
    need(runtime)
    alice, bob = users
    job = rig.job(10)
    r = rig.box.run(["setup", "--job-id", job, "--user", alice.name])
    assert r.returncode == 0, r.stderr
    tree = rig.box.local / f"job-{job}"
    try:
        b = rig.bundle(
            "mine",
            "id -u; echo hers > /tmp/f; ls -A /dev/shm /var/tmp",
            {"org.jobns.job-id": job},
            user=(alice.uid, alice.gid),
        )
        ok = rig.run(runtime, b, "mine")
        assert (ok.returncode, ok.stdout.split()) == (
            0,
            [str(alice.uid), "/dev/shm:", "/var/tmp:"],
        ), ok.stderr
        assert (tree / "tmp" / "f").read_text() == "hers\n"
        for name, (uid, gid) in (("bobs", (bob.uid, bob.gid)), ("roots", (0, 0))):
            b = rig.bundle(name, "echo ran; cat /tmp/f", {"org.jobns.job-id": job}, user=(uid, gid))
            aborted(
                rig.run(runtime, b, name),
                f"container {name} runs as uid {uid} (process.user, mapped to the host), "
                f"but job {job} belongs to {alice.name} (uid {alice.uid})",
                rig,
            )
        assert sorted(os.listdir(tree / "tmp")) == ["f"]
    finally:
        assert rig.box.run(["teardown", "--job-id", job]).returncode == 0
    assert rig.clean(), (rig.box.leftovers(), rig.holds_left())


def extra_dirs(rig: Rig) -> tuple[Path, Path, Path]:
    """The sandbox's config with three [[dirs]] entries (docs/admin.md
    "Extra private directories"): mnt/scratch a plain directory (noexec), mnt/data a 16 MiB disk
    image
    (ro), mnt/fast a 4 MiB tmpfs. Their mount points exist on the host; in a container's
    rootfs the hook makes them."""
    box = rig.box
    targets = tuple(box.root / "mnt" / n for n in ("scratch", "data", "fast"))
    entries = []
    for target, backing in zip(targets, ("directory", "disk", "tmpfs"), strict=True):
        base = box.root / f"x{target.name}"
        base.mkdir(mode=0o755)
        target.mkdir(parents=True)
        entries.append(f'[[dirs]]\npath = "{target}"\nbase = "{base}"\nbacking = "{backing}"\n')
    entries[0] += 'options = ["noexec"]\n'
    entries[1] += 'size = "16MiB"\noptions = ["ro"]\n'
    entries[2] += 'size = "4MiB"\n'
    box.write_config("".join(entries))
    scratch, data, fast = targets
    return scratch, data, fast


def mount_options(mountinfo: str, target: Path) -> tuple[list[str], str]:
    """The per-mount options and the fs type of the last mount at target."""
    found = [ln for ln in mountinfo.splitlines() if ln.split()[4:5] == [str(target)]]
    assert found, (target, mountinfo)
    fields = found[-1].split()
    return fields[5].split(","), fields[fields.index("-") + 1]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_extra_private_directories_reach_a_prolog_jobs_container(
    rig: Rig, runtime: str, users: list[OsUser]
) -> None:
    """[[dirs]] in a container of a set-up job: each extra directory is bound at its
    path with its options (noexec, ro) and its backing (a loop-mounted image, a tmpfs),
    missing mount points are made in the rootfs, and one whose path in the image goes
    through a symbolic link (to /etc) is left out with a warning, never followed: the
    container still runs and its /etc is its own."""
    need(runtime)
    alice = users[0]
    scratch, data, fast = extra_dirs(rig)
    job = rig.job(20)
    r = rig.box.run(["setup", "--job-id", job, "--user", alice.name])
    assert r.returncode == 0, r.stderr
    try:
        b = rig.bundle(
            "xd",
            f"cat /proc/self/mountinfo; echo hers > {scratch}/f; touch {data}/x; "
            "echo w=$?; ls /etc",
            {"org.jobns.job-id": job},
            user=(alice.uid, alice.gid),
        )
        # In this image the tmpfs's path goes through a link to /etc.
        inner = b / "rootfs" / str(fast.parent).lstrip("/")
        inner.mkdir(parents=True)
        os.symlink("/etc", inner / fast.name)
        r = rig.run(runtime, b, "xd")
        assert r.returncode == 0, (r.stdout, r.stderr)
        opts, fstype = mount_options(r.stdout, scratch)
        assert {"nosuid", "nodev", "noexec"} <= set(opts), opts
        opts, fstype = mount_options(r.stdout, data)
        assert {"nosuid", "nodev", "ro"} <= set(opts) and fstype == "ext4", (opts, fstype)
        assert not [ln for ln in r.stdout.splitlines() if " /etc " in ln], r.stdout
        assert "w=1" in r.stdout and r.stdout.split()[-2:] == ["group", "passwd"], r.stdout
        assert (rig.box.root / "xscratch" / f"job-{job}" / "f").read_text() == "hers\n"
        assert sorted(os.listdir(b / "rootfs" / "etc")) == ["group", "passwd"]
        if runtime == "crun":  # runc shows a hook's stderr only when the hook fails
            said = rig.hooks_err.read_text()
            assert f"jobns: warning: {fast} skipped in the container" in said, said
    finally:
        assert rig.box.run(["teardown", "--job-id", job]).returncode == 0
    assert rig.clean(), (rig.box.leftovers(), rig.holds_left())
    assert [p for n in ("xscratch", "xdata", "xfast") for p in (rig.box.root / n).iterdir()] == []


def test_oci_config_binds_extra_directories_with_their_options(
    rig: Rig, users: list[OsUser]
) -> None:
    """A bundle prepared by `jobns oci-config` (no hook): runc itself mounts the extra
    directories with rbind,nosuid,nodev and their options; one whose path goes through
    a link in the image is left out of config.json with a warning."""
    need("runc")
    alice = users[0]
    scratch, data, fast = extra_dirs(rig)
    job = rig.job(21)
    assert rig.box.run(["setup", "--job-id", job, "--user", alice.name]).returncode == 0
    try:
        b = rig.bundle(
            "oc",
            f"cat /proc/self/mountinfo; touch {data}/x; echo w=$?; echo hers > {scratch}/f",
            {"org.jobns.job-id": job},
            hooks={},
            user=(alice.uid, alice.gid),
        )
        inner = b / "rootfs" / str(fast.parent).lstrip("/")
        inner.mkdir(parents=True)
        os.symlink("/etc", inner / fast.name)
        r = rig.box.run(["oci-config", str(b)], cwd="/")
        assert r.returncode == 0, r.stderr
        assert f"jobns: warning: {fast} left out of the bundle" in r.stderr, r.stderr
        doc = json.loads((b / "config.json").read_text())
        by_target = {m["destination"]: m.get("options") for m in doc["mounts"]}
        assert str(fast) not in by_target
        assert by_target[str(data)] == ["rbind", "nosuid", "nodev", "ro"]
        r = rig.run("runc", b, "oc")
        assert r.returncode == 0, r.stderr
        opts, fstype = mount_options(r.stdout, data)
        assert {"nosuid", "nodev", "ro"} <= set(opts) and fstype == "ext4", (opts, fstype)
        assert "noexec" in mount_options(r.stdout, scratch)[0]
        assert "w=1" in r.stdout
        assert (rig.box.root / "xscratch" / f"job-{job}" / "f").read_text() == "hers\n"
    finally:
        assert rig.box.run(["teardown", "--job-id", job]).returncode == 0
    assert rig.clean(), (rig.box.leftovers(), rig.holds_left())


# --- Podman --------------------------------------------------------------------------


def test_podman_hooks_d_shares_within_a_job_and_cleans_up(rig: Rig) -> None:
    need("podman")
    need("runc")
    j1, j2 = rig.job(7), rig.job(8)
    rootfs = rig.rootfs_copy("p")
    tree = rig.box.local / f"job-{j1}" / "tmp"
    a = start(
        rig.podman(
            f"jobns-{rig.tag}-a",
            j1,
            "echo from-a > /tmp/a; echo s > /dev/shm/s; " + GATE_LOOP + "; cat /tmp/b",
            rootfs,
        )
    )
    try:
        wait_for(tree / "a", timeout=60)
        assert (rig.box.shm / f"job-{j1}" / "s").read_text() == "s\n"
        b = subprocess.run(
            rig.podman(f"jobns-{rig.tag}-b", j1, "cat /tmp/a; echo b > /tmp/b", rootfs),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
        assert (b.returncode, b.stdout) == (0, "from-a\n"), b.stderr
        c = subprocess.run(
            rig.podman(f"jobns-{rig.tag}-c", j2, "ls -A /tmp; ls -A /dev/shm", rootfs),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
        assert (c.returncode, c.stdout) == (0, ""), c.stderr
        r = rig.box.run(["run", "--job-id", j1, "--", "cat", "/tmp/a"], cwd="/")
        assert (r.returncode, r.stdout) == (0, "from-a\n"), r.stderr
        (tree / "gate").touch()
        out, err = a.communicate(timeout=120)
        assert (a.returncode, out) == (0, "b\n"), err
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    wait_clean(rig)


def test_podman_user_must_be_the_jobs(rig: Rig, users: list[OsUser]) -> None:
    """podman --user of the job's user gets her prolog job's directories; another user's
    or root's container with her job id is aborted."""
    need("podman")
    need("runc")
    alice, bob = users
    job = rig.job(11)
    assert rig.box.run(["setup", "--job-id", job, "--user", alice.name]).returncode == 0
    rootfs = rig.rootfs_copy("pu")
    try:
        r = subprocess.run(
            rig.podman(
                f"jobns-{rig.tag}-u",
                job,
                "id -u; echo hers > /tmp/f",
                rootfs,
                ("--user", f"{alice.uid}:{alice.gid}"),
            ),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
        assert (r.returncode, r.stdout) == (0, f"{alice.uid}\n"), r.stderr
        tree = rig.box.local / f"job-{job}" / "tmp"
        assert (tree / "f").read_text() == "hers\n"
        for name, extra in (("bob", ("--user", f"{bob.uid}:{bob.gid}")), ("root", ())):
            r = subprocess.run(
                rig.podman(f"jobns-{rig.tag}-{name}", job, "echo ran", rootfs, extra),
                capture_output=True,
                text=True,
                timeout=120,
                cwd="/",
                stdin=subprocess.DEVNULL,
            )
            uid = bob.uid if name == "bob" else 0
            aborted(
                r,
                f"runs as uid {uid} (process.user, mapped to the host), but job {job} "
                f"belongs to {alice.name} (uid {alice.uid})",
            )
        assert sorted(os.listdir(tree)) == ["f"]
    finally:
        assert rig.box.run(["teardown", "--job-id", job]).returncode == 0
    wait_clean(rig)


def test_podman_bad_annotation_aborts(rig: Rig) -> None:
    need("podman")
    need("runc")
    rootfs = rig.rootfs_copy("pb")
    r = subprocess.run(
        rig.podman(
            f"jobns-{rig.tag}-x",
            rig.job(9),
            "echo ran",
            rootfs,
            ("--annotation", "org.jobns.shared-tmpdir=everywhere"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        stdin=subprocess.DEVNULL,
    )
    aborted(r, "annotation org.jobns.shared-tmpdir='everywhere': expected")
    wait_clean(rig)


def test_podman_with_an_old_poststop_hooks_d_file_still_cleans_up(rig: Rig) -> None:
    """hooks.d files installed before the hook became one-stage (createRuntime + poststop):
    both stages run, the poststop call finds the hold its holder retired (or retires it),
    and nothing is left."""
    need("podman")
    need("runc")
    job = rig.job(12)
    hooks_d = rig.write_hooks_d()
    old = {
        "version": "1.0.0",
        "hook": {"path": JOBNS, "args": rig.hook_args("poststop")},
        "when": {"annotations": {"^org\\.jobns\\.job-id$": ".*"}},
        "stages": ["poststop"],
    }
    (hooks_d / "jobns-poststop.json").write_text(json.dumps(old))
    rootfs = rig.rootfs_copy("old")
    name = f"jobns-{rig.tag}-old"
    rig.podman_names.append(name)
    cmd = [
        "podman",
        "--runtime",
        "runc",
        "--cgroup-manager=cgroupfs",
        "run",
        "--rm",
        "--name",
        name,
        "--network=none",
        "--hooks-dir",
        str(hooks_d),
        "--annotation",
        f"org.jobns.job-id={job}",
        "--rootfs",
        str(rootfs),
        "sh",
        "-c",
        "echo old > /tmp/o; cat /tmp/o",
    ]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd="/", stdin=subprocess.DEVNULL
    )
    assert (r.returncode, r.stdout) == (0, "old\n"), r.stderr
    wait_clean(rig)
