"""States, programs and crashes for real (root): SIGKILL jobns in every state, then
`jobns recover`; every output intact (checksums) and nothing left behind.

The kills are real: JOBNS_TEST_PAUSE_IN=<state> makes jobns stop itself (SIGSTOP) on
entering that state (``<state>@N``: its staging worker, after the Nth file is in place),
or a movetool blocks on a gate; the test then SIGKILLs jobns's whole process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox
from tests.integration.test_staging import (
    PART,
    Arc,
    assert_gone,
    run_job,
    sums,
    tree_sums,
)

pytestmark = pytest.mark.root

INPUTS = {f"in/f{i}.dat": os.urandom(50_000 + i) for i in range(6)} | {
    "script.sh": b"#!/bin/sh\n",
    "stdout": b"start\n",
}
MOVED_IN = {k: v for k, v in sums(INPUTS).items() if k != "stdout"}


class Site:
    def __init__(self, box: Sandbox, arc: Arc) -> None:
        self.box, self.arc = box, arc
        self.log = box.root / "programs.log"
        self.log.touch()
        self.hook = box.root / "hook.sh"
        self.hook.write_text(
            f'#!/bin/sh\necho "$JOBNS_STATE $JOBNS_JOB_ID $JOBNS_USER '
            f'$JOBNS_SCRATCH_DIR $TMPDIR" >> {self.log}\n'
            '[ ! -e "$JOBNS_HOST_TMP/fail-$JOBNS_STATE" ] || exit 3\n'
        )
        self.hook.chmod(0o755)
        arc.separate("scratch")  # session and scratch on two file systems: per-file copies
        self.configure()
        self.session = arc.session("ARCjob1", INPUTS)
        home = arc.stage / arc.user.name
        (home / "in.cfg").write_bytes(b"config\n")
        arc.chown(home)
        self.script = box.root / "batch.sh"
        self.script.write_text(
            "#!/bin/sh\n#SBATCH -N1\n#JOBNS shm capacity=4MiB\n#JOBNS tmp capacity=8MiB\n"
            f"#JOBNS stage_in source={arc.stage}/%u/in.cfg destination=/tmp/in.cfg\n"
            f"#JOBNS stage_out source=/tmp/result destination={arc.stage}/%u/result-%j\n"
            "srun true\n"
        )

    def configure(self, movetool: str = "") -> None:
        self.arc.configure(
            movetool=movetool,
            extra=(
                f'[lifecycle]\npre_run = "{self.hook}"\npost_run = "{self.hook}"\n'
                "program_timeout = 30\n"
            ),
        )

    def setup_args(self, job: str) -> list[str]:
        return [
            "setup",
            "--job-id",
            job,
            "--user",
            self.arc.user.name,
            "--script",
            str(self.script),
            "--session-dir",
            str(self.session),
        ]

    @property
    def scratch(self) -> Path:
        return self.arc.scratch / "ARCjob1"

    def work(self, job: str) -> dict[str, bytes]:
        """The job: checks its inputs, writes outputs in scratch, /tmp and stdout."""
        out = run_job(
            self.box,
            job,
            self.arc.user,
            f"cd {self.scratch} && sha256sum in/f0.dat && cat /tmp/in.cfg && "
            "head -c 400000 /dev/urandom > out.bin && mkdir -p res && "
            "echo r > res/r.txt && echo line >> stdout && echo done > /tmp/result && "
            "head -c 1000000 /dev/urandom > /dev/shm/seg",
        )
        assert out.split()[0] == sums(INPUTS)["in/f0.dat"]
        assert "config" in out
        return {"out.bin": (self.scratch / "out.bin").read_bytes(), "res/r.txt": b"r\n"}

    def check_final(self, job: str, outputs: dict[str, bytes], ran: bool = True) -> None:
        after = tree_sums(self.session)
        for k, v in MOVED_IN.items():
            assert after.get(k) == v, k
        for k, v in sums(outputs).items():
            assert after.get(k) == v, k
        if ran:
            assert (self.session / "stdout").read_bytes() == b"start\nline\n"
            result = self.arc.stage / self.arc.user.name / f"result-{job}"
            assert result.read_bytes() == b"done\n"
        assert not any(PART in k for k in after)
        assert_gone(self.box, self.arc, job)

    def assert_whole(self, expected: dict[str, str]) -> None:
        """Each file whole in the session directory or in scratch (or both), and any copy
        under its own name whole: only part files may be half-written."""
        session, scratch = tree_sums(self.session), tree_sums(self.scratch)
        for name, digest in expected.items():
            assert digest in (session.get(name), scratch.get(name)), name
            assert session.get(name) in (None, digest), name
            assert scratch.get(name) in (None, digest), name

    def state(self, job: str) -> str:
        p = self.box.state / "jobs" / job / "state.json"
        return str(json.loads(p.read_text())["state"]) if p.exists() else "gone"


@pytest.fixture
def site(sandbox: Sandbox, users: list[OsUser]) -> Iterator[Site]:
    arc = Arc(sandbox, users[0])
    try:
        yield Site(sandbox, arc)
    finally:
        arc.close()


def stopped_in(sid: int) -> bool:
    """Some process of the session is stopped (our pause hook, or a blocked tool). The
    session, not the process group: a staging worker has a group of its own (root kills
    it whole at [staging] timeout)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError, ProcessLookupError):
            continue
        if int(fields[3]) == sid and fields[0] == "T":
            return True
    return False


def kill_when_paused(
    box: Sandbox, args: list[str], point: str, until: Path | None = None, group: bool = True
) -> None:
    """Run jobns with the pause hook at `point` and SIGKILL its whole process group once
    it stopped there (or once `until` exists: a blocked movetool). group=False kills
    jobns alone: what it started must die with it."""
    env = {} if until is not None else {"JOBNS_TEST_PAUSE_IN": point}
    p = box.popen(
        args, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (until.exists() if until is not None else stopped_in(p.pid)):
        if p.poll() is not None:
            _, err = p.communicate()
            raise AssertionError(f"jobns ended (status {p.returncode}) before {point}: {err}")
        assert time.monotonic() < deadline, f"never reached {point}"
        time.sleep(0.02)
    if group:
        os.killpg(p.pid, signal.SIGKILL)
    else:
        os.kill(p.pid, signal.SIGKILL)
    p.wait()
    # Its worker and programs are in the session too (a worker in a group of its own dies
    # with jobns: its parent-death signal): wait until they are all gone.
    deadline = time.monotonic() + 20
    while any(_session(int(n)) == p.pid for n in os.listdir("/proc") if n.isdigit()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    p.stderr.close()


def _session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[3])
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return None


def recover(box: Sandbox) -> str:
    r = box.run(["recover"])
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


SETUP_POINTS = [
    "pending",
    "staging-in",
    "staging-in@1",
    "staging-in@4",
    "staged-in",
    "pre-run",
    "running",
]
EPILOG_POINTS = [
    "post-run",
    "staging-out",
    "staging-out@1",
    "staging-out@5",
    "teardown",
    "complete",
]


@pytest.mark.parametrize("point", SETUP_POINTS)
def test_sigkill_during_setup_then_recover(site: Site, point: str) -> None:
    box = site.box
    kill_when_paused(box, site.setup_args("k1"), point)
    assert site.state("k1") == point.split("@")[0]
    site.assert_whole(MOVED_IN)
    out = recover(box)
    assert "job k1:" in out
    assert site.state("k1") == "running"
    # Staged in exactly once, whatever was interrupted: inputs whole in scratch.
    moved = {k: v for k, v in tree_sums(site.scratch).items() if not v.startswith("->")}
    assert moved == MOVED_IN
    assert sorted(os.listdir(site.session)) == ["stderr", "stdout"]
    outputs = site.work("k1")
    r = box.run(["teardown", "--job-id", "k1"])
    assert r.returncode == 0, r.stderr
    site.check_final("k1", outputs)
    log = site.log.read_text().splitlines()
    assert log[-1].startswith("post-run k1 ") and log[-2].startswith("pre-run k1 ")


@pytest.mark.parametrize("point", EPILOG_POINTS)
def test_sigkill_during_teardown_then_recover(site: Site, point: str) -> None:
    box = site.box
    r = box.run(site.setup_args("k2"))
    assert r.returncode == 0, r.stderr
    outputs = site.work("k2")
    kill_when_paused(box, ["teardown", "--job-id", "k2"], point)
    assert site.state("k2") == point.split("@")[0]
    # Mid-stage-out every output is whole somewhere: scratch or session.
    if point.startswith("staging-out"):
        site.assert_whole({**MOVED_IN, **sums(outputs)})
        r = box.run(["run", "--job-id", "k2", "--", "true"], user=site.arc.user)
        assert r.returncode == 125 and "is ending" in r.stderr
    out = recover(box)
    assert "k2" in out and site.state("k2") == "gone", out
    site.check_final("k2", outputs)


@pytest.mark.parametrize("point", ["staging-in@2", "staging-out@2"])
def test_the_staging_worker_dies_with_jobns(site: Site, point: str) -> None:
    """Only jobns is killed (say, by the OOM killer): its staging worker, stopped in the
    middle of a move, must not outlive it (it is SIGKILLed by the parent-death signal)."""
    box = site.box
    outputs: dict[str, bytes] = {}
    if point.startswith("staging-in"):
        kill_when_paused(box, site.setup_args("k9"), point, group=False)
    else:
        assert box.run(site.setup_args("k9")).returncode == 0
        outputs = site.work("k9")
        kill_when_paused(box, ["teardown", "--job-id", "k9"], point, group=False)
    recover(box)
    if point.startswith("staging-in"):
        outputs = site.work("k9")
        assert box.run(["teardown", "--job-id", "k9"]).returncode == 0
    site.check_final("k9", outputs)


@pytest.mark.parametrize("phase", ["setup", "teardown"])
def test_sigkill_while_the_movetool_runs(site: Site, phase: str) -> None:
    """A movetool killed mid-copy leaves a half-written file in its part directory;
    that is never taken for data, and the source is still whole."""
    box = site.box
    shared = box.root / "w"  # the tool runs as the job user
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    started, gate = shared / "tool-started", shared / "gate"
    tool = box.root / "slowcp"
    tool.write_text(
        "#!/bin/sh\n"
        f'[ -e {gate} ] && exec cp -a "$@"\n'
        'cp -a "$@"\n'
        'find "$2" -type f -size +1k | head -n 1 | xargs -r truncate -s 100\n'
        f"touch {started}\nexec sleep 600\n"
    )
    tool.chmod(0o755)
    site.configure(movetool=str(tool))
    outputs: dict[str, bytes] = {}
    if phase == "teardown":
        gate.touch()
        assert box.run(site.setup_args("k3")).returncode == 0
        outputs = site.work("k3")
        gate.unlink()
        kill_when_paused(box, ["teardown", "--job-id", "k3"], "movetool", until=started)
        assert site.state("k3") == "staging-out"
        site.assert_whole({**MOVED_IN, **sums(outputs)})
    else:
        kill_when_paused(box, site.setup_args("k3"), "movetool", until=started)
        assert site.state("k3") == "staging-in"
        site.assert_whole(MOVED_IN)
        # The truncated file exists, but only inside the tool's part directory.
        assert any(PART in k for k in tree_sums(site.scratch))
    gate.touch()
    recover(box)
    if phase == "setup":
        assert site.state("k3") == "running"
        moved = {k: v for k, v in tree_sums(site.scratch).items() if not v.startswith("->")}
        assert moved == MOVED_IN
        outputs = site.work("k3")
        assert box.run(["teardown", "--job-id", "k3"]).returncode == 0
    site.check_final("k3", outputs)


def test_pre_run_failure_fails_the_job_and_puts_inputs_back(site: Site) -> None:
    box = site.box
    # The hook fails when $JOBNS_HOST_TMP/fail-pre-run exists: make it appear via stage_in.
    home = site.arc.stage / site.arc.user.name
    (home / "flag").write_bytes(b"")
    site.arc.chown(home)
    site.script.write_text(
        site.script.read_text().replace(
            "srun true",
            f"#JOBNS stage_in source={home}/flag destination=/tmp/fail-pre-run\nsrun true",
        )
    )
    r = box.run(site.setup_args("k4"))
    assert r.returncode == 125 and "pre-run program" in r.stderr, r.stderr
    assert "exit status 3" in r.stderr and "torn down" in r.stderr
    site.check_final("k4", {}, ran=False)
    assert site.log.read_text().split()[0] == "pre-run"
    assert "post-run" not in site.log.read_text()  # a job that never ran gets no post-run


def test_post_run_failure_is_reported_and_outputs_still_saved(site: Site) -> None:
    box = site.box
    assert box.run(site.setup_args("k5")).returncode == 0
    outputs = site.work("k5")
    run_job(box, "k5", site.arc.user, "touch /tmp/fail-post-run")
    r = box.run(["teardown", "--job-id", "k5"])
    assert r.returncode == 0, r.stderr
    assert "post-run program" in r.stderr and "exit status 3" in r.stderr
    site.check_final("k5", outputs)


def test_states_in_history_and_status(site: Site) -> None:
    box = site.box
    assert box.run(site.setup_args("k6")).returncode == 0
    rec = json.loads((box.state / "jobs/k6/state.json").read_text())
    assert [h["state"] for h in rec["history"]] == [
        "pending",
        "staging-in",
        "staged-in",
        "pre-run",
        "running",
    ]
    assert rec["staging"]["session_dir"] == str(site.session)
    status = json.loads(box.run(["status", "--json"]).stdout)
    assert status["jobs"][0]["state"] == "running"
    kill_when_paused(box, ["teardown", "--job-id", "k6"], "staging-out")
    assert "staging-out" in box.run(["status"]).stdout
    # gc (no Slurm) finishes an interrupted epilog like recover does.
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    site.check_final("k6", {}, ran=False)


def test_recover_leaves_running_and_busy_jobs_alone(site: Site, users: list[OsUser]) -> None:
    box = site.box
    assert box.run(site.setup_args("k7")).returncode == 0
    assert "running: nothing to do" in recover(box)
    assert site.state("k7") == "running"
    # A setup in progress (its lock held) is not touched.
    p = box.popen(
        ["setup", "--job-id", "k8", "--user", users[1].name],
        env={"JOBNS_TEST_PAUSE_IN": "staging-in"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not stopped_in(p.pid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    out = recover(box)
    assert "job k8: busy" in out
    os.killpg(p.pid, signal.SIGCONT)
    assert p.wait(timeout=30) == 0
    for job in ("k7", "k8"):
        assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert_gone(box, site.arc, "k8")
