"""Attacks on the burst buffer (`jobns bb` on the controller, and the prolog that reads
its records), made by a second ordinary user, bob: he squats the names the burst buffer
uses in shared_base (a sticky, world-writable base) before it does, points his own job's
stage_in and stage_out at root-only files through symlinks, reads what root keeps, and
runs `jobns bb` himself. Defences: what he made is moved aside untouched and unread, a
node never believes a records directory that is not root's, every copy runs as the job's
user, root's files stay unreadable, `jobns bb` is root's; after each attack the
controller still runs a burst-buffer job from start to end."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OsUser, job_mounts
from tests.security.conftest import TRY_OPEN, World, identity, no_crash, one_line, snapshot

pytestmark = pytest.mark.root

SIZE = str(10 << 20)
SECRET = b"root's secret 7f3a9c1e, not for users\n"
MOVED = "~moved-"


class Bb:
    """The controller's burst buffer in the world's sandbox: a stage root with a private
    directory per user, [burst_buffer] enabled, batch scripts as slurmctld saves them,
    and a root-only file."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.box = world.box
        self.stage = self.box.root / "stage"
        self.stage.mkdir(mode=0o755)
        for u in (world.alice, world.bob):
            d = self.stage / u.name
            d.mkdir(mode=0o700)
            os.chown(d, u.uid, u.gid)
        self.scripts = self.box.root / "scripts"
        self.scripts.mkdir(mode=0o755)
        self.secret = self.box.root / "secret"
        self.secret.write_bytes(SECRET)
        self.secret.chmod(0o600)
        self.secret_dir = self.box.root / "secret-dir"
        self.secret_dir.mkdir(mode=0o700)
        (self.secret_dir / "inside").write_bytes(SECRET)
        (self.secret_dir / "inside").chmod(0o600)
        self.box.write_config(
            f'[staging]\nstage_roots = ["{self.stage}"]\n'
            '[burst_buffer]\nenabled = true\ngranularity = "1MiB"\nsize = "100MiB"\n'
        )

    def home(self, user: OsUser) -> Path:
        return self.stage / user.name

    def inputs(self, user: OsUser, name: str = "in") -> Path:
        """A directory of the user's inputs in her stage directory."""
        d = self.home(user) / name
        d.mkdir()
        (d / "f").write_text(f"{user.name}'s input\n")
        for p in (d, d / "f"):
            os.lchown(p, user.uid, user.gid)
        return d

    def script(self, job: str, *lines: str) -> Path:
        path = self.scripts / f"job.{job}"
        head = ["#!/bin/sh", "#BB_LUA pool=shared capacity=10M", "#JOBNS shared_tmpdir"]
        path.write_text("\n".join([*head, *lines, "srun ./compute", ""]))
        path.chmod(0o600)
        return path

    def setup(
        self, job: str, user: OsUser, *lines: str, caller: OsUser | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`jobns bb setup` for user's job, run by root (or by caller)."""
        return self.box.run(
            [
                "bb",
                "--job-id",
                job,
                "--uid",
                str(user.uid),
                "--gid",
                str(user.gid),
                "--script",
                str(self.script(job, *lines)),
                "--size",
                SIZE,
                "--comment",
                "",
                "setup",
            ],
            user=caller,
        )

    def step(
        self, job: str, step: str, *extra: str, caller: OsUser | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.box.run(["bb", "--job-id", job, *extra, step], user=caller)

    def records(self) -> Path:
        return self.box.shared / ".jobns-bb"

    def record_path(self, job: str) -> Path:
        return self.records() / f"job-{job}.json"

    def record(self, job: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.record_path(job).read_bytes())
        return doc

    def tree(self, job: str) -> Path:
        return self.box.shared / f"job-{job}"

    def lock(self, job: str) -> Path:
        return self.box.state / "bb" / f"{job}.lock"

    def moved(self, name: str) -> list[Path]:
        return sorted(self.box.shared.glob(f"{name}{MOVED}*"))

    def as_user(self, user: OsUser, cmd: str) -> subprocess.CompletedProcess[str]:
        return self.world.as_user(user, ["sh", "-c", cmd])

    def gone(self, job: str) -> None:
        assert not os.path.lexists(self.tree(job))
        assert not os.path.lexists(self.record_path(job))
        assert not os.path.lexists(self.lock(job))

    def root_records_dir(self) -> None:
        st = os.lstat(self.records())
        assert stat.S_ISDIR(st.st_mode), st
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700, st

    def no_secret_below(self, *tops: Path) -> None:
        """No file below tops holds root's secret (symlinks are not followed)."""
        for top in tops:
            if not os.path.lexists(top):
                continue
            if top.is_symlink() or top.is_file():
                paths = [top]
            else:
                paths = [Path(r) / n for r, _, names in os.walk(top) for n in names]
            for p in paths:
                if not p.is_symlink() and p.is_file():
                    assert SECRET not in p.read_bytes(), p

    def controller_fine(self) -> None:
        """The controller still runs an ordinary burst-buffer job of alice's end to end,
        and shows every record it holds."""
        alice = self.world.alice
        src = self.home(alice) / "canary"
        if not src.exists():
            src.mkdir()
            (src / "c").write_text("canary\n")
            for p in (src, src / "c"):
                os.lchown(p, alice.uid, alice.gid)
        out = self.home(alice) / "canary-out"
        lines = (
            f"#JOBNS stage_in source={src} destination=/tmp/c",
            f"#JOBNS stage_out source=/tmp/c destination={out}",
        )
        for r in (
            self.setup("4242", alice, *lines),
            self.step("4242", "data-in"),
            self.step("4242", "data-out"),
            self.step("4242", "teardown"),
        ):
            assert r.returncode == 0, r.stderr
            no_crash(r)
        assert (out / "c").read_text() == "canary\n"
        self.gone("4242")
        self.root_records_dir()
        r = self.box.run(["bb", "status"])
        assert r.returncode == 0 and "unreadable record" not in r.stdout, r.stdout
        no_crash(r)
        assert job_mounts(self.box) == []


@pytest.fixture
def bb(world: World) -> Bb:
    return Bb(world)


def old_atime(*paths: Path) -> dict[Path, float]:
    """Make each file's access time older than its change: under relatime any read of it
    then moves its access time (the proof that a file was not read)."""
    out = {}
    for p in paths:
        st = os.lstat(p)
        os.utime(p, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns), follow_symlinks=False)
        out[p] = os.lstat(p).st_atime
    return out


def unread(atimes: dict[Path, float], where: Path) -> None:
    """None of the files was read since old_atime; where: the directory they are in now
    (their directory may have been moved aside)."""
    for p, atime in atimes.items():
        assert os.lstat(where / p.name).st_atime == atime, f"{p} was read"


def forged_record(job: str, victim: OsUser, secret: Path) -> bytes:
    """A record as jobns writes one, of the attacker's making: the victim's job in the
    shared layout, its tree in /etc, and a stage_in of root's secret."""
    return json.dumps(
        {
            "version": 1,
            "job_id": job,
            "uid": victim.uid,
            "gid": victim.gid,
            "user": victim.name,
            "state": "staged-in",
            "layout": "shared",
            "no_rm_tmpdir": False,
            "size": 0,
            "script_header": f"#!/bin/sh\n#JOBNS shared_tmpdir\n"
            f"#JOBNS stage_in source={secret} destination=/tmp/loot",
            "comment": "",
            "work_dir": "",
            "job_name": "",
            "array_job_id": "",
            "array_task_id": "",
            "tmp_mib": None,
            "tree_path": "/etc",
            "stage_in": [],
            "stage_out": [],
            "stage_in_done": [],
            "stage_out_done": [],
            "errors": [],
        }
    ).encode()


def bobs_records(bb: Bb, job: str, where: Path) -> Path:
    """bob makes `where` his own directory, with a forged record of job and a file."""
    bob = bb.world.bob
    r = bb.as_user(bob, f"mkdir -m 0755 {where}")
    assert r.returncode == 0, r.stderr
    (where / f"job-{job}.json").write_bytes(forged_record(job, bb.world.alice, bb.secret))
    (where / "notes").write_text("bob's notes\n")
    for p in (where / f"job-{job}.json", where / "notes"):
        os.lchown(p, bob.uid, bob.gid)
        p.chmod(0o644)
    return where


# ------------------------------------------------------------- (a) the records directory


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_squatted_records_directory_is_moved_aside(bb: Bb, kind: str) -> None:
    """Attack: before any burst-buffer step, bob makes <shared_base>/.jobns-bb his own
    directory (or a symlink to one of his), holding a forged record, hoping the controller
    writes records where he reads them, or reads his. Defence: `bb setup` moves his entry
    aside (same inode, his, untouched, his files unread), makes root's 0700 directory
    and writes the record there; his directory gets nothing."""
    world, bob = bb.world, bb.world.bob
    if kind == "directory":
        his = bobs_records(bb, "95", bb.records())
    else:
        his = bobs_records(bb, "95", world.w / "bobs-records")
        r = bb.as_user(bob, f"ln -s {his} {bb.records()}")
        assert r.returncode == 0, r.stderr
    squat = identity(bb.records())
    before = snapshot(his)
    atimes = old_atime(his / "job-95.json", his / "notes")
    r = bb.setup("95", world.alice)
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert "moved" in r.stderr and ".jobns-bb" in r.stderr, r.stderr
    bb.root_records_dir()
    assert identity(bb.records()) != squat
    (aside,) = bb.moved(".jobns-bb")
    assert identity(aside) == squat and os.lstat(aside).st_uid == bob.uid
    if kind == "symlink":
        assert aside.is_symlink() and os.readlink(aside) == str(his)
    else:
        his = aside  # his directory, under its new name
    unread(atimes, his)
    assert snapshot(his) == before
    rec = bb.record("95")
    assert rec["uid"] == world.alice.uid and rec["tree_path"] == str(bb.tree("95"))
    assert os.lstat(bb.record_path("95")).st_uid == 0
    assert bb.step("95", "data-in").returncode == 0
    assert bb.step("95", "teardown").returncode == 0
    bb.gone("95")
    assert snapshot(his) == before
    bb.no_secret_below(bb.box.shared, world.w)
    bb.controller_fine()


@pytest.mark.parametrize("kind", ["bobs-directory", "symlink-to-bobs", "symlink-to-roots"])
def test_prolog_ignores_a_records_directory_that_is_not_roots(bb: Bb, kind: str) -> None:
    """Attack: on a node whose shared_base has no records directory yet, bob makes
    .jobns-bb his own directory, or a symlink to his, or a symlink to a root-owned 0700
    directory holding a root-owned record (an old copy, another cluster's): each with a
    record for alice's next job asking for the shared layout in /etc and a stage_in of
    root's secret. Defence: the prolog warns and reads no record: alice's job is set up
    as any job (local layout), his files are unread, /etc and the secret untouched."""
    world, bob, alice = bb.world, bb.world.bob, bb.world.alice
    if kind == "bobs-directory":
        his = bobs_records(bb, "96", bb.records())
    elif kind == "symlink-to-bobs":
        his = bobs_records(bb, "96", world.w / "bobs-records")
        assert bb.as_user(bob, f"ln -s {his} {bb.records()}").returncode == 0
    else:
        his = bb.box.root / "old-records"
        his.mkdir(mode=0o700)
        (his / "job-96.json").write_bytes(forged_record("96", alice, bb.secret))
        (his / "job-96.json").chmod(0o600)
        (his / "notes").write_text("root's notes\n")
        assert bb.as_user(bob, f"ln -s {his} {bb.records()}").returncode == 0
    before = snapshot(his)
    etc = os.lstat("/etc")
    atimes = old_atime(his / "job-96.json", his / "notes")
    r = world.setup("96")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert "refused" not in r.stderr, r.stderr
    assert "ignore" in r.stderr and ".jobns-bb" in r.stderr, r.stderr
    unread(atimes, his)
    # The job is an ordinary one: its /tmp is on the node, nothing of the forged record.
    r = world.run("96", "echo x > /tmp/x; ls -A /tmp", user=alice)
    assert r.returncode == 0, r.stderr
    assert "loot" not in r.stdout
    assert (bb.box.local / "job-96" / "tmp" / "x").exists()
    assert not os.path.lexists(bb.tree("96"))
    assert world.teardown("96").returncode == 0
    assert snapshot(his) == before
    after = os.lstat("/etc")
    assert (after.st_uid, after.st_mode) == (etc.st_uid, etc.st_mode)
    assert not os.path.lexists("/etc/tmp") and not os.path.lexists("/etc/var_tmp")
    assert bb.secret.read_bytes() == SECRET
    bb.no_secret_below(bb.box.local, bb.box.shared, bb.box.shm)
    world.assert_clean(keep=[bb.records()])
    # The controller, later, moves his entry aside and works.
    bb.controller_fine()
    if kind == "bobs-directory":
        (his,) = bb.moved(".jobns-bb")
    else:
        (link,) = bb.moved(".jobns-bb")
        assert os.readlink(link) == str(his)
    assert snapshot(his) == before


# --------------------------------------------------------------- (b) the job's tree


@pytest.mark.parametrize("kind", ["directory", "symlink-to-decoy", "symlink-to-etc"])
def test_squatted_job_tree_is_moved_aside(bb: Bb, kind: str) -> None:
    """Attack: bob guesses alice's next job id and makes <shared_base>/job-ID first: his
    directory (0777, with a file), or a symlink to a root directory (a decoy standing for
    /etc, or /etc itself), hoping her inputs flow into his directory or root makes the
    tree's children in /etc. Defence: `bb setup` moves his entry aside untouched and makes
    a fresh tree owned by alice; her data never reaches his entry; the target of his
    link is untouched; the teardown removes her tree only."""
    world, bob, alice = bb.world, bb.world.bob, bb.world.alice
    squat = bb.tree("97")
    if kind == "directory":
        r = bb.as_user(bob, f"mkdir -m 0777 {squat} && echo mine > {squat}/mine")
        target: Path | None = None
    else:
        target = world.decoy() if kind == "symlink-to-decoy" else Path("/etc")
        r = bb.as_user(bob, f"ln -s {target} {squat}")
    assert r.returncode == 0, r.stderr
    etc = os.lstat("/etc")
    decoy_before = snapshot(target) if kind == "symlink-to-decoy" and target else None
    squat_id = identity(squat)
    src = bb.inputs(alice)
    r = bb.setup("97", alice, f"#JOBNS stage_in source={src} destination=/tmp/d")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert "moved" in r.stderr, r.stderr
    st = os.lstat(squat)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (alice.uid, alice.gid)
    assert stat.S_IMODE(st.st_mode) & 0o077 == 0
    assert sorted(os.listdir(squat)) == ["tmp", "var_tmp"]
    (aside,) = bb.moved("job-97")
    assert identity(aside) == squat_id and os.lstat(aside).st_uid == bob.uid
    assert bb.step("97", "data-in").returncode == 0
    assert (squat / "tmp" / "d" / "f").read_text() == f"{alice.name}'s input\n"
    if kind == "directory":
        assert sorted(os.listdir(aside)) == ["mine"]
        assert (aside / "mine").read_text() == "mine\n"
    else:
        assert target is not None and os.readlink(aside) == str(target)
    assert bb.step("97", "teardown").returncode == 0
    bb.gone("97")
    assert os.path.lexists(aside) and identity(aside) == squat_id
    if decoy_before is not None and target is not None:
        assert snapshot(target) == decoy_before
    after = os.lstat("/etc")
    assert (after.st_uid, after.st_mode) == (etc.st_uid, etc.st_mode)
    assert not os.path.lexists("/etc/tmp") and not os.path.lexists("/etc/var_tmp")
    bb.controller_fine()


# -------------------------------------------------------- (c) stage_in of root's file


@pytest.mark.parametrize("what", ["file", "directory"])
def test_stage_in_through_a_symlink_to_a_root_only_file(bb: Bb, what: str) -> None:
    """Attack: bob's own job stages in his symlink (in his stage directory) to a file, or
    a directory, only root may read, hoping the controller copies it into his shared
    tmpdir. Defence: data-in copies as bob and fails (125, one line); nothing is copied;
    root's files are untouched."""
    bob = bb.world.bob
    target = bb.secret if what == "file" else bb.secret_dir
    link = bb.home(bob) / "innocent"
    assert bb.as_user(bob, f"ln -s {target} {link}").returncode == 0
    r = bb.setup("98", bob, f"#JOBNS stage_in source={link} destination=/tmp/loot")
    assert r.returncode == 0, r.stderr
    r = bb.step("98", "data-in")
    assert r.returncode == 125, (r.returncode, r.stderr)
    one_line(r)
    assert "stage-in failed" in r.stderr, r.stderr
    assert SECRET.decode().strip() not in r.stderr
    tree = bb.tree("98")
    assert not os.path.lexists(tree / "tmp" / "loot") or not any(
        (Path(d) / n).is_file() for d, _, names in os.walk(tree / "tmp" / "loot") for n in names
    )
    bb.no_secret_below(tree, bb.home(bob))
    assert bb.record("98")["stage_in_done"] == []
    assert bb.secret.read_bytes() == SECRET
    assert (bb.secret_dir / "inside").read_bytes() == SECRET
    assert bb.step("98", "teardown", "--hurry").returncode == 0
    bb.gone("98")
    bb.controller_fine()


# ----------------------------------------------------- (d) stage_out of root's file


@pytest.mark.parametrize("how", ["top", "inside", "directory"])
def test_stage_out_source_swapped_for_a_symlink_to_root_only_file(bb: Bb, how: str) -> None:
    """Attack: after data-in, bob's job replaces its stage_out source in the shared tmpdir
    (or a file in it) with a symlink to a root-only file or directory, hoping data-out
    copies root's file to his stage directory. Defence: data-out copies as bob: whether
    it fails or copies the link as a link, his destination never holds root's content;
    root's files are untouched; the controller is fine."""
    bob = bb.world.bob
    src = bb.inputs(bob)
    out = bb.home(bob) / "out"
    r = bb.setup(
        "99",
        bob,
        f"#JOBNS stage_in source={src} destination=/tmp/d",
        f"#JOBNS stage_out source=/tmp/d destination={out}",
    )
    assert r.returncode == 0, r.stderr
    assert bb.step("99", "data-in").returncode == 0
    d = bb.tree("99") / "tmp" / "d"
    assert (d / "f").exists()
    if how == "top":
        cmd = f"rm -rf {d} && ln -s {bb.secret} {d}"
    elif how == "inside":
        cmd = f"rm -f {d}/f && ln -s {bb.secret} {d}/f && ln -s {bb.secret_dir} {d}/dir"
    else:
        cmd = f"rm -rf {d} && ln -s {bb.secret_dir} {d}"
    r = bb.as_user(bob, cmd)
    assert r.returncode == 0, r.stderr
    r = bb.step("99", "data-out")
    no_crash(r)
    if r.returncode != 0:
        assert r.returncode == 125
        assert r.stderr.strip().splitlines()[-1].startswith("jobns: bb data-out job 99: ")
    assert SECRET.decode().strip() not in r.stderr + r.stdout
    bb.no_secret_below(out)
    if os.path.lexists(out):
        # What is there is bob's, and reading through it as bob gives nothing of root's.
        for root, dirs, names in os.walk(out):
            for n in [*dirs, *names]:
                assert os.lstat(Path(root) / n).st_uid == bob.uid
        probe = bb.as_user(bob, f"cat {out} {out}/f {out}/dir/inside 2>/dev/null; true")
        assert SECRET.decode().strip() not in probe.stdout
    assert bb.secret.read_bytes() == SECRET
    assert (bb.secret_dir / "inside").read_bytes() == SECRET
    assert bb.step("99", "teardown", "--hurry").returncode == 0
    bb.gone("99")
    assert bb.secret.read_bytes() == SECRET
    bb.controller_fine()


# ------------------------------------------------------------- (e) what root keeps


def test_records_and_locks_are_root_only(bb: Bb) -> None:
    """Attack: bob reads the records (alice's script header, comment, paths) and opens the
    step locks (to hold a flock and stall her steps), or plants files beside them.
    Defence: the records directory is root's 0700, each record and lock root's 0600,
    <state_dir>/bb root's 0755: every open and every create fails for him."""
    world, bob = bb.world, bb.world.bob
    src = bb.inputs(world.alice)
    assert (
        bb.setup("100", world.alice, f"#JOBNS stage_in source={src} destination=/tmp/d").returncode
        == 0
    )
    lock = bb.lock("100")
    assert lock.exists()
    for p, mode in ((bb.record_path("100"), 0o600), (lock, 0o600)):
        st = os.lstat(p)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == mode, p
    r = world.python(bob, TRY_OPEN, str(bb.record_path("100")), str(lock), str(bb.records()))
    assert r.returncode == 0, r.stderr
    said = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert said == {
        str(bb.record_path("100")): "PermissionError",
        str(lock): "PermissionError",
        str(bb.records()): "PermissionError",
    }, r.stdout
    probe = (
        "import os, sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        if path.endswith('/'):\n"
        "            os.listdir(path)\n"
        "        else:\n"
        "            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))\n"
        "        print(path, 'ok')\n"
        "    except OSError as e:\n"
        "        print(path, type(e).__name__)\n"
    )
    targets = [
        f"{bb.records()}/",
        str(bb.records() / "job-101.json"),
        str(bb.box.state / "bb" / "101.lock"),
        str(bb.box.state / "bb" / "pools.json"),
    ]
    r = world.python(bob, probe, *targets)
    assert r.returncode == 0, r.stderr
    assert [ln.rsplit(" ", 1)[1] for ln in r.stdout.splitlines()] == ["PermissionError"] * 4, (
        r.stdout
    )
    assert not (bb.records() / "job-101.json").exists()
    assert not (bb.box.state / "bb" / "101.lock").exists()
    # pools.json is for slurmctld's SlurmUser: readable, and it holds the pool only.
    pools = json.loads((bb.box.state / "bb" / "pools.json").read_text())
    assert set(pools) == {"pools"} and all(
        set(p) == {"id", "quantity", "granularity", "free"} for p in pools["pools"]
    )
    assert bb.step("100", "data-in").returncode == 0
    assert bb.step("100", "teardown").returncode == 0
    bb.gone("100")
    bb.controller_fine()


# ----------------------------------------------------------------- (f) jobns bb itself


@pytest.mark.parametrize("step", ["setup", "data-in", "data-out", "teardown", "pools", "status"])
def test_bb_is_roots_only(bb: Bb, step: str) -> None:
    """Attack: bob runs `jobns bb` himself: setup of a job as himself or as alice, or any
    other step of alice's job. Defence: every step exits 125 with one line saying it is
    root's, before anything is read or made."""
    world, bob = bb.world, bb.world.bob
    src = bb.inputs(world.alice)
    assert (
        bb.setup("102", world.alice, f"#JOBNS stage_in source={src} destination=/tmp/d").returncode
        == 0
    )
    record = bb.record_path("102").read_bytes()
    shared_before = sorted(os.listdir(bb.box.shared))
    if step == "setup":
        results = [
            bb.setup("103", bob, caller=bob),
            bb.setup("102", world.alice, caller=bob),
        ]
    else:
        results = [bb.step("102", step, caller=bob), bb.step("102", step, "--hurry", caller=bob)]
    for r in results:
        assert r.returncode == 125, (r.returncode, r.stderr)
        one_line(r)
        assert "must run as root" in r.stderr, r.stderr
        assert r.stdout == ""
    assert sorted(os.listdir(bb.box.shared)) == shared_before
    assert bb.record_path("102").read_bytes() == record
    assert not os.path.lexists(bb.tree("103"))
    assert bb.step("102", "teardown").returncode == 0
    bb.gone("102")
    bb.controller_fine()
