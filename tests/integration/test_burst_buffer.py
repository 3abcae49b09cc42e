"""The burst buffer for real (root): `jobns bb` setup, data-in, data-out and teardown as
slurmscriptd runs them, with a real ordinary user and real files; every step idempotent;
failed stage-in and stage-out; refusals before any path is made; and the prolog and the
epilog of a burst-buffer job (launcher.burstbuffer, commands.bb, commands.setup)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OsUser, Sandbox, own_mounts

pytestmark = pytest.mark.root

SIZE = str(10 << 20)  # what Slurm reserved: #BB_LUA pool=shared capacity=10M
CONFIG = (
    '[staging]\nstage_roots = ["{stage}"]\n'
    '[burst_buffer]\nenabled = true\ngranularity = "1MiB"\nsize = "100MiB"\n'
)


class Site:
    """A controller's view of the sandbox: a stage root with the user's inputs, a
    [burst_buffer] config, batch scripts as slurmctld saves them."""

    def __init__(self, box: Sandbox, user: OsUser) -> None:
        self.box = box
        self.user = user
        self.stage = box.root / "stage"
        self.stage.mkdir(mode=0o755)
        self.mine = self.stage / user.name
        self.inputs = self.mine / "in" / "d"
        self.outputs = self.mine / "out"
        self.inputs.mkdir(parents=True)
        (self.inputs / "f").write_text("first\n")
        (self.inputs / "sub").mkdir()
        (self.inputs / "sub" / "g").write_bytes(os.urandom(70_000))
        self.chown(self.mine)
        self.scripts = box.root / "scripts"
        self.scripts.mkdir(mode=0o755)
        box.write_config(CONFIG.format(stage=self.stage))

    def chown(self, top: Path) -> None:
        for root, dirs, names in os.walk(top):
            for n in [*dirs, *names]:
                os.lchown(Path(root) / n, self.user.uid, self.user.gid)
        os.lchown(top, self.user.uid, self.user.gid)

    def script(
        self,
        job: str,
        *lines: str,
        capacity: bool = True,
        shared: bool = True,
        after: tuple[str, ...] = (),
    ) -> Path:
        """The job's batch script: capacity and shared_tmpdir, then lines (default: the
        stage_in and stage_out of the inputs through /tmp/d), then its commands and the
        lines after them."""
        if not lines:
            lines = (
                f"#JOBNS stage_in source={self.inputs} destination=/tmp/d",
                f"#JOBNS stage_out source=/tmp/d destination={self.outputs}",
            )
        head = ["#!/bin/sh", "#SBATCH -N 1"]
        head += ["#BB_LUA pool=shared capacity=10M"] if capacity else []
        head += ["#JOBNS shared_tmpdir"] if shared else []
        path = self.scripts / f"job.{job}"
        path.write_text("\n".join([*head, *lines, "srun ./compute", *after, ""]))
        path.chmod(0o600)
        return path

    def setup(
        self,
        job: str,
        script: Path | None = None,
        user: OsUser | None = None,
        size: str = SIZE,
        extra: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        u = user or self.user
        return self.box.run(
            [
                "bb",
                "--job-id",
                job,
                "--uid",
                str(u.uid),
                "--gid",
                str(u.gid),
                "--script",
                str(script or self.script(job)),
                "--size",
                size,
                "--comment",
                "",
                *extra,
                "setup",
            ]
        )

    def step(self, job: str, step: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.box.run(["bb", "--job-id", job, *extra, step])

    def tree(self, job: str) -> Path:
        return self.box.shared / f"job-{job}"

    def records(self) -> Path:
        return self.box.shared / ".jobns-bb"

    def record_path(self, job: str) -> Path:
        return self.records() / f"job-{job}.json"

    def record(self, job: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.record_path(job).read_bytes())
        return doc

    def lock(self, job: str) -> Path:
        return self.box.state / "bb" / f"{job}.lock"

    def as_user(self, cmd: str, user: OsUser | None = None) -> subprocess.CompletedProcess[str]:
        u = user or self.user
        return subprocess.run(
            ["sh", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env=Sandbox.env(u, None),
            **Sandbox.creds(u),
        )

    def assert_gone(self, job: str) -> None:
        """Nothing of the job's buffer is left: no tree, no record, no lock file."""
        assert not os.path.lexists(self.tree(job))
        assert not os.path.lexists(self.record_path(job))
        assert not os.path.lexists(self.lock(job))


@pytest.fixture
def site(sandbox: Sandbox, users: list[OsUser]) -> Site:
    return Site(sandbox, users[0])


def ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def failed(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 125 and exactly one `jobns: ...` line on stderr naming each needle."""
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("jobns: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr
    return r.stderr


def sums(top: Path) -> dict[str, tuple[str, int, int]]:
    """relative path -> (sha256 or '->target' or 'dir', owner, mode) of everything below top."""
    out: dict[str, tuple[str, int, int]] = {}
    for root, dirs, names in os.walk(top):
        for n in [*dirs, *names]:
            p = Path(root) / n
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                what = "->" + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                what = "dir"
            else:
                what = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(top))] = (what, st.st_uid, stat.S_IMODE(st.st_mode))
    return out


def contents(top: Path) -> dict[str, str]:
    return {k: v[0] for k, v in sums(top).items()}


# ------------------------------------------------------------------------- the cycle


def test_the_whole_cycle(site: Site) -> None:
    box, alice = site.box, site.user
    r = site.setup("77", site.script("77", after=("#JOBNS bogus, ignored",)))
    ok(r)
    # Only the warning about the directive after the first command (slurmctld's log).
    assert r.stderr.count("\n") == 1 and "after the first command" in r.stderr, r.stderr
    tree = site.tree("77")
    st = os.lstat(tree)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (alice.uid, alice.gid)
    for child in ("tmp", "var_tmp"):
        cst = os.lstat(tree / child)
        assert stat.S_ISDIR(cst.st_mode) and cst.st_uid == alice.uid, child
    assert sorted(os.listdir(tree)) == ["tmp", "var_tmp"]
    assert os.listdir(tree / "tmp") == []
    # The record: root's, 0600, in root's 0700 directory.
    dst = os.lstat(site.records())
    assert stat.S_ISDIR(dst.st_mode) and dst.st_uid == 0 and stat.S_IMODE(dst.st_mode) == 0o700
    rst = os.lstat(site.record_path("77"))
    assert stat.S_ISREG(rst.st_mode) and rst.st_uid == 0 and stat.S_IMODE(rst.st_mode) == 0o600
    rec = site.record("77")
    assert rec["state"] == "set-up" and rec["layout"] == "shared" and rec["size"] == int(SIZE)
    assert (rec["uid"], rec["gid"], rec["user"]) == (alice.uid, alice.gid, alice.name)
    assert rec["tree_path"] == str(tree)
    assert [c["destination"] for c in rec["stage_in"]] == [f"{tree}/tmp/d"]
    assert [c["source"] for c in rec["stage_out"]] == [f"{tree}/tmp/d"]
    assert "srun" not in rec["script_header"] and "#JOBNS shared_tmpdir" in rec["script_header"]
    pools = json.loads((box.state / "bb" / "pools.json").read_text())
    (pool,) = pools["pools"]
    assert pool["id"] == "shared" and pool["granularity"] == 1 << 20
    assert isinstance(pool["quantity"], int) and 0 < pool["quantity"] <= 100

    before = sums(site.inputs)
    ok(site.step("77", "data-in"))
    copied = tree / "tmp" / "d"
    assert contents(copied) == contents(site.inputs)
    assert {v[1] for v in sums(copied).values()} == {alice.uid}  # copied as her
    assert os.lstat(copied).st_uid == alice.uid
    assert sums(site.inputs) == before  # a copy: the inputs stay
    assert site.record("77")["state"] == "staged-in"

    # The job writes its results into the shared tmpdir.
    ok(site.as_user(f"echo result > {copied}/result"))
    ok(site.step("77", "data-out"))
    assert (site.outputs / "result").read_text() == "result\n"
    assert (site.outputs / "f").read_text() == "first\n"
    assert {v[1] for v in sums(site.outputs).values()} == {alice.uid}
    assert site.record("77")["state"] == "staged-out"

    r = site.step("77", "teardown")
    ok(r)
    site.assert_gone("77")
    assert os.listdir(site.records()) == []
    assert box.leftovers() == [str(site.records())]
    assert own_mounts(box) == []
    assert (site.outputs / "result").read_text() == "result\n"  # the results stay


def test_every_step_is_idempotent(site: Site) -> None:
    tree = site.tree("78")
    ok(site.setup("78"))
    first = site.record("78")
    ok(site.setup("78"))
    assert site.record("78") == first
    ok(site.step("78", "data-in"))
    copy = tree / "tmp" / "d" / "f"
    assert copy.read_text() == "first\n"
    # A second data-in (slurmctld re-runs it after a restart) copies nothing again.
    (site.inputs / "f").write_text("second\n")
    (site.inputs / "new").write_text("new\n")
    site.chown(site.mine)
    ok(site.step("78", "data-in"))
    assert copy.read_text() == "first\n"
    assert not (tree / "tmp" / "d" / "new").exists()
    # Setup again without a teardown (a re-run), then data-in: still nothing copied twice.
    ok(site.setup("78"))
    assert site.record("78")["stage_in_done"] == [first["stage_in"][0]["line"]]
    ok(site.step("78", "data-in"))
    assert copy.read_text() == "first\n"
    ok(site.step("78", "data-out"))
    ok(site.step("78", "data-out"))
    assert (site.outputs / "f").read_text() == "first\n"
    ok(site.step("78", "teardown"))
    site.assert_gone("78")
    r = site.step("78", "teardown")
    ok(r)
    assert "Traceback" not in r.stderr
    site.assert_gone("78")
    assert site.box.leftovers() == [str(site.records())]


def test_data_out_after_the_teardown_leaves_nothing(site: Site) -> None:
    ok(site.setup("94"))
    ok(site.step("94", "data-in"))
    ok(site.step("94", "data-out"))
    ok(site.step("94", "teardown"))
    site.assert_gone("94")
    ok(site.step("94", "data-out"))  # slurmctld re-runs data-out after a restart
    assert not (site.outputs / "x").exists()
    site.assert_gone("94")


def test_a_failed_stage_in_names_the_directive(site: Site) -> None:
    missing = site.mine / "missing"
    bad_line = f"#JOBNS stage_in source={missing} destination=/tmp/m"
    script = site.script("79", f"#JOBNS stage_in source={site.inputs} destination=/tmp/d", bad_line)
    before = sums(site.mine)
    ok(site.setup("79", script))
    r = site.step("79", "data-in")
    message = failed(r, "bb data-in job 79", "stage-in failed", str(missing))
    assert bad_line in message or repr(bad_line) in message, message
    assert sums(site.mine) == before  # the inputs are untouched
    rec = site.record("79")
    assert rec["state"] == "set-up" and rec["errors"]
    assert rec["stage_in_done"] == [f"#JOBNS stage_in source={site.inputs} destination=/tmp/d"]
    status = site.step("79", "status")
    ok(status)
    assert "job 79 " in status.stdout and "stage_in 1/2" in status.stdout, status.stdout
    # Slurm tears a buffer down in a hurry after a failed stage-in.
    ok(site.step("79", "teardown", "--hurry"))
    site.assert_gone("79")
    assert sums(site.mine) == before


def test_a_failed_stage_out_keeps_the_outputs_until_it_succeeds(site: Site) -> None:
    locked = site.stage / "locked"
    locked.mkdir(mode=0o755)  # root's: she cannot write there
    script = site.script(
        "80",
        f"#JOBNS stage_in source={site.inputs} destination=/tmp/d",
        f"#JOBNS stage_out source=/tmp/d destination={locked}/out",
    )
    ok(site.setup("80", script))
    ok(site.step("80", "data-in"))
    tree = site.tree("80")
    ok(site.as_user(f"echo precious > {tree}/tmp/d/result"))
    kept = sums(tree)
    r = site.step("80", "data-out")
    failed(r, "bb data-out job 80", "stage-out failed", "--hurry teardown")
    assert not (locked / "out").exists()
    rec = site.record("80")
    assert rec["state"] == "stage-out-failed" and rec["errors"]
    # Slurm's teardown after a failed stage-out: the outputs are kept, and so is the record.
    r = site.step("80", "teardown")
    ok(r)
    assert "kept" in r.stderr, r.stderr
    assert sums(tree) == kept
    assert site.record("80")["state"] == "stage-out-failed"
    ok(site.step("80", "teardown"))  # again: still kept
    assert sums(tree) == kept
    # The administrator fixes the destination; data-out again delivers; teardown removes.
    os.chown(locked, site.user.uid, site.user.gid)
    ok(site.step("80", "data-out"))
    assert (locked / "out" / "result").read_text() == "precious\n"
    assert (locked / "out" / "result").stat().st_uid == site.user.uid
    assert site.record("80")["state"] == "staged-out"
    ok(site.step("80", "teardown"))
    site.assert_gone("80")
    assert site.box.leftovers() == [str(site.records())]


def test_hurry_discards_a_failed_stage_out(site: Site) -> None:
    locked = site.stage / "locked"
    locked.mkdir(mode=0o755)
    script = site.script(
        "81",
        f"#JOBNS stage_in source={site.inputs} destination=/tmp/d",
        f"#JOBNS stage_out source=/tmp/d destination={locked}/out",
    )
    ok(site.setup("81", script))
    ok(site.step("81", "data-in"))
    failed(site.step("81", "data-out"), "stage-out failed")
    ok(site.step("81", "teardown", "--hurry"))
    site.assert_gone("81")
    assert os.listdir(locked) == []
    assert site.box.leftovers() == [str(site.records())]


# ------------------------------------------------------------------------- refusals


def test_capacity_without_the_shared_layout_is_refused(site: Site) -> None:
    script = site.script("82", shared=False)
    failed(site.setup("82", script), "bb setup job 82", "capacity=", "shared_tmpdir")
    site.assert_gone("82")
    assert not os.path.lexists(site.tree("82"))
    assert site.box.leftovers() in ([], [str(site.records())])


@pytest.mark.parametrize("layout", ["shared_tmpdir=per-node", "shared_tmpdir=no"])
def test_capacity_with_another_layout_is_refused(site: Site, layout: str) -> None:
    script = site.script("83", f"#JOBNS {layout}", shared=False)
    failed(site.setup("83", script), "capacity=")
    site.assert_gone("83")


def test_without_capacity_a_local_job_gets_a_record_and_no_tree(site: Site) -> None:
    script = site.script("84", "#JOBNS shm capacity=1G", capacity=False, shared=False)
    ok(site.setup("84", script, size="0"))
    rec = site.record("84")
    assert rec["layout"] == "local" and rec["tree_path"] == "" and rec["size"] == 0
    assert rec["stage_in"] == [] and rec["stage_out"] == []
    assert not os.path.lexists(site.tree("84"))
    ok(site.step("84", "data-in"))
    ok(site.step("84", "data-out"))
    ok(site.step("84", "teardown"))
    site.assert_gone("84")


def test_a_bad_directive_fails_setup_naming_the_line(site: Site) -> None:
    script = site.script("85", "#JOBNS tmp capacity=2 GiB")
    failed(site.setup("85", script), "script line 5", "capacity=2 GiB")
    site.assert_gone("85")


def test_roots_job_is_refused(site: Site, sandbox: Sandbox) -> None:
    r = sandbox.run(
        [
            "bb",
            "--job-id",
            "86",
            "--uid",
            "0",
            "--gid",
            "0",
            "--script",
            str(site.script("86")),
            "--size",
            SIZE,
            "setup",
        ]
    )
    failed(r, "root")
    site.assert_gone("86")


@pytest.mark.parametrize(
    "job_id", ["../x", "1;rm", "1/../../etc", "-5", "77 ", "", "7\n", "0x4d", "1" * 11]
)
@pytest.mark.parametrize("step", ["setup", "data-in", "data-out", "teardown"])
def test_a_bad_job_id_is_refused_before_any_path(site: Site, job_id: str, step: str) -> None:
    before = sorted(os.listdir(site.box.shared)), sorted(os.listdir(site.box.state))
    ids = ["--uid", str(site.user.uid), "--gid", str(site.user.gid)]
    extra = [*ids, "--script", str(site.script("87")), "--size", SIZE] if step == "setup" else []
    r = site.box.run(["bb", "--job-id", job_id, *extra, step])
    failed(r, "job-id")
    assert (sorted(os.listdir(site.box.shared)), sorted(os.listdir(site.box.state))) == before
    assert not (site.box.state / "bb").exists()
    assert not site.records().exists()


def test_options_after_the_step_are_refused(site: Site) -> None:
    r = site.box.run(["bb", "setup", "--job-id", "88"])
    failed(r, "STEP")
    assert not site.records().exists()


def test_without_enabled_every_step_does_nothing(site: Site) -> None:
    """Check-only (burst_buffer.lua installed, [burst_buffer] not enabled): each step
    succeeds and makes nothing, saying why; the prolog stages as on any cluster. Only a
    job that asks for space in the pool, which such a cluster does not offer, fails."""
    site.box.write_config(f'[staging]\nstage_roots = ["{site.stage}"]\n')
    for r in (site.setup("89", size="0"), *(site.step("89", s) for s in STEPS)):
        ok(r)
        assert "[burst_buffer] enabled is not true" in r.stderr, r.stderr
    site.assert_gone("89")
    assert not site.records().exists()
    failed(site.setup("89"), "capacity=", "does not offer")
    r = site.step("89", "status")
    ok(r)
    assert "enabled is not set" in r.stdout, r.stdout


STEPS = ("data-in", "data-out", "teardown")


def test_status_and_pools(site: Site) -> None:
    ok(site.setup("90"))
    r = site.step("90", "status")
    ok(r)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("jobns burst buffer: pool shared: "), r.stdout
    assert any(
        ln.startswith(f"job 90 user {site.user.name}: set-up, layout shared, size {SIZE}")
        for ln in lines
    ), r.stdout
    assert f"tree {site.tree('90')}" in r.stdout
    ok(site.step("90", "data-in"))
    r = site.box.run(["bb", "status"])  # no job id needed
    ok(r)
    assert "job 90 " in r.stdout and "staged-in" in r.stdout and "stage_in 1/1" in r.stdout
    r = site.box.run(["bb", "pools"])
    ok(r)
    (pool,) = json.loads(r.stdout)["pools"]
    for key in ("quantity", "granularity", "free"):
        assert isinstance(pool[key], int) and not isinstance(pool[key], bool), (key, pool)
    assert pool["free"] <= pool["quantity"] <= 100
    assert (site.box.state / "bb" / "pools.json").read_text() == r.stdout
    ok(site.step("90", "teardown"))
    r = site.box.run(["bb", "status"])
    ok(r)
    assert "job 90" not in r.stdout


# ----------------------------------------------------------- the prolog and the epilog


def test_the_prolog_and_epilog_of_a_burst_buffer_job(site: Site) -> None:
    box, alice = site.box, site.user
    extra_in = site.mine / "extra"
    extra_in.write_text("for the node\n")
    site.chown(site.mine)
    script = site.script(
        "91",
        f"#JOBNS stage_in source={site.inputs} destination=/tmp/d",
        f"#JOBNS stage_out source=/tmp/d destination={site.outputs}",
        f"#JOBNS stage_in source={extra_in} destination=/dev/shm/e",
        f"#JOBNS stage_out source=/dev/shm/e destination={site.mine}/e-out",
    )
    ok(site.setup("91", script))
    rec = site.record("91")
    assert len(rec["stage_in"]) == 1 and len(rec["stage_out"]) == 1  # the tree's only
    ok(site.step("91", "data-in"))
    tree = site.tree("91")
    # The burst buffer's inputs are gone from the stage root: the prolog must not need them.
    for root, dirs, names in os.walk(site.inputs, topdown=False):
        for n in names:
            os.unlink(Path(root) / n)
        for n in dirs:
            os.rmdir(Path(root) / n)
    os.rmdir(site.inputs)
    env = Sandbox.env(None, None)
    assert "SLURM_JOB_COMMENT" not in env
    r = box.run(["setup", "--job-id", "91", "--user", alice.name])
    ok(r)
    assert "refused" not in r.stderr, r.stderr
    # The job's /tmp is the burst buffer's shared tree, with the copies it made.
    task = box.run(["run", "--job-id", "91", "--", "cat", "/tmp/d/f"], user=alice)
    ok(task)
    assert task.stdout == "first\n"
    task = box.run(
        [
            "run",
            "--job-id",
            "91",
            "--",
            "sh",
            "-c",
            "echo result > /tmp/d/result && cat /dev/shm/e && echo v > /var/tmp/v",
        ],
        user=alice,
    )
    ok(task)
    assert task.stdout == "for the node\n"  # the prolog's own stage_in
    assert (tree / "tmp" / "d" / "result").read_text() == "result\n"
    assert (tree / "var_tmp" / "v").read_text() == "v\n"
    # The epilog: its own stage_out done, the burst buffer's left, the tree left in place.
    r = box.run(["teardown", "--job-id", "91"])
    ok(r)
    box.wait_released()
    assert (site.mine / "e-out").read_text() == "for the node\n"
    assert not site.outputs.exists()
    assert (tree / "tmp" / "d" / "result").read_text() == "result\n"
    assert os.lstat(tree).st_uid == alice.uid
    assert site.record("91")["state"] == "staged-in"
    jobs = box.state / "jobs"
    assert not jobs.exists() or os.listdir(jobs) == []
    assert own_mounts(box) == []
    # Then the burst buffer's own end.
    ok(site.step("91", "data-out"))
    assert (site.outputs / "result").read_text() == "result\n"
    assert (site.outputs / "f").read_text() == "first\n"
    ok(site.step("91", "teardown"))
    site.assert_gone("91")
    assert box.leftovers() == [str(site.records())]


def test_the_prolog_takes_the_records_directives(site: Site) -> None:
    """The prolog gets no script from Slurm: the record's header is where the job's
    #JOBNS lines come from (here: the shared layout and a /dev/shm capacity)."""
    box, alice = site.box, site.user
    script = site.script("92", "#JOBNS shm capacity=64M")
    ok(site.setup("92", script, size="0"))
    r = box.run(["setup", "--job-id", "92", "--user", alice.name])
    ok(r)
    task = box.run(
        ["run", "--job-id", "92", "--", "sh", "-c", "df -B1 --output=size /dev/shm | tail -1"],
        user=alice,
    )
    ok(task)
    assert int(task.stdout) == 64 << 20
    ok(box.run(["run", "--job-id", "92", "--", "sh", "-c", "echo x > /tmp/x"], user=alice))
    assert (site.tree("92") / "tmp" / "x").read_text() == "x\n"
    ok(box.run(["teardown", "--job-id", "92"]))
    box.wait_released()
    assert site.tree("92").is_dir()
    ok(site.step("92", "teardown"))
    site.assert_gone("92")
    assert box.leftovers() == [str(site.records())]


def test_a_prolog_without_a_record_sets_the_job_up_alone(site: Site) -> None:
    """A job the burst buffer never saw (no record): the prolog is the usual one."""
    box, alice = site.box, site.user
    r = box.run(["setup", "--job-id", "93", "--user", alice.name])
    ok(r)
    ok(box.run(["run", "--job-id", "93", "--", "sh", "-c", "echo x > /tmp/x"], user=alice))
    assert (box.local / "job-93" / "tmp" / "x").exists()
    assert not os.path.lexists(site.tree("93"))
    ok(box.run(["teardown", "--job-id", "93"]))
    assert box.leftovers() == []


def test_the_prolog_takes_the_comments_directives_from_the_record(site: Site) -> None:
    box, alice = site.box, site.user
    script = site.script("95", shared=False)
    ok(site.setup("95", script, extra=("--comment", "jobns: shared_tmpdir")))
    assert site.record("95")["layout"] == "shared"
    ok(site.step("95", "data-in"))
    ok(box.run(["setup", "--job-id", "95", "--user", alice.name]))
    task = box.run(
        ["run", "--job-id", "95", "--", "sh", "-c", "cat /tmp/d/f; echo r > /tmp/d/result"],
        user=alice,
    )
    ok(box.run(["teardown", "--job-id", "95"]))
    box.wait_released()
    data_out = site.step("95", "data-out")
    ok(site.step("95", "teardown", "--hurry"))
    assert task.returncode == 0 and task.stdout == "first\n", task.stderr
    ok(data_out)
    assert (site.outputs / "result").read_text() == "r\n"  # the job's result is not lost


def test_the_prolog_never_takes_another_users_record(site: Site, users: list[OsUser]) -> None:
    box, alice, bob = site.box, users[0], users[1]
    locked = site.stage / "locked"
    locked.mkdir(mode=0o755)
    script = site.script(
        "96",
        "#JOBNS shm capacity=32M",
        f"#JOBNS stage_in source={site.inputs} destination=/tmp/d",
        f"#JOBNS stage_out source=/tmp/d destination={locked}/out",
    )
    ok(site.setup("96", script))
    ok(site.step("96", "data-in"))
    failed(site.step("96", "data-out"), "stage-out failed")
    ok(site.step("96", "teardown"))  # her outputs kept, with the record
    kept = sums(site.tree("96"))
    # Job id 96 again (a new controller's), bob's, with no burst buffer.
    setup = box.run(["setup", "--job-id", "96", "--user", bob.name])
    task = box.run(
        ["run", "--job-id", "96", "--", "sh", "-c", "echo x > /tmp/x; ls /tmp"], user=bob
    )
    his_tmp_local = (box.local / "job-96" / "tmp" / "x").exists()
    ok(box.run(["teardown", "--job-id", "96"]))
    box.wait_released()
    moved = sorted(box.shared.glob("job-96~moved-*"))
    her_tree_kept = os.path.isdir(site.tree("96")) and sums(site.tree("96")) == kept
    ok(site.step("96", "teardown", "--hurry"))
    ok(setup)
    assert "refused" not in setup.stderr, setup.stderr
    assert task.returncode == 0, task.stderr
    assert his_tmp_local  # an ordinary job of his: /tmp on the node
    assert moved == [] and her_tree_kept  # her kept outputs stay where they were
    assert alice.uid != bob.uid


def test_the_prolog_takes_the_jobs_tmp_from_the_record(site: Site) -> None:
    """[capacity] tmp_from_slurm = "scontrol": a burst-buffer job's --tmp (job_info's
    pn_min_tmp_disk, MiB) comes from the record; squeue is never asked."""
    box, alice = site.box, site.user
    box.write_config(CONFIG.format(stage=site.stage) + '[capacity]\ntmp_from_slurm = "scontrol"\n')
    script = site.script("97", "#JOBNS shm capacity=8M", capacity=False, shared=False)
    ok(site.setup("97", script, size="0", extra=("--tmp-mib", "24")))
    r = box.run(["setup", "--dry-run", "--job-id", "97", "--user", alice.name])
    ok(r)
    assert "squeue" not in r.stderr, r.stderr
    assert f"size={24 << 20} (24.0 MiB) on the tmp tree" in r.stdout, r.stdout
    assert f"size={8 << 20} (8.0 MiB) on the shm tree" in r.stdout, r.stdout  # the header's
    ok(site.step("97", "teardown"))
    site.assert_gone("97")
