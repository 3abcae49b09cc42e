"""Attacks on disk-backed capacities (issue 20: `[capacity] tmp_backing = "disk"`, an
image per job under scratch_base, loop-mounted), by the ordinary users jobnsalice and
jobnsbob, on real loop devices and real mkfs.

- A size the file system cannot hold (finding 3): the job's choice, never the node's
  failure; it is rounded up to the file system's smallest, and the node cap counts that.
- Another user's lock (finding 5): nothing root waits for lives where a user can open it.
- A reference held across teardown (finding 8): a loop device still attached to a
  finished job's deleted image is never taken for the next job of the same id; it counts
  in the node cap, and gc and status name it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser
from tests.security.conftest import PAUSE, PY, World, mounts, no_crash, refused

pytestmark = pytest.mark.root

MIB = 1024**2
EXT4_MIN = MIB  # launcher.model.capacity.FS_MIN_BYTES
XFS_MIN = 300 * MIB


def disk_config(world: World, extra: str = "", mode: int = 0o700) -> Path:
    """Disk capacities on <sandbox>/scratch (made now, root's, with this mode)."""
    base = world.box.root / "scratch"
    base.mkdir(exist_ok=True)
    base.chmod(mode)
    world.box.write_config(f'[capacity]\ntmp_backing = "disk"\nscratch_base = "{base}"\n' + extra)
    return base


def loops_under(base: Path) -> dict[str, str]:
    """{loopN: backing file} of every loop device backed by a file under base."""
    out = {}
    for name in os.listdir("/sys/block"):
        try:
            back = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
        except OSError:
            continue
        if back.startswith(f"{base}/"):
            out[name] = back
    return out


def wait_no_loops(base: Path) -> None:
    for _ in range(100):  # autoclear and the release process finish asynchronously
        if not loops_under(base):
            return
        time.sleep(0.1)
    raise AssertionError(f"loop devices left: {loops_under(base)}")


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def capacity_bytes(world: World, job: str) -> int:
    st = os.statvfs(world.box.local / f"job-{job}")
    return st.f_blocks * st.f_frsize


def comment(size: str) -> dict[str, str]:
    """The job comment (sbatch --comment): hers to write."""
    return {"SLURM_JOB_COMMENT": f"jobns: tmp capacity={size}"}


# ----------------------------------------------------------------- finding 3: sizes


@pytest.mark.parametrize(
    ("fstype", "size", "expected"),
    [
        ("ext4", "1", EXT4_MIN),
        ("ext4", "4KiB", EXT4_MIN),
        ("ext4", "60KiB", EXT4_MIN),
        ("ext4", "104KiB", EXT4_MIN),
        ("ext4", "1048577", 1048577),  # one byte past a block: not a multiple of it
        ("ext4", "5000001", 5000001),
        ("xfs", "4KiB", XFS_MIN),
        ("xfs", "64MiB", XFS_MIN),
        ("xfs", "314572801", 314572801),
    ],
)
def test_a_disk_capacity_too_small_for_its_file_system_is_rounded_up(
    world: World, fstype: str, size: str, expected: int
) -> None:
    """Attack: alice's job comment asks for a tmp capacity smaller than the file system
    can be made in (`tmp capacity=4KiB`: mkfs.ext4 says "Device size reported to be
    zero", mkfs.xfs below 300 MiB "Filesystem must be larger than 300MB"), or a size
    that is no multiple of a block. Before: exit 125 from the prolog (a drained node).
    Defence: the capacity is rounded up to the file system's smallest (like granularity:
    the job gets at least what it asked); setup succeeds and her /tmp works."""
    base = disk_config(world, f'fs_type = "{fstype}"\n')
    r = world.setup("s3", env=comment(size))
    no_crash(r)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert (base / "jobns-local-s3.img").stat().st_size == expected
    record = json.loads((world.box.state / "jobs" / "s3" / "state.json").read_text())
    assert [t["capacity"] for t in record["trees"] if t["role"] == "local"] == [expected]
    assert 0 < capacity_bytes(world, "s3") <= expected
    r = world.run("s3", "echo data > /tmp/x && cat /tmp/x && echo v > /var/tmp/y", world.alice)
    assert r.returncode == 0 and r.stdout == "data\n", r.stderr
    assert world.teardown("s3").returncode == 0
    wait_no_loops(base)
    world.assert_clean()


@pytest.mark.parametrize(
    ("size", "needle"),
    [
        ("0", "greater than zero"),
        ("8000PiB", "does not fit on this node"),
        ("9000PiB", "capacity"),  # past the largest size a directive may give
        ("1.5", None),  # rounded up to whole bytes, then to the minimum
    ],
)
def test_zero_huge_and_fractional_disk_capacities_fail_only_the_job(
    world: World, size: str, needle: str | None
) -> None:
    """Attack: a capacity of 0, of exabytes, or a fraction of a byte. Defence: each is
    the job's own (refused with the reason, exit 0) or handled; never a node error."""
    base = disk_config(world)
    r = world.setup("s4", env=comment(size))
    no_crash(r)
    assert r.returncode == 0, r.stderr
    if needle is None:
        assert r.stderr == "" and (base / "jobns-local-s4.img").stat().st_size == EXT4_MIN
    else:
        assert needle in r.stderr and "refused the job" in r.stderr, r.stderr
        refused(world.run("s4", "true", world.alice))
        assert sorted(os.listdir(base)) == []
    assert world.teardown("s4").returncode == 0
    wait_no_loops(base)
    world.assert_clean()


def test_the_node_cap_counts_the_rounded_size(world: World) -> None:
    """Two jobs asking 4 KiB of xfs each get 300 MiB each: with 450 MiB left for jobs the
    second does not fit (the cap counts what the image really is, not what was asked)."""
    free = free_bytes(world.box.root)
    base = disk_config(world, f'fs_type = "xfs"\nnode_reserve = {free - 450 * MIB}\n')
    r = world.setup("s5", env=comment("4KiB"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = world.setup("s6", user=world.bob, env=comment("4KiB"))
    assert r.returncode == 0 and "does not fit on this node" in r.stderr, r.stderr
    refused(world.run("s6", "true", world.bob))
    assert sorted(os.listdir(base)) == ["jobns-local-s5.img"]
    for job in ("s5", "s6"):
        assert world.teardown(job).returncode == 0
    wait_no_loops(base)
    world.assert_clean()


DIRS = '[[dirs]]\npath = "/mnt/jobns-x"\nbase = "{base}"\nbacking = "disk"\nsize = "{size}"\n'


@pytest.mark.parametrize(
    ("fstype", "dirs_size", "tmp_max", "needle"),
    [
        ("ext4", "4KiB", "", "smaller than ext4"),
        ("xfs", "64MiB", "", "smaller than xfs"),
        ("xfs", "", "100MiB", "smaller than xfs"),
    ],
)
def test_a_site_size_too_small_for_the_file_system_is_a_config_error(
    world: World, fstype: str, dirs_size: str, tmp_max: str, needle: str
) -> None:
    """A [[dirs]] disk size (or tmp_max) below the file system's smallest is the site's
    mistake: config validation names it (doctor too), before any job runs."""
    base = world.box.root / "xdisk"
    dirs = DIRS.format(base=base, size=dirs_size) if dirs_size else ""
    cap = f'tmp_max = "{tmp_max}"\n' if tmp_max else ""
    world.box.write_config(f'[capacity]\ntmp_backing = "disk"\nfs_type = "{fstype}"\n{cap}{dirs}')
    for args in (["doctor"], ["setup", "--job-id", "s7", "--user", world.alice.name]):
        r = world.box.run(args)
        no_crash(r)
        said = r.stdout + r.stderr  # doctor reports it as a problem: line (stdout)
        assert r.returncode == 125 and needle in said, (args, said)
        assert "read config" in said and "MiB" in said, said


# ------------------------------------------------------------- finding 5: locks


def hold_lock(world: World, user: OsUser, path: Path, kind: str = "-s") -> None:
    """user flock(1)s path (a directory he may open) for ten minutes."""
    ready = world.w / f"locked-{user.name}-{len(world.procs)}"
    world.start(user, ["flock", kind, str(path), "sh", "-c", f"echo ok > {ready}; exec sleep 600"])
    world.wait_file(ready)


@pytest.mark.parametrize("kind", ["-s", "-x"])
def test_another_users_lock_on_the_scratch_base_cannot_hang_setup_or_gc(
    world: World, kind: str
) -> None:
    """Attack: the scratch base is readable (0755, an administrator's usual umask); bob
    runs `flock -s <scratch_base> sleep 600`. Before: every disk-capacity prolog blocked
    in a LOCK_EX on the base, and so did gc. Defence: the node cap's lock is a file in
    root's private state directory; nothing root takes lives where bob can open it."""
    base = disk_config(world, mode=0o755)
    hold_lock(world, world.bob, base, kind)
    r = world.setup("l1", "--directives", "tmp capacity=64MiB", timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert any(t == str(world.box.local / "job-l1") for t, _, _ in mounts())
    r = world.box.run(["gc", "--no-slurm"], timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert world.teardown("l1", timeout=30).returncode == 0
    r = world.box.run(["gc", "--no-slurm"], timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    wait_no_loops(base)
    world.assert_clean()


def test_another_users_lock_on_a_disk_dirs_base_cannot_hang_setup_or_gc(world: World) -> None:
    """The same against a [[dirs]] disk base: it must be searchable by the job users
    (their trees are in it), so any user can open and flock it, however well the site
    set it up."""
    xdisk = world.box.root / "xdisk"
    xdisk.mkdir(mode=0o755)
    target = world.box.root / "mnt" / "data"
    target.mkdir(parents=True)
    world.box.write_config(
        f'[[dirs]]\npath = "{target}"\nbase = "{xdisk}"\nbacking = "disk"\nsize = "16MiB"\n'
    )
    hold_lock(world, world.bob, xdisk, "-x")
    r = world.setup("l2", timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = world.run("l2", f"echo x > {target}/f && cat {target}/f", world.alice)
    assert r.stdout == "x\n", r.stderr
    assert world.box.run(["gc", "--no-slurm"], timeout=30).returncode == 0
    assert world.teardown("l2", timeout=30).returncode == 0
    wait_no_loops(xdisk)
    assert sorted(os.listdir(xdisk)) == []


def test_her_lock_on_her_mounted_capacity_cannot_hang_setup(world: World) -> None:
    """Attack: once her capacity is mounted and handed to her (its root is hers), alice
    takes LOCK_EX on it before setup takes the tree again (`flock -x /local/job-N`).
    Before: setup waited for her lock forever. Defence: root never waits for a lock a
    user can take for longer than a bounded time; then it is her job that fails."""
    base = disk_config(world)
    p = world.start_jobns(
        [
            "setup",
            "--job-id",
            "l3",
            "--user",
            world.alice.name,
            "--directives",
            "tmp capacity=64MiB",
        ],
        env={PAUSE: "mounted"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not _stopped(p.pid):
        assert p.poll() is None and time.monotonic() < deadline, "never reached 'mounted'"
        time.sleep(0.05)
    hold_lock(world, world.alice, world.box.local / "job-l3", "-x")
    os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, (out, err)
    assert "locked" in err and "refused the job" in err, err
    assert world.teardown("l3", timeout=30).returncode == 0
    locker = world.procs[-1]  # her flock keeps an fd of the capacity's root: end it
    os.killpg(locker.pid, signal.SIGKILL)
    locker.wait()
    wait_no_loops(base)
    world.assert_clean()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_doctor_checks_the_scratch_base(world: World) -> None:
    """doctor names a scratch base that another user may write or that belongs to a
    user, and one on a file system that is not local disk (tmpfs here)."""
    base = disk_config(world, mode=0o755)
    r = world.box.run(["doctor"])
    assert f"ok: [capacity] scratch_base {base}: root's" in r.stdout, r.stdout
    base.chmod(0o777)
    r = world.box.run(["doctor"])
    assert f"problem: [capacity] scratch_base {base}" in r.stdout, r.stdout
    assert "chmod go-w" in r.stdout
    base.chmod(0o700)
    os.chown(base, world.bob.uid, world.bob.gid)
    r = world.box.run(["doctor"])
    assert f"problem: [capacity] scratch_base {base} belongs to uid {world.bob.uid}" in r.stdout
    os.chown(base, 0, 0)
    shm = world.box.shm / "scratch"
    shm.mkdir(mode=0o700)
    world.box.write_config(f'[capacity]\ntmp_backing = "disk"\nscratch_base = "{shm}"\n')
    r = world.box.run(["doctor"])
    assert f"problem: [capacity] scratch_base {shm} is on tmpfs" in r.stdout, r.stdout


# ------------------------------------------------- finding 8: a held stale device

HOLDER = r"""
import os, sys
os.chdir(sys.argv[1])
fd = os.open("held", os.O_WRONLY | os.O_CREAT, 0o644)
print("ready", flush=True)
for line in sys.stdin:
    out = []
    try:
        os.write(fd, b"x" * 1048576); os.fsync(fd); out.append("write ok")
    except OSError as e:
        out.append(f"write {e.errno}")
    try:
        os.close(os.open(f"new-{line.strip()}", os.O_WRONLY | os.O_CREAT, 0o644))
        out.append("create ok")
    except OSError as e:
        out.append(f"create {e.errno}")
    print("; ".join(out), flush=True)
"""


class Holder:
    """alice's own host process (not a task of the job) with its cwd and an open file
    in her capacity's /tmp; on each poke it writes through both."""

    def __init__(self, world: World, job: str) -> None:
        self.p = world.start(
            world.alice,
            [PY, "-c", HOLDER, str(world.box.local / f"job-{job}" / "tmp")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.p.stdout is not None
        assert self.p.stdout.readline() == "ready\n"

    def poke(self, tag: str) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(f"{tag}\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self) -> None:
        os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()


def test_a_reference_held_across_teardown_never_reaches_the_next_job_of_that_id(
    world: World,
) -> None:
    """Attack: alice keeps a process of her own with its cwd and a file in her disk
    capacity; teardown and gc run; the same job id is set up again (a requeue).
    Before: /dev/loopN stayed attached to the deleted image and nobody said so; the
    requeued job's teardown took that stale device for its own (it matched on the
    backing file's *path*), detached the new mount as foreign without shutting it down
    and truncated its image while she kept writing into it: the scratch disk grew with
    no image in scratch_base, invisible to the node cap. Defence: a loop device is
    identified by its backing file's identity (LOOP_GET_STATUS64 lo_device/lo_inode);
    a held stale device counts in the node cap for its full size, and gc and status
    name it."""
    alice = world.alice
    free = free_bytes(world.box.root)
    base = disk_config(world, f"node_reserve = {free - 150 * MIB}\n")
    assert world.setup("r8", "--directives", "tmp capacity=64MiB").returncode == 0
    old = Holder(world, "r8")
    assert old.poke("0") == "write ok; create ok"
    r = world.teardown("r8")
    assert r.returncode == 0, r.stderr
    assert old.poke("1").startswith("write 5;")  # EIO: shut down, whatever she holds
    (stale_dev,) = loops_under(base)
    r = world.box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"/dev/{stale_dev}" in r.stdout and "jobns-local-r8.img" in r.stdout, r.stdout
    assert "node cap" in r.stdout, r.stdout
    # status (table, json, prometheus) names it too.
    r = world.box.run(["status"])
    assert f"/dev/{stale_dev}" in r.stdout, r.stdout
    doc = world.status()
    assert [d["device"] for d in doc["stale_disks"]] == [f"/dev/{stale_dev}"], doc
    assert doc["stale_disks"][0]["bytes"] == 64 * MIB
    r = world.box.run(["status", "--format", "prometheus"])
    assert "jobns_stale_disk_capacities 1" in r.stdout, r.stdout
    assert f"jobns_stale_disk_capacity_bytes {64 * MIB}" in r.stdout, r.stdout
    # The node cap counts it: 64 MiB held + 100 MiB asked > 150 MiB.
    r = world.setup("r9", "--directives", "tmp capacity=100MiB", user=world.bob)
    assert r.returncode == 0 and "does not fit on this node" in r.stderr, r.stderr
    assert world.teardown("r9").returncode == 0
    # The requeue: the same job id again; her old process reaches nothing of it.
    r = world.setup("r8", "--directives", "tmp capacity=64MiB")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    image = base / "jobns-local-r8.img"
    r = world.run("r8", "head -c 3000000 /dev/urandom > /tmp/data && sync && ls /tmp", alice)
    assert r.returncode == 0 and r.stdout.split() == ["data", "pmix"], (r.stdout, r.stderr)
    assert old.poke("2").startswith("write 5;")
    r = world.run("r8", "ls /tmp; wc -c < /tmp/data", alice)
    assert r.stdout.split() == ["data", "pmix", "3000000"], r.stdout
    assert image.stat().st_size == 64 * MIB and image.stat().st_blocks * 512 >= 3000000
    r = world.box.run(["status"])
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("r8 ")]
    used = line.split()[5]
    assert used.endswith("MiB") and 2.5 <= float(used[:-3]) < 10, line  # its own device
    # Her second holder, in the new capacity: its teardown shuts *this* one down.
    new = Holder(world, "r8")
    assert new.poke("3") == "write ok; create ok"
    before = free_bytes(world.box.root)
    r = world.teardown("r8")
    assert r.returncode == 0, r.stderr
    assert not image.exists()
    assert new.poke("4").startswith("write 5;"), "the new job's file system was not shut down"
    for _ in range(50):  # the release process truncates the image once teardown exits
        if free_bytes(world.box.root) >= before - MIB:
            break
        time.sleep(0.1)
    assert free_bytes(world.box.root) >= before - MIB  # no space kept by a hidden image
    assert len(loops_under(base)) == 2  # both held, both named
    r = world.box.run(["gc", "--no-slurm"])
    assert r.stdout.count("jobns-local-r8.img") == 2, r.stdout
    old.stop()
    new.stop()
    wait_no_loops(base)
    r = world.box.run(["gc", "--no-slurm"])
    assert r.returncode == 0 and "jobns-local-r8.img" not in r.stdout, r.stdout
    assert world.status()["stale_disks"] == []
    world.assert_clean()
