"""Attacks on `jobns teardown` (the epilog): whatever alice leaves in or around her job,
teardown exits 0 in bounded time, ends every process of the job, frees its memory and
space, never follows a link, never unmounts anything of the host, and leaves nothing
(DESIGN rules 2 and 6; contract points 3d, 3e and 5)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import job_mounts
from tests.security.conftest import (
    MIB,
    PY,
    Fuse,
    World,
    alive,
    mounts,
    no_crash,
    shmem_bytes,
    snapshot,
)

pytestmark = pytest.mark.root


def outside_mounts(world: World) -> list[tuple[str, str, str]]:
    """The host's mounts that are none of this test's (they must all survive)."""
    box = world.box
    return sorted(m for m in mounts() if not m[0].startswith((str(box.root), str(box.shm))))


def fuse_mounts(world: World) -> list[str]:
    box = world.box
    return [
        t
        for t, fstype, _ in mounts()
        if fstype.startswith("fuse") and t.startswith((str(box.root), str(box.shm)))
    ]


def timed_teardown(
    world: World, job: str, limit: float = 60, released: bool = False
) -> subprocess.CompletedProcess[str]:
    """The epilog, in bounded time; released: then wait for its release process too (the
    trees it renamed out of the job's way are removed after the epilog returns), for the
    tests that look at what the removal did."""
    t0 = time.monotonic()
    r = world.teardown(job, timeout=limit + 30, released=False)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, (r.returncode, r.stderr)
    no_crash(r)
    assert elapsed < limit, f"teardown took {elapsed:.1f} s"
    if released:
        world.box.wait_released(timeout=limit)
    return r


# ------------------------------------------------------------------- contract 3d


FUSE_PLACES = {
    "deep": "{local}/tmp/a/b/mnt",
    "tree-root": "{shm}",
    "var_tmp": "{local}/var_tmp",
    "weird-name": "{local}/tmp/sp ace\\040tab\there\nnewline",
    "stalled-server": "{local}/tmp/stalled",
}


@pytest.mark.parametrize("where", list(FUSE_PLACES))
def test_fuse_mount_in_her_tree_is_detached_at_teardown(
    world: World, fuse: Fuse, where: str
) -> None:
    """Attack: alice FUSE-mounts a file system inside her job's tree from the host (deep
    inside, on a tree root, on var_tmp, at a name mountinfo must escape, or with its
    server stopped); root may not even look into it. Defence: teardown exits 0 in
    bounded time, detaches the mount, removes the tree, and unmounts nothing else."""
    box, alice = world.box, world.alice
    assert world.setup("60").returncode == 0
    mp = Path(FUSE_PLACES[where].format(local=box.local / "job-60", shm=box.shm / "job-60"))
    if not mp.exists():
        assert world.as_user(alice, ["mkdir", "-p", str(mp)]).returncode == 0
    outside = outside_mounts(world)
    server = fuse.mount(alice, mp)
    if where == "stalled-server":
        os.kill(server.pid, signal.SIGSTOP)
    timed_teardown(world, "60")
    assert fuse_mounts(world) == []
    assert outside_mounts(world) == outside
    world.assert_clean()


def test_symlink_to_a_host_mount_point_in_her_tree_is_never_unmounted(
    world: World, fuse: Fuse
) -> None:
    """Attack: next to a FUSE mount of hers (so teardown must detach mounts in the tree),
    alice plants symlinks in her tree to a host mount point (a stand-in for an NFS or
    /dev/shm mount) and to its parent. Defence: teardown detaches only what is mounted
    inside her tree; the host's mount and its files survive."""
    box, alice = world.box, world.alice
    host_mnt = box.root / "hostmnt"
    host_mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "jobns-sec-host", str(host_mnt)], check=True)
    (host_mnt / "precious").write_text("host data\n")
    assert world.setup("61").returncode == 0
    tmp = box.local / "job-61/tmp"
    r = world.as_user(
        alice,
        [
            "sh",
            "-c",
            f"mkdir {tmp}/m && ln -s {host_mnt} {tmp}/link && "
            f"ln -s {box.root} {tmp}/up && ln -s {host_mnt} "
            f"{box.shm}/job-61/link",
        ],
    )
    assert r.returncode == 0, r.stderr
    fuse.mount(alice, tmp / "m")
    outside = outside_mounts(world)
    timed_teardown(world, "61", released=True)
    assert any(t == str(host_mnt) for t, _, _ in mounts()), "the host's mount was unmounted"
    assert (host_mnt / "precious").read_text() == "host data\n"
    assert outside_mounts(world) == outside
    subprocess.run(["umount", str(host_mnt)], check=True)
    world.assert_clean()


def test_teardown_of_job_7_never_touches_job_77s_mounts(world: World) -> None:
    """Attack: bob's job 77's trees share a path prefix with alice's job 7 (job-7 is a
    prefix of job-77); a teardown that detaches "mounts under job-7" by string prefix
    would unmount bob's capacity file systems. Defence: teardown of 7 leaves job 77's
    mounts and files alone."""
    caps = "shm capacity=4MiB; tmp capacity=4MiB"
    assert world.setup("7", "--directives", caps).returncode == 0
    assert world.setup("77", "--directives", caps, user=world.bob).returncode == 0
    r = world.run("77", "echo keep > /dev/shm/k; echo keep > /tmp/k", user=world.bob)
    assert r.returncode == 0, r.stderr
    before = sorted(m for m in mounts() if "job-77" in m[0])
    assert len(before) == 2
    timed_teardown(world, "7")
    assert sorted(m for m in mounts() if "job-77" in m[0]) == before
    r = world.run("77", "cat /dev/shm/k /tmp/k", user=world.bob)
    assert r.returncode == 0 and r.stdout == "keep\nkeep\n", (r.stdout, r.stderr)
    timed_teardown(world, "77")
    world.assert_clean()


# ------------------------------------------------------------------- contract 3e


WRITER = r"""
import os, sys, time
os.chdir(sys.argv[1])
stop = sys.argv[2]
end = time.monotonic() + 300
i = 0
while not os.path.exists(stop) and time.monotonic() < end:
    try:
        os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600))
        os.mkdir(f"d{i}")
        os.close(os.open(f"d{i}/g", os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError:
        pass
    time.sleep(0.001)
    i += 1
"""


@pytest.mark.parametrize("tree", ["local", "shm"])
def test_host_writer_in_her_tree_cannot_block_teardown(world: World, tree: str) -> None:
    """Attack: a plain host process of alice's (no jobns) sits in her job's tree and keeps
    creating files and directories during teardown. Defence: teardown exits 0 in bounded
    time; once the writer is gone, `jobns gc --no-slurm` removes what is left (at most a
    root-owned job-N~removing-* entry)."""
    box, alice = world.box, world.alice
    assert world.setup("62").returncode == 0
    where = box.local / "job-62/tmp" if tree == "local" else box.shm / "job-62"
    stop = world.w / "stop"
    writer = world.start(alice, [PY, "-c", WRITER, str(where), str(stop)])
    time.sleep(0.5)
    timed_teardown(world, "62", limit=90)
    stop.touch()
    writer.wait(timeout=30)
    left = box.leftovers()
    for p in map(Path, left):
        assert p.name.startswith("job-62~removing-"), left
        assert p.lstat().st_uid == 0, f"{p} is not root's"
    r = box.run(["gc", "--no-slurm"])
    no_crash(r)
    assert r.returncode == 0, r.stdout + r.stderr
    world.assert_clean()


# ------------------------------------------------------------- contract 5 (memory)


HOLD_NS = r"""
import os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
print(fd, flush=True)
time.sleep(600)
"""

LIST_IN_NS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY)
if libc.setns(fd, 0x00020000) != 0:
    print("setns failed", ctypes.get_errno()); sys.exit(0)
try:
    print(" ".join(sorted(os.listdir("/dev/shm"))))
except OSError as e:
    print("listdir failed", e.errno)
"""


def test_held_namespace_reference_cannot_keep_capacity_memory(world: World) -> None:
    """Attack: alice holds a reference to her job's mount namespace (an open fd on her
    pin, or on /proc/PID/ns/mnt of her task) in a long-running host process, while her
    200 MiB /dev/shm capacity is filled; the namespace, its tmpfs and the memory would
    outlive the job. Defence: teardown exits 0 and empties the tmpfs before detaching:
    Shmem drops by at least 150 MiB and the held namespace's /dev/shm is empty."""
    box, alice = world.box, world.alice
    assert world.setup("63", "--directives", "shm capacity=200MiB").returncode == 0
    _, pid = world.task("63", alice)
    pin = box.state / "jobs/63/ns/mnt"
    probe = world.python(
        alice, "import os,sys; os.close(os.open(sys.argv[1], os.O_RDONLY))", str(pin)
    )
    target = str(pin) if probe.returncode == 0 else f"/proc/{pid}/ns/mnt"
    holder = world.start(alice, [PY, "-c", HOLD_NS, target], stdout=subprocess.PIPE)
    assert holder.stdout is not None
    held_fd = int(holder.stdout.readline())
    r = world.run("63", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=190 2>&1", user=alice)
    assert r.returncode == 0, r.stdout + r.stderr
    before = shmem_bytes()
    timed_teardown(world, "63")
    after = shmem_bytes()
    assert before - after >= 150 * MIB, f"Shmem only dropped by {(before - after) // MIB} MiB"
    r = subprocess.run(
        [PY, "-c", LIST_IN_NS, f"/proc/{holder.pid}/fd/{held_fd}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "fill" not in r.stdout.split(), r.stdout
    world.assert_clean()


# ------------------------------------------------------------- links and trees


def test_symlinks_in_her_tree_to_root_dirs_and_files_are_only_unlinked(world: World) -> None:
    """Attack: alice plants symlinks in her tree to a root-owned directory (a stand-in for
    /etc, so a regression cannot wreck the test machine) and its files, a loop, a link to
    /, and replaces her host var_tmp directory with a link to the root directory.
    Defence: teardown unlinks the links and never touches what they point to."""
    box, alice = world.box, world.alice
    decoy = world.decoy()
    before = snapshot(decoy)
    assert world.setup("64").returncode == 0
    r = world.run(
        "64",
        f"ln -s {decoy} /tmp/etc; ln -s {decoy}/passwd /tmp/passwd; "
        f"ln -s {decoy}/sub /dev/shm/sub; ln -s / /tmp/root; "
        "ln -s /tmp/loop /tmp/loop; mkdir /var/tmp/d; ln -s /var/tmp /var/tmp/d/up",
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    local = box.local / "job-64"
    r = world.as_user(
        alice,
        ["sh", "-c", f"mv {local}/var_tmp {local}/var_tmp.old && ln -s {decoy} {local}/var_tmp"],
    )
    assert r.returncode == 0, r.stderr
    timed_teardown(world, "64", released=True)
    assert snapshot(decoy) == before
    world.assert_clean()


def test_tree_roots_swapped_for_symlinks_before_teardown(world: World) -> None:
    """Attack: from the host alice renames her job's tree roots away and puts symlinks to a
    root-owned directory in their place. Defence: teardown unlinks the links and follows
    nothing; what remains is only her own renamed directories (never chowned to root)."""
    box, alice = world.box, world.alice
    decoy = world.decoy()
    before = snapshot(decoy)
    assert world.setup("65").returncode == 0
    assert world.run("65", "echo x > /tmp/x; echo y > /dev/shm/y", user=alice).returncode == 0
    moved = []
    for base in (box.local, box.shm):
        r = world.as_user(
            alice, ["sh", "-c", f"mv {base}/job-65 {base}/alices-65 && ln -s {decoy} {base}/job-65"]
        )
        assert r.returncode == 0, r.stderr
        moved.append(base / "alices-65")
    timed_teardown(world, "65", released=True)
    assert snapshot(decoy) == before
    for p in moved:
        if p.exists():
            assert p.lstat().st_uid == alice.uid
    world.assert_clean(keep=[p for p in moved if p.exists()])


def test_per_node_job_dir_swapped_for_a_symlink_before_teardown(world: World) -> None:
    """Attack: in the per-node layout alice renames her <shared_base>/job-N (the node's
    tree is inside it) away and puts a symlink to a root-owned directory in its place,
    before the epilog. Teardown then cannot reach the node's tree without following her
    link. Defence: teardown follows nothing and exits 0 (her doing fails her job's
    files, never the node: it used to exit 125, teardown-fail, draining the node); what
    is left is hers: her renamed directory and her link."""
    box, alice = world.box, world.alice
    decoy = world.decoy()
    before = snapshot(decoy)
    assert world.setup("79", "--use-shared-tmpdir=per-node").returncode == 0
    assert world.run("79", "echo x > /tmp/x", user=alice).returncode == 0
    top, moved = box.shared / "job-79", box.shared / "alices-79"
    r = world.as_user(alice, ["sh", "-c", f"mv {top} {moved} && ln -s {decoy} {top}"])
    assert r.returncode == 0, r.stderr
    timed_teardown(world, "79", released=True)
    assert snapshot(decoy) == before
    for root, dirs, names in os.walk(moved):
        for n in [*dirs, *names]:
            assert os.lstat(Path(root) / n).st_uid == alice.uid, f"{root}/{n} is not hers"
    world.assert_clean(keep=[moved, top])


def test_hard_links_to_root_owned_files_are_only_unlinked(world: World) -> None:
    """Attack: alice hard-links a root-owned world-writable file into her tree (allowed
    under fs.protected_hardlinks), and a root-owned read-only file is linked there too (a
    stand-in for a link made where protected_hardlinks is off). Defence: teardown unlinks
    her links only: both root files keep their content, owner, mode and sole link."""
    box, alice = world.box, world.alice
    shared_log = world.w / "root-rw"
    shared_log.write_text("root's log\n")
    shared_log.chmod(0o666)
    private = box.root / "root-ro"
    private.write_text("root only\n")
    private.chmod(0o644)
    assert world.setup("66").returncode == 0
    tmp = box.local / "job-66/tmp"  # from the host: a link cannot cross the job's binds
    r = world.as_user(
        alice,
        [
            "sh",
            "-c",
            f"ln {shared_log} {tmp}/hl && mkdir {tmp}/sub && "
            f"ln {shared_log} {tmp}/sub/hl2 && chmod 000 {tmp}/sub",
        ],
    )
    assert r.returncode == 0, r.stderr
    os.link(private, box.local / "job-66/var_tmp/hl3")
    timed_teardown(world, "66", released=True)
    for f, mode, text in ((shared_log, 0o666, "root's log\n"), (private, 0o644, "root only\n")):
        st = f.lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_nlink) == (0, mode, 1)
        assert f.read_text() == text
    world.assert_clean()


DEEP = r"""
import os, sys
os.chdir(sys.argv[1])
for _ in range(int(sys.argv[2])):
    os.mkdir("d")
    os.chdir("d")
open("bottom", "w").close()
"""


def test_thousands_of_nested_directories_are_removed(world: World) -> None:
    """Attack: 3000 levels of nested directories in /tmp (far past PATH_MAX) and 1000 in
    /dev/shm. Defence: teardown removes them all, in bounded time, exit 0."""
    assert world.setup("67").returncode == 0
    for where, depth in (("/tmp", "3000"), ("/dev/shm", "1000")):
        r = world.box.run(
            ["run", "--job-id", "67", "--", PY, "-c", DEEP, where, depth], user=world.alice
        )
        assert r.returncode == 0, r.stderr
    timed_teardown(world, "67", limit=120)
    world.assert_clean()


def test_mode_000_directories_and_files_are_removed(world: World) -> None:
    """Attack: directories and files of mode 000 (nested), search-only and write-only
    directories, and her /tmp and /dev/shm roots themselves made mode 000. Defence:
    teardown removes everything, exit 0."""
    script = (
        "set -e; mkdir -p /tmp/a/b/c; touch /tmp/a/b/c/f /tmp/a/f; chmod 000 "
        "/tmp/a/b/c/f /tmp/a/f; chmod 000 /tmp/a/b/c /tmp/a/b /tmp/a; "
        "mkdir /tmp/x /tmp/y; touch /tmp/x/f /tmp/y/f; chmod 100 /tmp/x; "
        "chmod 200 /tmp/y; mkdir /dev/shm/z; touch /dev/shm/z/f; chmod 000 /dev/shm/z/f "
        "/dev/shm/z; mkfifo /var/tmp/fifo; chmod 000 /var/tmp/fifo /var/tmp; "
        "chmod 000 /tmp /dev/shm"
    )
    assert world.setup("68").returncode == 0
    r = world.run("68", script, user=world.alice)
    assert r.returncode == 0, r.stderr
    timed_teardown(world, "68")
    world.assert_clean()


# ------------------------------------------------------------------- processes


def test_orphaned_setsid_tasks_ignoring_sigterm_are_killed(world: World) -> None:
    """Attack: alice's task ignores SIGTERM, double-forks and setsid()s grandchildren that
    ignore it too, then she SIGKILLs her own `jobns run` so they are orphaned (re-parented
    to init, out of any supervisor's reach). Defence: teardown finds them by the job's
    namespace and kills every one (kill_wait, then SIGKILL); exit 0."""
    pids = world.w / "pids"
    pids.touch()
    pids.chmod(0o666)
    assert world.setup("69").returncode == 0
    script = world.w / "orphans.sh"
    script.write_text(
        "trap '' TERM\n"  # ignored, and so inherited by every child
        f'setsid sh -c \'sh -c "echo \\$\\$ >> {pids}; exec sleep 300" & '
        f"echo $$ >> {pids}; exec sleep 300' &\n"
        f"echo $$ >> {pids}\nwhile :; do sleep 0.2; done\n"
    )
    script.chmod(0o644)
    sup = world.start_jobns(["run", "--job-id", "69", "--", "sh", str(script)], user=world.alice)
    deadline = time.monotonic() + 20
    while len(pids.read_text().split()) < 3:
        assert time.monotonic() < deadline, pids.read_text()
        time.sleep(0.05)
    procs = [int(x) for x in pids.read_text().split()]
    world.track(*procs)
    os.kill(sup.pid, signal.SIGKILL)  # alice kills her own supervisor
    sup.wait(timeout=10)
    time.sleep(0.3)
    survivors = [p for p in procs if alive(p)]
    assert survivors, "nothing outlived the supervisor: the attack did not happen"
    timed_teardown(world, "69")
    assert [p for p in procs if alive(p)] == []
    world.assert_clean()


def test_task_in_a_nested_user_and_mount_namespace_is_killed(world: World) -> None:
    """Attack: a task of alice's job creates a nested user+mount namespace (unshare -Urm,
    allowed to any user) and a setsid'd process in it; she then kills her own `jobns run`.
    Its mount namespace is no longer the job's, so a teardown that looks for the job's
    processes by mount-namespace identity misses it and it runs on after the job.
    Defence: teardown ends every process of the job, nested namespaces included."""
    pidfile = world.w / "nested.pid"
    assert world.setup("70").returncode == 0
    sup = world.start_jobns(
        [
            "run",
            "--job-id",
            "70",
            "--",
            "sh",
            "-c",
            f"unshare -Urm --fork setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 300",
        ],
        user=world.alice,
    )
    nested = int(world.wait_file(pidfile))
    world.track(nested)
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait(timeout=10)
    time.sleep(0.3)
    assert alive(nested)
    timed_teardown(world, "70")
    deadline = time.monotonic() + 5
    while alive(nested) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(nested), "a process of the job outlived its teardown"
    world.assert_clean()


def test_fork_loop_during_teardown_is_ended(world: World) -> None:
    """Attack: alice's task ignores SIGTERM and keeps forking children that ignore it too,
    through the whole kill_wait. Defence: teardown still ends every process of the job
    (nothing left in its namespace) and exits 0 in bounded time."""
    assert world.setup("71").returncode == 0
    _, pid = world.task(
        "71",
        world.alice,
        "trap '' TERM; while :; do (trap '' TERM; exec sleep 300) & sleep 0.02; done",
    )
    ns = os.stat(f"/proc/{pid}/ns/mnt")
    time.sleep(1)
    timed_teardown(world, "71")
    left = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                st = os.stat(f"/proc/{name}/ns/mnt")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (ns.st_dev, ns.st_ino) and alive(int(name)):
                left.append(int(name))
    world.track(*left)
    assert left == []
    world.assert_clean()


def test_kill_wait_of_her_own_task_cannot_stretch_teardown(world: World) -> None:
    """Attack: alice starts her task with `jobns run --kill-wait 86400` and it ignores
    SIGTERM. Defence: teardown uses the job's kill_wait (2 s here): it ends the task
    within bounded time, and her supervisor exits soon after."""
    assert world.setup("72").returncode == 0
    pidfile = world.w / "kw.pid"
    sup = world.start_jobns(
        [
            "run",
            "--job-id",
            "72",
            "--kill-wait",
            "86400",
            "--",
            "sh",
            "-c",
            f"echo $$ > {pidfile}; trap '' TERM; while :; do sleep 0.2; done",
        ],
        user=world.alice,
    )
    task = int(world.wait_file(pidfile))
    world.track(task)
    timed_teardown(world, "72", limit=30)
    assert not alive(task)
    assert sup.wait(timeout=30) != 0
    assert job_mounts(world.box) == []
    world.assert_clean()


REMOUNT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = sys.argv[1]
for kind, flag in (("user", 0x10000000), ("mnt", 0x00020000)):
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
    if libc.setns(fd, flag) != 0:
        sys.exit(f"setns {kind}: {os.strerror(ctypes.get_errno())}")
r = libc.mount(None, b"/dev/shm", None, 32, b"size=1073741824")  # MS_REMOUNT
print("remounted" if r == 0 else f"errno {ctypes.get_errno()}")
"""


def test_shm_capacity_cannot_be_exceeded_or_remounted_larger(world: World) -> None:
    """Attack: alice fills her 4 MiB /dev/shm capacity past its size, then, from inside
    her own user and mount namespaces, remounts the capacity tmpfs with size=1G.
    Defence: writes past the capacity get ENOSPC, the node's /dev/shm does not take her
    bytes, and the remount is refused (the tmpfs belongs to root's user namespace)."""
    alice = world.alice
    assert world.setup("73", "--directives", "shm capacity=4MiB").returncode == 0
    node_before = os.statvfs("/dev/shm")
    r = world.run(
        "73",
        "dd if=/dev/zero of=/dev/shm/big bs=1M count=8 2>&1; "
        "df -B1 --output=size /dev/shm | tail -1",
        user=alice,
    )
    assert "No space left on device" in r.stdout, r.stdout
    assert int(r.stdout.split()[-1]) == 4 * MIB
    node_after = os.statvfs("/dev/shm")
    assert (node_before.f_bfree - node_after.f_bfree) * node_after.f_frsize < 2 * MIB
    _, pid = world.task("73", alice)
    r = world.python(alice, REMOUNT, str(pid))
    assert r.stdout.strip() != "remounted", r.stdout + r.stderr
    r = world.run("73", "df -B1 --output=size /dev/shm | tail -1", user=alice)
    assert int(r.stdout.split()[-1]) == 4 * MIB, r.stdout
    timed_teardown(world, "73")
    world.assert_clean()


def test_a_later_jobs_namespace_cannot_keep_a_finished_jobs_capacity_memory(world: World) -> None:
    """Attack: bob's job fills its 200 MiB /dev/shm capacity; alice's job is set up after
    it, so her job's mount namespace holds a copy of bob's capacity mount, and alice keeps
    her job running after bob's ends. Defence: bob's teardown frees his memory anyway
    (Shmem drops by at least 150 MiB) while alice's job goes on."""
    assert world.setup("74", "--directives", "shm capacity=200MiB", user=world.bob).returncode == 0
    r = world.run("74", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=190 2>&1", user=world.bob)
    assert r.returncode == 0, r.stdout + r.stderr
    assert world.setup("75").returncode == 0
    _, pid = world.task("75", world.alice)
    before = shmem_bytes()
    timed_teardown(world, "74")
    after = shmem_bytes()
    assert before - after >= 150 * MIB, f"Shmem only dropped by {(before - after) // MIB} MiB"
    assert alive(pid)
    assert world.run("75", "true", user=world.alice).returncode == 0
    timed_teardown(world, "75")
    world.assert_clean()


def test_stalled_fuse_shared_with_root_cannot_hang_root_tools(
    world: World, fuse_allow_other: Fuse
) -> None:
    """Attack (site with user_allow_other): alice FUSE-mounts with allow_root inside her
    job's tree and in an unrecorded job-like directory in the shm base, then stops both
    servers (SIGSTOP): any stat() root makes into them blocks until the server answers.
    Defence: `jobns status`, `jobns teardown` and `jobns gc --no-slurm` each finish within
    bounded time (never look into a user's mount), and teardown leaves nothing."""
    box, alice = world.box, world.alice
    assert world.setup("76").returncode == 0
    inside = box.local / "job-76/tmp/m"
    orphan = box.shm / "job-999"
    for d in (inside, orphan):
        assert world.as_user(alice, ["mkdir", "-m", "700", str(d)]).returncode == 0
        os.kill(fuse_allow_other.mount(alice, d, "allow_root").pid, signal.SIGSTOP)
    hung = []
    for args in (
        ["status"],
        ["status", "--json"],
        ["teardown", "--job-id", "76"],
        ["gc", "--no-slurm"],
    ):
        try:
            r = box.run(args, timeout=10)
            no_crash(r)
            if args[0] == "teardown":
                assert r.returncode == 0, r.stderr
        except subprocess.TimeoutExpired:
            hung.append(" ".join(args))
    assert hung == [], f"hung for 10 s on the user's stopped FUSE server: {hung}"
    assert [t for t in fuse_mounts(world) if t != str(orphan)] == []
    assert world.jobs_left() == []
