"""Attacks on how root recognises its own mounts (issue 20, findings 1 and 6).

Finding 1: a FUSE mount's source ("fsname") is a string its user chooses. alice mounts
one over her job's tree root named exactly like jobns's capacity (``jobns-shm-<job>``,
``jobns-local-<job>``, ``/dev/loopN``) and kills its server: a teardown that knows its
mounts by that string keeps hers, fails the epilog (the node drains), and leaves the
capacity alive under it for her to read back later. Defence: jobns knows its mounts by
the identity it got when it mounted them (mount id and device, recorded in the job
record); everything else in or on the tree is hers and is detached first; then the
capacity is emptied / shut down as always, and teardown exits 0.

Finding 6 (sites with user_allow_other): a FUSE mount with allow_root whose server is
stopped answers nothing, so any root lookup that enters it blocks. Defence: teardown
detaches before it opens anything, and no walk of root's (status, metrics, removal, gc)
enters another file system or asks a FUSE server anything.

Every attack runs as the ordinary user jobnsalice with a real FUSE mount (squashfuse).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_disk_capacity import disk_config, loops_under
from tests.security.conftest import MIB, PY, Fuse, World, mounts, no_crash

pytestmark = pytest.mark.root

# Bounds for what must never hang: far above the normal cost, far below the suite's patience.
BOUND = 30.0

# alice's host process with its working directory (and an fd) inside her capacity (she
# cd'ed there before hiding it under her FUSE mount). When `go` appears it reports what it
# can still do there: the bytes the file system holds, and whether it can still write.
HOLDER = r"""
import json, os, sys, time
os.chdir(sys.argv[1])
held = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
go, out = sys.argv[2], sys.argv[3]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.02)
res = {}
try:
    st = os.fstatvfs(held)
    res["used"] = (st.f_blocks - st.f_bfree) * st.f_frsize
except OSError as e:
    res["used"] = -e.errno
try:
    with open("written-after-teardown", "wb") as f:
        f.write(b"x" * 1048576)
        f.flush()
        os.fsync(f.fileno())
    res["write"] = "ok"
except OSError as e:
    res["write"] = e.errno
with open(out + ".tmp", "w") as f:
    f.write(json.dumps(res) + "\n")
os.rename(out + ".tmp", out)
"""


def jobns_mounts(world: World, job: str) -> list[tuple[str, str, str]]:
    """Mounts on the host that are jobns's for this job or lie in the sandbox's bases
    (its state directory's self-bind aside): none may survive teardown."""
    box = world.box
    return [
        m
        for m in mounts()
        if m[0] != str(box.state)
        and (m[0].startswith((f"{box.root}/", f"{box.shm}")) or m[2].endswith(f"-{job}"))
    ]


def wait_no_loops(base: Path) -> list[str]:
    for _ in range(100):  # autoclear and the release process finish asynchronously
        if not loops_under(base):
            break
        time.sleep(0.05)
    return loops_under(base)


class Kind:
    """One way of giving a job its tree: (directives, which tree alice hides, the name
    jobns's mount of it would have in mountinfo)."""

    def __init__(self, name: str, directives: str, role: str) -> None:
        self.name, self.directives, self.role = name, directives, role

    def tree(self, world: World, job: str) -> Path:
        base = world.box.shm if self.role == "shm" else world.box.local
        return base / f"job-{job}"

    def inside(self, world: World, job: str) -> Path:
        """Where alice's data lives in the capacity (and her holder's cwd)."""
        return self.tree(world, job) / ("tmp" if self.role == "local" else "")

    def fsname(self, world: World, job: str) -> str:
        if self.name == "disk":
            (loop,) = loops_under(world.box.root / "scratch")  # "loopN <backing file>"
            return f"/dev/{loop.split()[0]}"  # the ext4 mount's source in mountinfo
        return f"jobns-{self.role}-{job}"


KINDS = {
    "tmpfs": Kind("tmpfs", "shm capacity=64MiB", "shm"),
    "none": Kind("none", "", "local"),
    "disk": Kind("disk", "tmp capacity=64MiB", "local"),
}


def set_up(world: World, kind: Kind, job: str) -> None:
    if kind.name == "disk":
        disk_config(world.box)
    extra = ["--directives", kind.directives] if kind.directives else []
    r = world.setup(job, *extra)
    assert r.returncode == 0 and "refused" not in r.stderr, r.stderr
    # Her data, 48 MiB of it: what a capacity that survives teardown would keep for her.
    where = "/dev/shm" if kind.role == "shm" else "/tmp"
    r = world.run(
        job,
        f"echo secret > {where}/secret && dd if=/dev/zero of={where}/fill bs=1M count=48 "
        "status=none",
        user=world.alice,
    )
    assert r.returncode == 0, r.stderr


def start_holder(world: World, where: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    go, out = world.w / "go", world.w / "holder.json"
    p = world.start(
        world.alice, [PY, "-c", HOLDER, str(where), str(go), str(out)], stdout=subprocess.PIPE
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p, go, out


def hide_under_fuse(
    world: World, fuse: Fuse, kind: Kind, job: str, *options: str
) -> subprocess.Popen[str]:
    """alice's FUSE mount over her tree root, named like jobns's own mount of it."""
    tree = kind.tree(world, job)
    fsname = kind.fsname(world, job)
    ours = [m for m in mounts() if m[0] == str(tree)]
    if kind.name != "none":
        assert [m[2] for m in ours] == [fsname], ours  # exactly jobns's mount's name
    server = fuse.mount(world.alice, tree, f"fsname={fsname}", *options)
    top = [m for m in mounts() if m[0] == str(tree)][-1]
    assert top[1].startswith("fuse") and top[2] == fsname, top  # the disguise holds
    return server


def hidden_and_killed(world: World, fuse: Fuse, kind: Kind, job: str) -> None:
    """alice's disguised FUSE mount over her tree root, its server killed (the mount
    stays: every access to it fails, ENOTCONN)."""
    server = hide_under_fuse(world, fuse, kind, job)
    os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=10)


def torn_down(world: World, job: str) -> None:
    r = world.teardown(job, timeout=BOUND + 30)
    no_crash(r)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert_released(world, job)


def top_mount(path: Path) -> dict[str, object]:
    """The topmost mount on path: its id, device and type (for the record's identity)."""
    found: dict[str, object] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if fields[4] == str(path):
                major, minor = fields[2].split(":")
                found = {
                    "id": int(fields[0]),
                    "dev": os.makedev(int(major), int(minor)),
                    "fstype": right.split()[0],
                }
    return found


def assert_released(world: World, job: str) -> None:
    assert jobns_mounts(world, job) == []
    assert world.jobs_left() == [], "the job's record was kept (teardown-fail?)"
    assert world.box.leftovers() == []


@pytest.mark.parametrize("kind", list(KINDS))
def test_fuse_named_like_jobns_mount_over_the_tree_root_is_detached(
    world: World, fuse: Fuse, kind: str
) -> None:
    """Attack (finding 1): alice hides her job's tree root (its 64 MiB shm capacity, a
    plain tree, or a disk capacity) under a FUSE mount whose fsname is what jobns calls
    its own mount there, from the host, keeps a process with its cwd inside, then kills
    the server. Defence: teardown exits 0, detaches her mount, releases the capacity (the
    tmpfs she still reaches is empty; the disk one is shut down: no more writes), and
    nothing of the job stays mounted or recorded."""
    k = KINDS[kind]
    job = f"mi{kind}"
    set_up(world, k, job)
    capacity = top_mount(k.tree(world, job)) if k.name != "none" else {}
    record = json.loads((world.box.state / "jobs" / job / "state.json").read_text())
    holding = k.name != "none"
    if holding:
        holder, go, out = start_holder(world, k.inside(world, job))
    hidden_and_killed(world, fuse, k, job)
    torn_down(world, job)
    # What setup recorded as its own is the capacity's identity, never a source name.
    assert [t.get("mount") for t in record["trees"] if t["capacity"]] == (
        [capacity] if capacity else []
    )
    if holding:
        go.touch()
        held = json.loads(world.wait_file(out))
        holder.wait(timeout=10)  # its cwd no longer holds the file system
        if k.name == "tmpfs":
            assert 0 <= held["used"] < MIB, f"the capacity still holds {held['used']} bytes"
        assert held["write"] != "ok", "she still writes into the capacity after teardown"
    if k.name == "disk":
        base = world.box.root / "scratch"
        assert sorted(os.listdir(base)) == [], "the image is still there"
        assert wait_no_loops(base) == []


@pytest.mark.parametrize("kind", ["tmpfs", "disk"])
def test_record_of_the_previous_version_still_tears_down_safely(
    world: World, fuse: Fuse, kind: str
) -> None:
    """Attack (finding 1, against a job set up by the previous version, whose record has
    no mount identity): the same disguised FUSE mount over the capacity. Defence: with no
    recorded identity only a mount of the type jobns makes (a tmpfs, or an ext4/xfs on a
    loop device backed by the recorded image) can be jobns's; her FUSE mount is detached,
    the capacity released, teardown exits 0."""
    k = KINDS[kind]
    job = f"mo{kind}"
    set_up(world, k, job)
    record = world.box.state / "jobs" / job / "state.json"
    doc = json.loads(record.read_text())
    for t in doc["trees"]:
        t.pop("mount", None)
    record.write_text(json.dumps(doc))
    hidden_and_killed(world, fuse, k, job)
    torn_down(world, job)
    if k.name == "disk":
        assert wait_no_loops(world.box.root / "scratch") == []


def test_gc_releases_a_dead_jobs_capacity_under_her_mount(world: World, fuse: Fuse) -> None:
    """Attack (finding 1, through gc): the epilog of alice's job died in its teardown
    state (killed), with her disguised FUSE mount over the shm capacity. Defence: `jobns
    gc` finishes the teardown: her mount detached, the capacity released, exit 0; it never
    forgets a record while the capacity it names is still mounted."""
    k = KINDS["tmpfs"]
    job = "migc"
    set_up(world, k, job)
    hidden_and_killed(world, fuse, k, job)
    p = world.start_jobns(
        ["teardown", "--job-id", job],
        env={"JOBNS_TEST_PAUSE_IN": "teardown"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + BOUND
    while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert p.poll() is None, "teardown ended before its teardown state"
        assert time.monotonic() < deadline, "teardown did not reach its teardown state"
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    r = world.box.run(["gc", "--no-slurm"], timeout=BOUND + 30)
    no_crash(r)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert_released(world, job)


@pytest.mark.parametrize("kind", ["tmpfs", "none"])
def test_stalled_fuse_on_the_tree_root_cannot_hang_teardown(
    world: World, fuse_allow_other: Fuse, kind: str
) -> None:
    """Attack (finding 6, user_allow_other): alice mounts FUSE with allow_root over her
    job's tree root (named like jobns's mount) and stops its server (SIGSTOP): every root
    lookup into it now blocks. Defence: status, metrics and teardown each finish within
    bounded time; teardown exits 0 and leaves nothing of the job."""
    k = KINDS[kind]
    job = f"ms{kind}"
    set_up(world, k, job)
    server = hide_under_fuse(world, fuse_allow_other, k, job, "allow_root")
    os.kill(server.pid, signal.SIGSTOP)
    try:
        for args in (["status", "--format", "prometheus"], ["status"]):
            try:
                r = world.box.run(args, timeout=BOUND)
            except subprocess.TimeoutExpired:
                pytest.fail(f"jobns {' '.join(args)} hung on her stopped FUSE server")
            no_crash(r)
            assert r.returncode == 0, r.stderr
        try:
            r = world.teardown(job, timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail("jobns teardown hung on her stopped FUSE server")
        no_crash(r)
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert_released(world, job)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()


# A long chain of directories, each with many files: a walk of it takes seconds, and
# reaches the bottom of the chain last, whatever order it lists directories in.
CHAIN = r"""
import os, sys
os.chdir(sys.argv[1])
for _ in range(int(sys.argv[2])):
    os.mkdir("c")
    os.chdir("c")
    for i in range(int(sys.argv[3])):
        os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600))
os.mkdir("m")
print(os.getcwd() + "/m")
"""


def fds_into(pid: int, top: Path) -> bool:
    """Does process pid hold an fd on something under top (is it walking there)?"""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for n in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{n}").startswith(f"{top}/"):
                return True
        except OSError:
            pass
    return False


def test_stalled_fuse_mounted_while_status_walks_the_tree(
    world: World, fuse_allow_other: Fuse
) -> None:
    """Attack (finding 6, user_allow_other): while `jobns status --format prometheus`
    walks her large tree to count its bytes (after it has read the mount table), alice
    mounts FUSE with allow_root at the bottom of it and stops the server. Defence: the
    walk never enters another file system nor asks a FUSE server anything: status returns
    in bounded time."""
    box, alice = world.box, world.alice
    job = "mwalk"
    r = world.setup(job)
    assert r.returncode == 0, r.stderr
    shm = box.shm / f"job-{job}"  # tmpfs: the 120 000 files are made in seconds
    r = world.as_user(alice, [PY, "-c", CHAIN, str(shm), "300", "400"], timeout=300)
    assert r.returncode == 0, r.stderr
    mountpoint = Path(r.stdout.strip())
    status = world.start_jobns(
        ["status", "--format", "prometheus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + BOUND
    while not fds_into(status.pid, shm):
        assert status.poll() is None, "status ended before it walked the tree: make it larger"
        assert time.monotonic() < deadline, "status never walked the tree"
        time.sleep(0.001)
    server = fuse_allow_other.mount(alice, mountpoint, "allow_root")
    os.kill(server.pid, signal.SIGSTOP)
    try:
        try:
            out, err = status.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail("jobns status hung on a stopped FUSE server mounted during its walk")
        assert status.returncode == 0, err
        assert "Traceback" not in err and "internal error" not in err, err
        assert 'jobns_jobs{state="running"} 1' in out, out
        try:
            r = world.teardown(job, timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail("jobns teardown hung on her stopped FUSE server")
        assert r.returncode == 0, r.stderr
        assert_released(world, job)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
