"""Staging for real (root): ARC session dir <-> scratch, on one and across file systems,
with and without a movetool; #JOBNS stage_in/stage_out with symbols and traversal
attempts; a full session file system in the middle of stage-out."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, assert_refused, job_mounts, require

pytestmark = pytest.mark.root

PART = ".jobns-part-"


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "jobns-test", str(path)],
        check=True,
    )


class Arc:
    """An ARC-like site in the sandbox: session roots, a scratchdir, a stage root."""

    def __init__(self, box: Sandbox, user: OsUser) -> None:
        self.box = box
        self.user = user
        self.sessions = box.root / "sessions"
        self.scratch = box.root / "scratch"
        self.stage = box.root / "stage"
        self.mounted: list[Path] = []
        for d in (self.sessions, self.scratch, self.stage):
            d.mkdir(exist_ok=True)
            d.chmod(0o755)
        (self.stage / user.name).mkdir(exist_ok=True)
        os.chown(self.stage / user.name, user.uid, user.gid)

    def separate(self, which: str, size: str = "64m") -> None:
        """Put the session roots or the scratchdir on a file system of their own."""
        path = self.sessions if which == "sessions" else self.scratch
        mount_tmpfs(path, size)
        self.mounted.append(path)

    def configure(self, movetool: str = "", shared: bool = True, extra: str = "") -> None:
        tool = f"movetool = {json.dumps(movetool)}\n" if movetool else ""
        self.box.write_config(
            f"[arc]\nshared_filesystem = {'true' if shared else 'false'}\n"
            f'scratchdir = "{self.scratch}"\n{tool}'
            f'[staging]\nsession_roots = ["{self.sessions}"]\nstage_roots = ["{self.stage}"]\n'
            + extra
        )

    def session(self, arc_id: str, files: dict[str, bytes]) -> Path:
        d = self.sessions / arc_id
        d.mkdir()
        for rel, data in files.items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        self.chown(d)
        return d

    def chown(self, top: Path) -> None:
        for root, dirs, names in os.walk(top):
            for n in [*dirs, *names]:
                os.lchown(Path(root) / n, self.user.uid, self.user.gid)
        os.lchown(top, self.user.uid, self.user.gid)

    def close(self) -> None:
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def arc(sandbox: Sandbox, users: list[OsUser]) -> Iterator[Arc]:
    site = Arc(sandbox, users[0])
    yield site
    site.close()


def tree_sums(top: Path) -> dict[str, str]:
    """relative path -> sha256 of every file (and '->target' of every symlink) below top."""
    out: dict[str, str] = {}
    for root, _dirs, names in os.walk(top):
        for n in names:
            p = Path(root) / n
            rel = str(p.relative_to(top))
            out[rel] = (
                f"->{os.readlink(p)}"
                if p.is_symlink()
                else hashlib.sha256(p.read_bytes()).hexdigest()
            )
    return out


def sums(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


INPUTS = {
    "script.sh": b"#!/bin/sh\necho job\n",
    "in/a.dat": os.urandom(200_000),
    "in/deep/b.dat": os.urandom(3000),
    "in/empty": b"",
    "stdout": b"before the job\n",
}


def setup(
    box: Sandbox, job: str, user: OsUser, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return box.run(["setup", "--job-id", job, "--user", user.name, *extra], env=env)


def run_job(box: Sandbox, job: str, user: OsUser, cmd: str) -> str:
    r = box.run(["run", "--job-id", job, "--", "sh", "-c", cmd], user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout


def teardown(box: Sandbox, job: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The epilog, and its release process (launcher.lifecycle.release) done."""
    r = box.run(["teardown", "--job-id", job, *extra])
    box.wait_released()
    return r


def refused(
    box: Sandbox, job: str, user: OsUser, r: subprocess.CompletedProcess[str], needle: str
) -> None:
    """The job's own inputs or request made it impossible: refused, not the node's fault."""
    assert_refused(box, job, user, r, needle)


def assert_gone(box: Sandbox, site: Arc, job: str) -> None:
    assert box.leftovers() == []
    assert [m for m in job_mounts(box) if " - tmpfs jobns-test " not in m] == []
    jobs = box.state / "jobs"  # absent when the job was rejected before setup began
    assert not jobs.exists() or sorted(os.listdir(jobs)) == []
    assert sorted(os.listdir(site.scratch)) in ([], ["lost+found"])


# The job: reads its inputs in scratch, writes outputs there and appends to stdout.
JOB = (
    "cd {scratch} && sha256sum in/a.dat > out.sum && cat script.sh >> stdout && "
    "mkdir -p results/sub && head -c 300000 /dev/urandom > results/r.bin && "
    "echo x > results/sub/x && ln -s r.bin results/link && echo err >> stderr"
)


@pytest.mark.parametrize("layout", ["same-fs", "scratch-elsewhere", "sessions-elsewhere"])
def test_session_moves_to_scratch_and_back(sandbox: Sandbox, arc: Arc, layout: str) -> None:
    if layout == "scratch-elsewhere":
        arc.separate("scratch")
    elif layout == "sessions-elsewhere":
        arc.separate("sessions")
    arc.configure()
    alice = arc.user
    session = arc.session("ARCabc1", INPUTS)
    r = setup(sandbox, "s1", alice, "--session-dir", str(session))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    scratch = arc.scratch / "ARCabc1"
    # ARC's session staging: everything moved, stdout/stderr stay and are symlinked into scratch.
    assert sorted(os.listdir(session)) == ["stderr", "stdout"]
    assert os.readlink(scratch / "stdout") == f"{session}/stdout"
    assert os.readlink(scratch / "stderr") == f"{session}/stderr"
    moved = {k: v for k, v in sums(INPUTS).items() if k != "stdout"}
    assert {k: v for k, v in tree_sums(scratch).items() if not v.startswith("->")} == moved
    assert (scratch / "in/a.dat").stat().st_uid == alice.uid
    assert scratch.stat().st_mode & 0o777 == 0o700
    env = run_job(sandbox, "s1", alice, "echo $RUNTIME_LOCAL_SCRATCH_DIR")
    assert env.strip() == str(arc.scratch)
    run_job(sandbox, "s1", alice, JOB.format(scratch=scratch))
    r = teardown(sandbox, "s1")
    assert r.returncode == 0, r.stderr
    after = tree_sums(session)
    for k, v in moved.items():
        assert after[k] == v, k  # every input back, intact
    assert (session / "stdout").read_bytes() == INPUTS["stdout"] + INPUTS["script.sh"]
    assert after["results/link"] == "->r.bin"
    assert set(after) >= {"out.sum", "results/r.bin", "results/sub/x", "stderr"}
    assert not any(PART in k for k in after)
    assert not scratch.exists()
    assert_gone(sandbox, arc, "s1")


@pytest.mark.parametrize("tool", ["cp -a", "rsync -a", "/usr/bin/rsync -a --inplace"])
def test_movetool_across_file_systems(sandbox: Sandbox, arc: Arc, tool: str) -> None:
    require(shutil.which(tool.split()[0]) is not None, f"{tool.split()[0]} is not installed")
    arc.separate("scratch")
    arc.configure(movetool=tool)
    alice = arc.user
    session = arc.session("ARCtool", INPUTS)
    r = setup(sandbox, "s2", alice, "--session-dir", str(session))
    assert r.returncode == 0, r.stderr
    scratch = arc.scratch / "ARCtool"
    assert tree_sums(scratch)["in/a.dat"] == sums(INPUTS)["in/a.dat"]
    assert not any(n.startswith(PART) for n in os.listdir(scratch))
    run_job(sandbox, "s2", alice, JOB.format(scratch=scratch))
    assert teardown(sandbox, "s2").returncode == 0
    after = tree_sums(session)
    assert after["in/deep/b.dat"] == sums(INPUTS)["in/deep/b.dat"]
    assert after["results/link"] == "->r.bin" and "results/r.bin" in after
    assert not any(PART in k for k in after)
    assert_gone(sandbox, arc, "s2")


def test_movetool_that_fails_keeps_everything(sandbox: Sandbox, arc: Arc) -> None:
    arc.separate("scratch")
    arc.configure(movetool="/bin/false")
    session = arc.session("ARCfail", INPUTS)
    before = tree_sums(session)
    r = setup(sandbox, "s3", arc.user, "--session-dir", str(session))
    assert "movetool /bin/false" in r.stderr and "is kept" in r.stderr
    refused(sandbox, "s3", arc.user, r, "stage-in failed")
    assert tree_sums(session) == before  # nothing moved, nothing lost
    assert_gone(sandbox, arc, "s3")


def test_mv_as_movetool_is_refused(sandbox: Sandbox, arc: Arc) -> None:
    arc.configure(movetool="mv -f")
    session = arc.session("ARCmv", INPUTS)
    before = tree_sums(session)
    r = setup(sandbox, "s4", arc.user, "--session-dir", str(session))
    assert r.returncode == 125 and "deletes its sources itself" in r.stderr
    assert tree_sums(session) == before
    assert_gone(sandbox, arc, "s4")


def test_not_shared_session_moves_stdout_too(sandbox: Sandbox, arc: Arc) -> None:
    arc.separate("scratch")
    arc.configure(shared=False)
    session = arc.session("ARCns", INPUTS)
    assert setup(sandbox, "s5", arc.user, "--session-dir", str(session)).returncode == 0
    scratch = arc.scratch / "ARCns"
    assert os.listdir(session) == [] and not (scratch / "stdout").is_symlink()
    assert run_job(sandbox, "s5", arc.user, "echo $RUNTIME_NODE_SEES_FRONTEND.") == ".\n"
    run_job(sandbox, "s5", arc.user, f"echo more >> {scratch}/stdout")
    assert teardown(sandbox, "s5").returncode == 0
    assert (session / "stdout").read_bytes() == INPUTS["stdout"] + b"more\n"
    assert_gone(sandbox, arc, "s5")


def test_session_dir_from_the_work_dir_template_and_dynamic_scratch(
    sandbox: Sandbox, arc: Arc
) -> None:
    arc.configure(extra='session_dir = "%d"\ndynamic_scratch = true\n')
    session = arc.session("ARCdyn", INPUTS)
    r = setup(sandbox, "77", arc.user, env={"SLURM_JOB_WORK_DIR": str(session)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    scratch = arc.scratch / "77" / "ARCdyn"  # <scratchdir>/<lrms-job-id>/<arc-job-id>
    assert (scratch / "script.sh").exists()
    assert run_job(sandbox, "77", arc.user, "echo $RUNTIME_LOCAL_SCRATCH_DIR").strip() == str(
        arc.scratch / "77"
    )
    assert teardown(sandbox, "77").returncode == 0
    assert tree_sums(session)["in/a.dat"] == sums(INPUTS)["in/a.dat"]
    assert not (arc.scratch / "77").exists()
    # A job whose working directory is not a session directory is not an ARC job.
    other = sandbox.root / "home"
    other.mkdir()
    r = setup(sandbox, "78", arc.user, env={"SLURM_JOB_WORK_DIR": str(other)})
    assert r.returncode == 0 and "no session staging" in r.stderr, r.stderr
    assert teardown(sandbox, "78").returncode == 0
    assert_gone(sandbox, arc, "78")


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("/etc", "outside the allowed directories"),
        ("{sessions}/../etc", "contains '..'"),
        ("{sessions}", "directly below one of"),
        ("{sessions}/a/b", "directly below one of"),
        ("{sessions}/missing", "No such file or directory"),
        ("{sessions}/bobs", "owned by the job user"),
        ("{sessions}/link", "owned by the job user"),
    ],
)
def test_bad_session_dirs_are_refused(
    sandbox: Sandbox, arc: Arc, users: list[OsUser], flag: str, needle: str
) -> None:
    arc.configure()
    bobs = arc.sessions / "bobs"
    bobs.mkdir()
    os.chown(bobs, users[1].uid, users[1].gid)
    (arc.sessions / "link").symlink_to(arc.session("ARCreal", {"f": b"x"}))
    r = setup(sandbox, "s6", arc.user, "--session-dir", flag.format(sessions=arc.sessions))
    if needle in ("No such file or directory", "owned by the job user"):
        refused(sandbox, "s6", arc.user, r, needle)  # the job's own session directory
    else:
        assert r.returncode == 125 and needle in r.stderr, r.stderr  # the site's flag
    assert (arc.sessions / "ARCreal" / "f").read_bytes() == b"x"
    assert_gone(sandbox, arc, "s6")


# ------------------------------------------------------------------ stage_in / stage_out


def directives_script(box: Sandbox, *lines: str) -> Path:
    p = box.root / "batch.sh"
    p.write_text(
        "#!/bin/sh\n#SBATCH -N1\n" + "".join(f"#JOBNS {ln}\n" for ln in lines) + "srun true\n"
    )
    return p


def test_stage_in_and_out_directives_with_symbols(sandbox: Sandbox, arc: Arc) -> None:
    arc.configure()
    alice = arc.user
    home = arc.stage / alice.name
    (home / "in.dat").write_bytes(INPUTS["in/a.dat"])
    (home / "tree" / "sub").mkdir(parents=True)
    (home / "tree" / "sub" / "f").write_bytes(b"f\n")
    (home / "%j").write_bytes(b"literal\n")  # reached only through the \\ escape
    arc.chown(home)
    s = arc.stage
    script = directives_script(
        sandbox,
        f"stage_in source={s}/%u/in.dat destination=/tmp/in.dat",
        f"stage_in source={s}/%u/tree destination=/dev/shm/tree",
        f"stage_in source={s}/%u/\\\\%j destination=/var/tmp/lit",
        f"stage_in source={s}/%u/%%j destination=/tmp/pct",
        f"stage_out source=/tmp/result destination={s}/%u/out-%j-%x",
        f"stage_out source=/dev/shm/tree destination={s}/%u/tree-back",
        f"stage_out source=/tmp/never-written destination={s}/%u/none",
    )
    r = setup(sandbox, "s7", alice, "--script", str(script), env={"SLURM_JOB_NAME": "sim"})
    assert r.returncode == 0, r.stderr
    out = run_job(
        sandbox,
        "s7",
        alice,
        "sha256sum < /tmp/in.dat; cat /dev/shm/tree/sub/f "
        "/var/tmp/lit /tmp/pct; echo res > /tmp/result; echo new > /dev/shm/tree/g",
    )
    assert out.split() == [sums(INPUTS)["in/a.dat"], "-", "f", "literal", "literal"]
    r = teardown(sandbox, "s7")
    assert r.returncode == 0, r.stderr
    assert "/tmp/never-written" in r.stderr or "never-written" in r.stderr  # a warning only
    assert (home / "out-s7-sim").read_bytes() == b"res\n"
    assert (home / "out-s7-sim").stat().st_uid == alice.uid
    assert (home / "tree-back" / "g").read_bytes() == b"new\n"
    assert (home / "tree-back" / "sub" / "f").read_bytes() == b"f\n"
    assert not (home / "none").exists()
    assert_gone(sandbox, arc, "s7")


@pytest.mark.parametrize(
    ("line", "env", "needle"),
    [
        ("stage_in source={s}/%u/../../../etc/shadow destination=/tmp/x", {}, "contains '..'"),
        ("stage_in source=/etc/shadow destination=/tmp/x", {}, "outside the allowed directories"),
        (
            "stage_in source={s}/%x destination=/tmp/x",
            {"SLURM_JOB_NAME": "../../etc"},
            "cannot be substituted for %x",
        ),
        (
            "stage_in source={s}/%x/y destination=/tmp/x",
            {"SLURM_JOB_NAME": "a/b"},
            "it contains '/'",
        ),
        (
            "stage_in source=%d/shadow destination=/tmp/x",
            {"SLURM_JOB_WORK_DIR": "/etc"},
            "outside the allowed directories",
        ),
        ("stage_in source={s}/%u/f destination=/etc/cron.d/x", {}, "outside the allowed"),
        ("stage_in source={s}/%u/f destination=/tmp/../etc/x", {}, "contains '..'"),
        (
            "stage_in source={s}/%u/f destination=%d/x",
            {"SLURM_JOB_WORK_DIR": "/tmp/../root"},
            "cannot be substituted for %d",
        ),
        ("stage_out source=/root/.ssh destination={s}/%u/x", {}, "outside the allowed"),
        ("stage_in source={s}/%q destination=/tmp/x", {}, "unknown symbol '%q'"),
        ("stage_in source={s}/x% destination=/tmp/x", {}, "lone '%'"),
        ("stage_in source=relative destination=/tmp/x", {}, "relative"),
    ],
)
def test_traversal_and_bad_symbols_reject_the_job_naming_the_line(
    sandbox: Sandbox, arc: Arc, line: str, env: dict[str, str], needle: str
) -> None:
    arc.configure()
    script = directives_script(sandbox, "shm capacity=1MiB", line.format(s=arc.stage))
    r = setup(sandbox, "s8", arc.user, "--script", str(script), env=env)
    assert "line 4" in r.stderr
    refused(sandbox, "s8", arc.user, r, needle)
    assert_gone(sandbox, arc, "s8")


def test_symlink_inside_a_stage_root_reaches_only_what_the_user_may_read(
    sandbox: Sandbox, arc: Arc
) -> None:
    """Confinement is lexical; the copy runs as the job user, so a symlink to a
    root-only file gets the job rejected, and nothing of the file is copied."""
    arc.configure()
    secret = sandbox.root / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    link = arc.stage / arc.user.name / "innocent"
    link.symlink_to(secret)
    os.lchown(link, arc.user.uid, arc.user.gid)
    script = directives_script(sandbox, f"stage_in source={link} destination=/tmp/loot")
    r = setup(sandbox, "s9", arc.user, "--script", str(script))
    assert "stage-in failed" in r.stderr
    refused(sandbox, "s9", arc.user, r, "Permission denied")
    assert_gone(sandbox, arc, "s9")
    # And a stage_out destination symlinked to a root-owned place cannot be written.
    target = sandbox.root / "rootdir"
    target.mkdir(mode=0o755)
    out_link = arc.stage / arc.user.name / "outlink"
    out_link.symlink_to(target)
    os.lchown(out_link, arc.user.uid, arc.user.gid)
    script = directives_script(sandbox, f"stage_out source=/tmp/o destination={out_link}/planted")
    assert setup(sandbox, "s10", arc.user, "--script", str(script)).returncode == 0
    run_job(sandbox, "s10", arc.user, "echo o > /tmp/o")
    r = teardown(sandbox, "s10")  # the user's destination: her job keeps it, not the node
    assert r.returncode == 0 and "Permission denied" in r.stderr, r.stderr
    assert "kept in staging-out" in r.stderr
    assert not (target / "planted").exists()
    rec = json.loads((sandbox.state / "jobs/s10/state.json").read_text())
    assert rec["state"] == "staging-out"
    # The administrator decides: --hurry discards what could not be staged out.
    r = teardown(sandbox, "s10", "--hurry")
    assert r.returncode == 0, r.stderr
    assert_gone(sandbox, arc, "s10")


def test_stage_in_into_a_capacity_that_is_too_small_fails_cleanly(
    sandbox: Sandbox, arc: Arc
) -> None:
    arc.configure()
    big = arc.stage / arc.user.name / "big"
    big.write_bytes(b"\0" * (2 * 1024 * 1024))
    arc.chown(big)
    script = directives_script(
        sandbox, "tmp capacity=1MiB", f"stage_in source={big} destination=/tmp/big"
    )
    r = setup(sandbox, "s11", arc.user, "--script", str(script))
    refused(sandbox, "s11", arc.user, r, "No space left on device")
    assert_gone(sandbox, arc, "s11")


# ------------------------------------------------------------------------- full disk


def test_full_session_fs_mid_stage_out_loses_nothing(sandbox: Sandbox, arc: Arc) -> None:
    arc.separate("sessions", size="1m")
    arc.configure()
    alice = arc.user
    inputs = {"in.txt": b"input\n", "stdout": b""}
    session = arc.session("ARCfull", inputs)
    assert setup(sandbox, "s12", alice, "--session-dir", str(session)).returncode == 0
    scratch = arc.scratch / "ARCfull"
    outputs = {
        "a.dat": os.urandom(300_000),
        "b.dat": os.urandom(300_000),
        "c.dat": os.urandom(600_000),
        "d.dat": os.urandom(100_000),
    }
    for name, data in outputs.items():
        (scratch / name).write_bytes(data)
        os.chown(scratch / name, alice.uid, alice.gid)
    r = teardown(sandbox, "s12")
    assert r.returncode == 0, r.stderr  # the epilog succeeds: the node stays in service
    assert "No space left on device" in r.stderr and "kept in staging-out" in r.stderr
    rec = json.loads((sandbox.state / "jobs/s12/state.json").read_text())
    assert rec["state"] == "staging-out" and rec["errors"]
    want = {**sums(outputs), "in.txt": sums(inputs)["in.txt"]}
    in_session, in_scratch = tree_sums(session), tree_sums(scratch)
    for name, digest in want.items():
        # Whole in one place or the other (or both), never only half somewhere.
        places = [p for p in (in_session, in_scratch) if p.get(name) == digest]
        assert places, name
        for p in (in_session, in_scratch):
            assert p.get(name) in (None, digest), name
    assert not any(k.startswith(PART) for k in in_session)  # no half file, even hidden
    assert "c.dat" in in_scratch and "c.dat" not in in_session
    # No task may join a job that is ending.
    r = sandbox.run(["run", "--job-id", "s12", "--", "true"], user=alice)
    assert r.returncode == 125 and "is ending" in r.stderr
    # The administrator frees space; teardown again resumes and finishes.
    subprocess.run(["mount", "-o", "remount,size=16m", str(arc.sessions)], check=True)
    r = teardown(sandbox, "s12")
    assert r.returncode == 0, r.stderr
    empty = hashlib.sha256(b"").hexdigest()
    assert tree_sums(session) == {**want, "stdout": empty, "stderr": empty}
    assert_gone(sandbox, arc, "s12")
