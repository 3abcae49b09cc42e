"""Attacks on `jobns setup` (the prolog): a user's mistake or malice fails her job, never
the node (DESIGN rules 2-4; contract points 2, 3a, 3b, 4). A squatter never blocks,
receives or loses anything; the namespace holder carries nothing of root's; ids, names
and directives never become paths outside the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, job_mounts
from tests.security.conftest import (
    PAUSE,
    STEAL_FDS,
    Fuse,
    World,
    children,
    euid_of,
    fd_targets,
    identity,
    mounts,
    no_crash,
    one_line,
    proc_state,
    refused,
    snapshot,
)

pytestmark = pytest.mark.root


# ------------------------------------------------------------------- contract 2


def test_setup_holder_holds_no_fd_of_roots(world: World) -> None:
    """Attack: while `jobns setup` waits for root to pin the job's namespaces, its holder
    child has become alice (dumpable, so she may ptrace it); alice pidfd_getfd()s its fds
    to get root's job lock (then teardown blocks forever) or root's base directories.
    Defence: the holder holds no fd but its pipes: nothing of the state directory, no
    base directory; alice's pidfd_getfd yields nothing of root's."""
    box, alice = world.box, world.alice
    violations: list[str] = []
    holders = 0
    for attempt in range(12):
        job = f"h{attempt}"
        p = world.start_jobns(
            ["setup", "--job-id", job, "--user", alice.name],
            user=None,
            env={PAUSE: "pending"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # Paused right after the record is written: the lock file exists, no child yet.
        deadline = time.monotonic() + 20
        while proc_state(p.pid) != "T" and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        protected = {
            identity(box.local): "local_base",
            identity(box.shm): "shm_base",
            identity(box.state): "state_dir",
        }
        for root, dirs, files in os.walk(box.state):
            for n in [*dirs, *files]:
                protected[identity(Path(root) / n)] = str(Path(root) / n)
        os.kill(p.pid, signal.SIGCONT)
        seen: set[int] = set()
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            kids = [k for k in children(p.pid) if k not in seen]
            if not kids:
                continue
            os.kill(p.pid, signal.SIGSTOP)  # keep every child as it is while we look
            try:
                for kid in kids:
                    seen.add(kid)
                    until = time.monotonic() + 3
                    while euid_of(kid) not in (alice.uid, None) and time.monotonic() < until:
                        time.sleep(0.002)
                    if euid_of(kid) != alice.uid:
                        continue
                    holders += 1
                    time.sleep(0.05)  # let it reach its wait for root's pins
                    own = (str(box.local / f"job-{job}"), str(box.shm / f"job-{job}"))
                    for fd, target in fd_targets(kid).items():
                        if (
                            target.startswith("/")
                            and target != "/dev/null"
                            and not target.startswith(own)
                        ):
                            violations.append(f"holder fd {fd} -> {target}")
                    stolen = json.loads(world.python(alice, STEAL_FDS, str(kid)).stdout)
                    for fd, dev, ino in stolen["got"]:
                        if (dev, ino) in protected:
                            violations.append(f"alice got holder fd {fd}: {protected[(dev, ino)]}")
            finally:
                os.kill(p.pid, signal.SIGCONT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert world.teardown(job).returncode == 0
        if holders:
            break
    assert holders, (
        "never caught the namespace holder in 12 setups (a child of setup that became the job user)"
    )
    assert violations == [], "\n".join(violations)
    world.assert_clean()


# ------------------------------------------------------------------ contract 3a


SQUATS = ["dir", "file", "symlink", "fifo", "exact"]


def squat(world: World, base: Path, name: str, kind: str, tree: bool, decoy: Path) -> None:
    """bob makes base/name before alice's job: a directory, a file, a symlink to a
    root-owned directory, a FIFO, or exactly what jobns makes but owned by him."""
    bob = world.bob
    path = base / name
    script = {
        "dir": f"mkdir -m 755 {path} && echo bobs > {path}/bobs.txt",
        "file": f"echo bobs > {path} && chmod 644 {path}",
        "symlink": f"ln -s {decoy} {path}",
        "fifo": f"mkfifo -m 600 {path}",
        "exact": f"mkdir -m 700 {path} && "
        + (
            f"mkdir -m 1777 {path}/tmp {path}/var_tmp && echo bobs > {path}/tmp/bobs.txt"
            if tree
            else f"echo bobs > {path}/bobs.txt"
        ),
    }[kind]
    r = world.as_user(bob, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr


def moved_intact(before: list[tuple[str, str, int, int, int]], aside: Path, name: str) -> None:
    """aside is the very entry the squatter made at name: its snapshot (content, owners,
    modes) is the one taken before setup, under the new name."""
    old = [e for e in before if e[0] == name or e[0].startswith(name + "/")]
    new = [
        (e[0].replace(aside.name, name, 1), *e[1:])
        for e in snapshot(aside.parent)
        if e[0] == aside.name or e[0].startswith(aside.name + "/")
    ]
    assert sorted(new) == sorted(old)


def entries(base: Path, prefix: str) -> list[Path]:
    return sorted(p for p in base.iterdir() if p.name.startswith(prefix))


@pytest.mark.parametrize("kind", SQUATS)
def test_squatted_job_dirs_are_moved_aside_and_never_used(world: World, kind: str) -> None:
    """Attack: bob creates local_base/job-N and shm_base/job-N (a dir, a file, a symlink
    to a root directory, a FIFO, or a dir with jobns's exact modes but his uid) before
    alice's job N. Defence: setup exits 0 and alice's job works on fresh, empty
    directories; bob's entries are moved aside in place (job-N~moved-*), still his,
    content intact, never chowned or used; teardown leaves them there."""
    alice, bob, box = world.alice, world.bob, world.box
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    for base, tree in ((box.local, True), (box.shm, False)):
        squat(world, base, "job-40", kind, tree, decoy)
    before = {base: snapshot(base) for base in (box.local, box.shm)}
    r = world.setup("40")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    r = world.run(
        "40",
        "ls -A /tmp; echo --; ls -A /dev/shm; echo mine > /tmp/a; echo mine > /dev/shm/b",
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    tmp, shm = r.stdout.split("--\n")
    assert set(tmp.split()) <= {"pmix"} and shm.split() == [], r.stdout
    moved = []
    for base in (box.local, box.shm):
        (aside,) = entries(base, "job-40~moved-")
        moved.append(aside)
        st = aside.lstat()
        assert st.st_uid == bob.uid, f"{aside} was chowned"
        moved_intact(before[base], aside, "job-40")
        job_dir = base / "job-40"
        assert job_dir.is_dir() and not job_dir.is_symlink()
        assert job_dir.stat().st_uid == alice.uid
    assert (box.local / "job-40/tmp/a").read_text() == "mine\n"
    assert snapshot(decoy) == decoy_before
    r = world.teardown("40")
    assert r.returncode == 0, r.stderr
    world.assert_clean(keep=moved)
    for aside in moved:
        assert aside.lstat().st_uid == bob.uid
    assert snapshot(decoy) == decoy_before


def test_squatter_moved_aside_survives_gc(world: World) -> None:
    """Attack: bob's squatted job dir, moved aside by setup, looks like an orphaned job
    tree to gc. Defence: gc removes only what it proved dead: bob's entries stay his."""
    box = world.box
    for base, tree in ((box.local, True), (box.shm, False)):
        squat(world, base, "job-41", "exact", tree, box.root)
    assert world.setup("41").returncode == 0
    assert world.teardown("41").returncode == 0
    moved = [*entries(box.local, "job-41~moved-"), *entries(box.shm, "job-41~moved-")]
    assert len(moved) == 2
    r = world.box.run(["gc", "--no-slurm"])
    no_crash(r)
    for aside in moved:
        assert aside.lstat().st_uid == world.bob.uid
    assert (moved[0] / "tmp/bobs.txt").read_text() == "bobs\n"
    world.assert_clean(keep=moved)


@pytest.mark.parametrize("kind", ["dir", "symlink", "file"])
def test_per_node_shared_job_dir_squatted_by_bob(world: World, kind: str) -> None:
    """Attack: in the per-node layout every node shares <shared_base>/job-N; bob makes
    it first (his directory, a symlink to a root directory, a file). Defence: setup
    exits 0; bob's entry stays his and exactly as he made it (in place, or moved aside
    as job-N~moved-*); nothing lands in it or is created through the link."""
    box = world.box
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    squat(world, box.shared, "job-42", kind, False, decoy)
    bobs = snapshot(box.shared)
    r = world.setup("42", "--use-shared-tmpdir=per-node")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    r = world.run("42", "echo mine > /tmp/a", user=world.alice)
    if r.returncode != 0:
        refused(r)
    assert snapshot(decoy) == decoy_before
    assert world.teardown("42").returncode == 0
    assert snapshot(decoy) == decoy_before
    kept = entries(box.shared, "job-42~moved-") or [box.shared / "job-42"]
    assert len(kept) == 1
    renamed = [(e[0].replace(kept[0].name, "job-42", 1), *e[1:]) for e in snapshot(box.shared)]
    assert sorted(renamed) == sorted(bobs), "bob's entry changed"
    world.assert_clean(keep=kept)


# ------------------------------------------------------------------ contract 3b


@pytest.mark.parametrize(
    ("comment", "config", "needle"),
    [
        ("jobns: shm capacity=2gib", "", "2gib"),
        ("jobns: shm capacity=3MiB", '[capacity]\nshm_max = "1MiB"\n', "shm_max"),
        ("jobns: tmp capacity=1N", "", "1N"),
        ("jobns: tmp capacity=1MiB; shared_tmpdir", "", "local layout"),
        ("jobns: stage_in source=/etc/shadow destination=/tmp/x", "", "/etc/shadow"),
    ],
    ids=["unit", "over-cap", "nodes", "contradiction", "stage-outside"],
)
def test_bad_directive_in_job_comment_fails_only_the_job(
    world: World, comment: str, config: str, needle: str
) -> None:
    """Attack: the job comment (SLURM_JOB_COMMENT, the user's) carries an invalid
    directive. Defence: setup exits 0 naming the reason; every task of the job exits 125
    with one line saying it was refused; teardown exits 0 and leaves nothing."""
    world.box.write_config(config)
    r = world.setup("43", env={"SLURM_JOB_COMMENT": comment})
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert needle in r.stderr, r.stderr
    refused(world.run("43", "true", user=world.alice))
    refused(world.box.run(["run", "--job-id", "43", "--", "true"]))
    r = world.teardown("43")
    assert r.returncode == 0, r.stderr
    world.assert_clean()


def test_huge_job_comment_and_script_are_bounded(world: World) -> None:
    """Attack: a job comment as large as the kernel passes (128 KiB per variable: a 1 MB
    one cannot reach the prolog) full of junk directives, and a 1 MB batch script with
    30000 #JOBNS lines. Defence: setup exits 0 within seconds; the job works."""
    # Accepted repeats, each parsed: junk jobns does not know now refuses the job at once.
    junk = "; ".join("no_rm_tmpdir" for i in range(8000))
    comment = ("jobns: shm capacity=1MiB; " + junk)[:120_000]
    t0 = time.monotonic()
    r = world.setup("44", env={"SLURM_JOB_COMMENT": comment}, timeout=60)
    assert r.returncode == 0, r.stderr[-500:]
    no_crash(r)
    assert time.monotonic() - t0 < 30
    assert world.run("44", "true", user=world.alice).returncode == 0
    assert world.teardown("44").returncode == 0
    script = world.box.root / "big.sh"
    lines = ["#!/bin/sh", *(f"#JOBNS no_rm_tmpdir  # {i} {'x' * 20}" for i in range(30000))]
    script.write_text("\n".join(lines) + "\nsrun true\n")
    assert script.stat().st_size > 1_000_000
    t0 = time.monotonic()
    r = world.setup("45", "--script", str(script), timeout=90)
    assert r.returncode == 0, r.stderr[-500:]
    no_crash(r)
    assert time.monotonic() - t0 < 60
    assert world.run("45", "true", user=world.alice).returncode == 0
    assert world.teardown("45").returncode == 0
    world.assert_clean()


def test_many_failing_stage_in_directives_fail_the_job_in_bounded_time(world: World) -> None:
    """Attack: 1200 stage_in directives (about all one argument may hold) of files that
    do not exist. Defence: setup exits 0 in bounded time, the job is refused, teardown
    leaves nothing."""
    stage = world.box.root / "stage"
    stage.mkdir(mode=0o755)
    world.box.write_config(f'[staging]\nstage_roots = ["{stage}"]\n')
    directives = "; ".join(
        f"stage_in source={stage}/missing-{i} destination=/tmp/f{i}" for i in range(1200)
    )
    t0 = time.monotonic()
    r = world.setup("46", "--directives", directives, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    no_crash(r)
    assert time.monotonic() - t0 < 90
    refused(world.run("46", "true", user=world.alice))
    assert world.teardown("46").returncode == 0
    world.assert_clean()


# ------------------------------------------------------------------- contract 4


RENAMER = r"""
import os, sys, time
stop, bases, name = sys.argv[1], sys.argv[2:-1], sys.argv[-1]
end = time.monotonic() + 600
n = tries = 0
while not os.path.exists(stop) and time.monotonic() < end:
    for base in bases:
        tries += 1
        try:
            os.rename(f"{base}/{name}", f"{base}/stolen-{n}")
            n += 1
        except OSError:
            pass
print(tries, n)
"""


def test_capacity_tmpfs_never_lands_where_the_user_renamed_her_tree(world: World) -> None:
    """Attack: with tmp and shm capacities, alice renames local_base/job-N and
    shm_base/job-N away in a tight loop during setup (30 setups), so root's tmpfs would be
    mounted on a directory at a name of her choosing. Defence: setup exits 0 or 125 with
    one line (never a traceback); no jobns-* tmpfs is ever mounted but on the recorded
    tree path; after teardown nothing is mounted."""
    box, alice = world.box, world.alice
    stop = world.w / "stop"
    racer = world.start(
        alice,
        ["/usr/bin/python3", "-c", RENAMER, str(stop), str(box.local), str(box.shm), "job-race"],
        stdout=subprocess.PIPE,
    )
    allowed = {str(box.local / "job-race"), str(box.shm / "job-race")}

    def capacity_mounts() -> list[str]:
        return [
            t
            for t, fstype, src in mounts()
            if fstype == "tmpfs"
            and src.startswith("jobns-")
            and t.startswith((str(box.root), str(box.shm)))
            and t != str(box.state)
        ]

    problems: list[str] = []
    try:
        for i in range(30):
            r = world.setup("race", "--directives", "tmp capacity=64MiB; shm capacity=64MiB")
            if (
                r.returncode not in (0, 125)
                or "Traceback" in r.stderr
                or "internal error" in r.stderr
            ):
                problems.append(f"setup {i}: {r.returncode} {r.stderr.strip()}")
            elif r.returncode == 125 and (
                r.stderr.count("\n") != 1 or not r.stderr.startswith("jobns: ")
            ):
                problems.append(f"setup {i}: not one line: {r.stderr!r}")
            for target in capacity_mounts():
                if target not in allowed:
                    problems.append(f"setup {i}: a capacity tmpfs is mounted at {target}")
            r = world.teardown("race")
            if r.returncode != 0:
                problems.append(f"teardown {i}: {r.returncode} {r.stderr.strip()}")
            for target in capacity_mounts():
                problems.append(f"after teardown {i}: a capacity tmpfs is still at {target}")
                subprocess.run(["umount", "-l", target], check=False)
            for base in (box.local, box.shm):
                for p in entries(base, "stolen-"):
                    subprocess.run(["rm", "-rf", str(p)], check=False)
    finally:
        stop.touch()
        out, _ = racer.communicate(timeout=30)
    tries, renamed = map(int, out.split())
    assert tries > 1000, "the racer hardly ran"
    # renamed may be 0: a tree that is already a mount point when it appears cannot be
    # renamed (EBUSY); that is a defence, not a failure of the test.
    assert problems == [], f"(the racer renamed {renamed} times)\n" + "\n".join(problems)
    world.assert_clean()


# --------------------------------------------------- user-held locks and mounts


def make_exact_tree(world: World, user: OsUser, job: str) -> list[Path]:
    local, shm = world.box.local / f"job-{job}", world.box.shm / f"job-{job}"
    r = world.as_user(
        user,
        [
            "sh",
            "-c",
            f"mkdir -m 700 {local} {shm} && "
            f"mkdir -m 1777 {local}/tmp {local}/var_tmp && "
            f"echo hers > {local}/tmp/hers",
        ],
    )
    assert r.returncode == 0, r.stderr
    return [local, shm]


FLOCKER = r"""
import fcntl, os, sys, time
fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_users_lock_on_her_premade_tree_cannot_hang_setup(world: World) -> None:
    """Attack: alice makes local_base/job-N and shm_base/job-N exactly as jobns would
    (hers, 0700, tmp/var_tmp 1777) and holds an exclusive flock on both, so a setup that
    share-locks a tree it reuses blocks forever (the prolog hangs, Slurm drains the node).
    Defence: setup exits 0 within a bounded time (the job works or is refused)."""
    made = make_exact_tree(world, world.alice, "47")
    locker = world.start(
        world.alice, ["/usr/bin/python3", "-c", FLOCKER, *map(str, made)], stdout=subprocess.PIPE
    )
    assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
    t0 = time.monotonic()
    try:
        r = world.setup("47", timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("jobns setup hung on the user's flock for 40 s")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert time.monotonic() - t0 < 30
    r = world.run("47", "true", user=world.alice)
    if r.returncode != 0:
        refused(r)
    os.killpg(locker.pid, signal.SIGKILL)
    locker.wait(timeout=10)
    assert world.teardown("47").returncode == 0
    keep = [*entries(world.box.local, "job-47~moved-"), *entries(world.box.shm, "job-47~moved-")]
    for p in keep:
        assert p.lstat().st_uid == world.alice.uid
    world.assert_clean(keep=keep)


def test_fuse_mounted_on_her_future_shm_dir_before_setup(world: World, fuse: Fuse) -> None:
    """Attack: alice makes shm_base/job-N herself and mounts a FUSE file system on it
    before the job is set up (root may not even look into it: EACCES). Defence: setup
    exits 0 (the job works on a directory of jobns's, or is refused); no mount of the
    host is touched; after teardown nothing is mounted at the job's paths."""
    box, alice = world.box, world.alice
    target = box.shm / "job-48"
    assert world.as_user(alice, ["mkdir", "-m", "700", str(target)]).returncode == 0
    fuse.mount(alice, target)
    outside = [m for m in mounts() if not m[0].startswith((str(box.root), str(box.shm)))]
    r = world.setup("48", timeout=60)
    assert r.returncode == 0, r.stderr
    no_crash(r)
    r = world.run("48", "ls -A /dev/shm", user=alice)
    if r.returncode == 0:
        assert "inside" not in r.stdout.split(), "the job got the user's FUSE mount"
    else:
        refused(r)
    assert world.teardown("48").returncode == 0
    assert [m for m in mounts() if not m[0].startswith((str(box.root), str(box.shm)))] == outside
    keep = entries(box.shm, "job-48~moved-")
    world.assert_clean(keep=keep)


# ---------------------------------------------------- ids, names, substitutions


BAD_IDS = ["../x", "a/b", ".", "..", "x\ny", "x" * 129, "a b", "job\u2215x", "", "../../etc"]


ID_CASES = [
    (job_id, via) for job_id in BAD_IDS for via in ("flag", "env") if job_id or via == "flag"
]  # an empty SLURM_JOB_ID is no id at all


@pytest.mark.parametrize(
    ("job_id", "via"), ID_CASES, ids=[f"id{BAD_IDS.index(i)}-{v}" for i, v in ID_CASES]
)
@pytest.mark.parametrize("sub", ["setup", "teardown", "run", "env"])
def test_job_id_traversal_is_refused(world: World, job_id: str, via: str, sub: str) -> None:
    """Attack: a job id that is not one path component (`../x`, `a/b`, `.`, `..`, a
    newline, 129 characters, a space, a Unicode slash, empty) through --job-id or
    SLURM_JOB_ID. NUL cannot be passed at all (execve). Defence: 125 and one line naming
    the job id; nothing is created anywhere."""
    args = ["--job-id", job_id] if via == "flag" else []
    env = {"SLURM_JOB_ID": job_id} if via == "env" else None
    user = world.alice if sub == "run" else None
    extra = {"setup": ["--user", world.alice.name], "run": ["--", "true"]}.get(sub, [])
    r = world.box.run([sub, *args, *extra], user=user, env=env)
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    one_line(r)
    assert "job id" in r.stderr
    world.assert_clean()


BAD_USERS = [
    "../root",
    "a/b",
    "root/../jobnsbob",
    "x\ny",
    "y" * 300,
    "-1",
    "jobnsalice\n",
    "4294967295",
    "99999999999999999999",
]


@pytest.mark.parametrize("name", BAD_USERS, ids=[f"user{i}" for i in range(len(BAD_USERS))])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_user_name_traversal_is_refused(world: World, name: str, via: str) -> None:
    """Attack: a job user that is no user (`../root`, `a/b`, newline, 300 characters,
    -1, an out-of-range uid) via --user or SLURM_JOB_USER in the prolog. Defence: 125
    and one line; nothing is created, nothing chowned."""
    args = ["--user", name] if via == "flag" else []
    env = {"SLURM_JOB_USER": name} if via == "env" else None
    r = world.box.run(["setup", "--job-id", "49", *args], env=env)
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    one_line(r)
    world.assert_clean()


@pytest.mark.parametrize("name", ["..", "../../etc", "a/../../..", "/etc", "x/../..", "n" * 5000])
def test_hostile_job_name_in_symbol_substitution(world: World, name: str) -> None:
    """Attack: SLURM_JOB_NAME (the user's) substituted for %x in a stage_out destination
    climbs out of the stage root. Defence: setup exits 0 and the job is refused; nothing
    is ever written outside the user's directory in the stage root."""
    stage = world.box.root / "stage"
    (stage / world.alice.name).mkdir(parents=True)
    stage.chmod(0o755)
    os.chown(stage / world.alice.name, world.alice.uid, world.alice.gid)
    world.box.write_config(f'[staging]\nstage_roots = ["{stage}"]\n')
    before = snapshot(world.box.root)
    r = world.setup(
        "50",
        "--directives",
        f"stage_out source=/tmp/o destination={stage}/%u/%x",
        env={"SLURM_JOB_NAME": name},
    )
    assert r.returncode == 0, r.stderr
    no_crash(r)
    refused(world.run("50", "echo o > /tmp/o", user=world.alice))
    assert world.teardown("50").returncode == 0
    after = [e for e in snapshot(world.box.root) if not e[0].startswith(("state", "w/"))]
    assert after == [e for e in before if not e[0].startswith(("state", "w/"))]
    world.assert_clean()


def test_directives_smuggled_by_newlines_in_the_job_comment(world: World) -> None:
    """Attack: a job comment with newlines that look like #JOBNS lines of a script
    ("...\\n#JOBNS stage_in source=/etc/shadow ..."). Defence: setup exits 0, the job is
    refused (or the smuggled line is not a directive), and nothing of /etc/shadow is
    copied into the job."""
    comment = "jobns: shm capacity=1MiB\n#JOBNS stage_in source=/etc/shadow destination=/tmp/loot\n"
    r = world.setup("51", env={"SLURM_JOB_COMMENT": comment})
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert not (world.box.local / "job-51/tmp/loot").exists()
    r = world.run("51", "cat /tmp/loot 2>/dev/null; true", user=world.alice)
    if r.returncode == 0:
        assert "root:" not in r.stdout
    else:
        refused(r)
    assert world.teardown("51").returncode == 0
    world.assert_clean()


# --------------------------------------------------------------- per-node races


SWAPPER = r"""
import os, sys, time
stop, base, name, decoy = sys.argv[1:5]
end = time.monotonic() + 600
n = 0
while not os.path.exists(stop) and time.monotonic() < end:
    try:
        os.rename(f"{base}/{name}", f"{base}/stolen-{n}")
        os.symlink(decoy, f"{base}/{name}")
        n += 1
    except OSError:
        pass
print(n)
"""


def test_per_node_shared_job_dir_swapped_for_a_symlink_during_setup(world: World) -> None:
    """Attack: in the per-node layout alice renames <shared_base>/job-N (hers once made)
    away and puts a symlink to a root directory in its place, in a loop during 20
    setups. Defence: nothing is ever created, chowned or mounted through the link; setup
    exits 0 or 125 with one line; teardown exits 0 and leaves no mount."""
    box = world.box
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    stop = world.w / "stop"
    racer = world.start(
        world.alice,
        ["/usr/bin/python3", "-c", SWAPPER, str(stop), str(box.shared), "job-pn", str(decoy)],
        stdout=subprocess.PIPE,
    )
    problems: list[str] = []
    try:
        for i in range(20):
            r = world.setup("pn", "--use-shared-tmpdir=per-node")
            if (
                r.returncode not in (0, 125)
                or "Traceback" in r.stderr
                or "internal error" in r.stderr
            ):
                problems.append(f"setup {i}: {r.returncode} {r.stderr.strip()}")
            r = world.teardown("pn")
            if r.returncode != 0:
                problems.append(f"teardown {i}: {r.returncode} {r.stderr.strip()}")
            if snapshot(decoy) != decoy_before:
                problems.append(f"round {i}: the decoy changed")
                break
    finally:
        stop.touch()
        out, _ = racer.communicate(timeout=30)
    assert int(out or 0) > 0, "the racer never swapped anything"
    assert problems == [], "\n".join(problems)
    assert snapshot(decoy) == decoy_before
    assert job_mounts(box) == []
    assert world.jobs_left() == []
    # What is left in shared_base is alice's own renamed directories and her link:
    # nothing of root's, nothing root-owned.
    for root, dirs, names in os.walk(box.shared):
        for n in [*dirs, *names]:
            st = os.lstat(Path(root) / n)
            assert st.st_uid == world.alice.uid, f"{Path(root) / n} is uid {st.st_uid}"


def test_tree_swapped_for_a_symlink_during_setup_and_teardown(world: World) -> None:
    """Attack: alice renames local_base/job-N and shm_base/job-N away and plants symlinks
    to a root-owned directory in their place, in a loop during 20 setups and teardowns
    (no capacity). Defence: nothing is created, chowned, mounted or removed through the
    links; setup exits 0 or 125 with one line; teardown exits 0; no mount is left."""
    box = world.box
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    stop = world.w / "stop"
    racers = [
        world.start(
            world.alice,
            ["/usr/bin/python3", "-c", SWAPPER, str(stop), str(base), "job-sw", str(decoy)],
            stdout=subprocess.PIPE,
        )
        for base in (box.local, box.shm)
    ]
    problems: list[str] = []
    try:
        for i in range(20):
            r = world.setup("sw")
            if (
                r.returncode not in (0, 125)
                or "Traceback" in r.stderr
                or "internal error" in r.stderr
            ):
                problems.append(f"setup {i}: {r.returncode} {r.stderr.strip()}")
            r = world.teardown("sw")
            if r.returncode != 0:
                problems.append(f"teardown {i}: {r.returncode} {r.stderr.strip()}")
            if snapshot(decoy) != decoy_before:
                problems.append(f"round {i}: the decoy changed")
                break
    finally:
        stop.touch()
        counts = [int(p.communicate(timeout=30)[0] or 0) for p in racers]
    assert sum(counts) > 0, "the racers never swapped anything"
    assert problems == [], "\n".join(problems)
    assert snapshot(decoy) == decoy_before
    assert job_mounts(box) == []
    assert world.jobs_left() == []
    for base in (box.local, box.shm):
        for root, dirs, names in os.walk(base):
            for n in [*dirs, *names]:
                st = os.lstat(Path(root) / n)
                assert st.st_uid == world.alice.uid, f"{Path(root) / n} is uid {st.st_uid}"


SQUATTER = r"""
import os, sys, time
stop, name = sys.argv[1], sys.argv[2]
bases = sys.argv[3:]
end = time.monotonic() + 600
n = 0
while not os.path.exists(stop) and time.monotonic() < end:
    for base in bases:
        try:
            os.mkdir(f"{base}/{name}", 0o700)
            n += 1
        except OSError:
            pass
print(n)
"""


def test_squatter_recreating_the_job_dir_in_a_loop_cannot_block_setup(world: World) -> None:
    """Attack: bob re-creates local_base/job-N and shm_base/job-N in a tight loop, so each
    time setup moves his entry aside, another one is there before jobns renames its tree
    into place. Defence: setup exits 0 and alice's job works on directories of jobns's
    (a squatter never blocks); bob's entries are moved aside, still his."""
    box, bob = world.box, world.bob
    stop = world.w / "stop"
    squatter = world.start(
        bob,
        ["/usr/bin/python3", "-c", SQUATTER, str(stop), "job-52", str(box.local), str(box.shm)],
        stdout=subprocess.PIPE,
    )
    time.sleep(0.3)
    try:
        r = world.setup("52", timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        no_crash(r)
        r = world.run("52", "ls -A /tmp /dev/shm; touch /tmp/mine", user=world.alice)
        assert r.returncode == 0, r.stderr
        assert (box.local / "job-52/tmp/mine").stat().st_uid == world.alice.uid
    finally:
        stop.touch()
        out, _ = squatter.communicate(timeout=30)
    assert int(out or 0) > 0, "bob never squatted"
    assert world.teardown("52").returncode == 0
    keep = [*entries(box.local, "job-52"), *entries(box.shm, "job-52")]
    for p in keep:
        assert p.name.startswith("job-52~moved-") and p.lstat().st_uid == bob.uid, p
    world.assert_clean(keep=keep)


def test_stalled_fuse_on_her_future_job_dir_cannot_hang_setup(
    world: World, fuse_allow_other: Fuse
) -> None:
    """Attack (site with user_allow_other): alice makes shm_base/job-N herself, FUSE-mounts
    it with allow_root and stops the server (SIGSTOP), so root's first stat() of job-N
    blocks forever: the prolog hangs and Slurm drains the node. Defence: setup exits 0
    within bounded time (the job works or is refused), and teardown leaves no mount."""
    box, alice = world.box, world.alice
    target = box.shm / "job-53"
    assert world.as_user(alice, ["mkdir", "-m", "700", str(target)]).returncode == 0
    os.kill(fuse_allow_other.mount(alice, target, "allow_root").pid, signal.SIGSTOP)
    try:
        r = world.setup("53", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("jobns setup hung for 20 s on the user's stopped FUSE server")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    r = world.run("53", "true", user=alice, timeout=30)
    if r.returncode != 0:
        refused(r)
    assert world.teardown("53", timeout=30).returncode == 0
    assert job_mounts(box) == []
