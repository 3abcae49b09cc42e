"""Every process of every Slurm job in the job's namespace, enforced by the site (issue 11).

Real Slurm 22.05 (ci/start-slurm), jobs submitted by ordinary users. Two modes, the same
checks where they apply:
- `jobns`: ci/start-slurm --jobns --enforce: Prolog=jobns setup, Epilog=jobns teardown,
  PlugStackConfig with the jobns SPANK plugin, and `[slurm] enforce = true` in jobns.toml;
- `tmpfs`: Slurm's own job_container/tmpfs (PrologFlags=Contain), the reference.
The module switches Slurm back to `ci/start-slurm --jobns --job-container none` (what the
other Slurm tests use) when it is done.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, OsUser, require, require_root
from tests.e2e.test_slurm import CONFIG, WORK, output, sbatch

pytestmark = pytest.mark.slurm

STATE = Path("/run/jobns/jobs")
# ci/slurm/job_container.conf's BasePath; 22.05 puts a job under <BasePath>/<node>/<id>
JC_BASE = Path("/var/tmp/slurmjc") / os.uname().nodename.split(".")[0]
JOBNS = "/opt/jobns/venv/bin/jobns"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def start_slurm(*mode: str) -> None:
    for _ in range(3):
        r = subprocess.run(
            [str(REPO / "ci" / "start-slurm"), *mode],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if r.returncode == 0:
            return
        # Slurm's own job_container/tmpfs fails its smoke job while anything is mounted
        # below the node's /dev/shm (its "umount /dev/shm" is EBUSY): other tests' mounts
        time.sleep(2)
    raise AssertionError(r.stderr[-3000:])


def node_state() -> str:
    r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, check=False)
    return r.stdout.strip()


def wait_idle(timeout: float = 60) -> None:
    """Until the node is idle again (after COMPLETING); a drained node fails at once."""
    deadline = time.monotonic() + timeout
    while (state := node_state()) != "idle":
        assert not state.startswith(("drain", "drng", "down", "fail")), state
        assert time.monotonic() < deadline, f"node still {state}"
        time.sleep(0.2)


def wait_gone(job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        q = subprocess.run(
            ["squeue", "-h", "-j", job_id], capture_output=True, text=True, check=False
        )
        if (
            not q.stdout.strip()
            and not (STATE / job_id).exists()
            and not (JC_BASE / job_id).exists()
        ):
            return
        assert time.monotonic() < deadline, f"job {job_id} still there after {timeout}s"
        time.sleep(0.2)


@pytest.fixture(scope="module", params=["jobns", "tmpfs"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    require_root()
    require(
        subprocess.run(["which", "sbatch"], capture_output=True).returncode == 0,
        "Slurm is not installed (ci/install-system)",
    )
    saved = CONFIG.read_bytes() if CONFIG.exists() else None
    subprocess.run(["rm", "-rf", str(WORK)], check=False)
    (WORK / "shared").mkdir(parents=True)
    (WORK / "work").mkdir()
    (WORK / "work").chmod(0o1777)
    CONFIG.parent.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(
        f'shared_base = "{WORK}/shared"\nkill_wait = 2\n[slurm]\nenforce = true\n'
        f'[staging]\nstage_roots = ["{WORK}/work"]\n'
    )
    CONFIG.chmod(0o644)
    try:
        if request.param == "jobns":
            start_slurm("--jobns", "--enforce")
        else:
            start_slurm("--no-jobns", "--job-container", "tmpfs")
        yield request.param
    finally:
        if saved is None:
            CONFIG.unlink()
        else:
            CONFIG.write_bytes(saved)
        start_slurm("--jobns", "--job-container", "none")
        subprocess.run(["rm", "-rf", str(WORK)], check=False)


@pytest.fixture
def work(mode: str) -> Path:
    return WORK / "work"


def host_tmp_of(mode: str, job_id: str) -> Path:
    """Where the job's /tmp lies on the host."""
    if mode == "jobns":
        return Path(f"/tmp/job-{job_id}/tmp")
    return JC_BASE / job_id / f".{job_id}"  # job_container/tmpfs: /tmp (no /var/tmp)


def wait_for(path: Path, job_id: str, work: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, output(work, job_id)
        time.sleep(0.1)


# Every way a process of a job starts: the batch script itself, an srun step that is not
# wrapped, one wrapped in `jobns run` (jobns mode only: it must not wrap twice), and an
# interactive `srun --pty` step (under script(1), which gives it a terminal).
def every_path_script(mode: str, tag: str, work: Path) -> str:
    wrapped = f"{JOBNS} run -- " if mode == "jobns" else ""
    return f"""\
echo batch $(readlink /proc/self/ns/mnt) $TMPDIR
echo a > /tmp/a-{tag}; echo b > /dev/shm/b-{tag}; echo v > /var/tmp/v-{tag}
srun sh -c 'echo plain $(readlink /proc/self/ns/mnt); echo s > /tmp/plain-{tag}; \
cat /tmp/a-{tag} /dev/shm/b-{tag}'
srun {wrapped}sh -c 'echo wrapped $(readlink /proc/self/ns/mnt) $TMPDIR $PMIX_SERVER_TMPDIR; \
echo w > /tmp/wrapped-{tag}; cat /tmp/plain-{tag}'
script -qec "srun --pty sh -c 'echo pty \\$(readlink /proc/self/ns/mnt); \
echo p > /dev/shm/pty-{tag}'" /dev/null
touch {work}/ready-{tag}
while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done
"""


def test_every_process_of_a_job_is_in_its_namespace(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    alice, bob = users
    tag = uuid.uuid4().hex[:8]
    job_id = sbatch(alice, work, every_path_script(mode, tag, work), wait=False)
    try:
        wait_for(work / f"ready-{tag}", job_id, work)
        out = output(work, job_id)
        # (the pty may echo a NUL as "^@" before its first line)
        lines = [ln.replace("^@", "").split() for ln in out.splitlines()]
        words = {w[0]: w[1:] for w in lines if w}
        assert {"batch", "plain", "wrapped", "pty"} <= set(words), out
        ns = {words[k][0] for k in ("batch", "plain", "wrapped", "pty")}
        assert len(ns) == 1, out  # one namespace for the script and every step
        host_ns = Path("/proc/self/ns/mnt").readlink()
        assert ns != {str(host_ns)}, out
        assert "a\nb\n" in out and "s\n" in out, out  # steps see the script's files
        if mode == "jobns":
            assert words["batch"][1] == "/tmp", out  # the plugin set the job environment
            assert words["wrapped"][1:] == ["/tmp", "/tmp/pmix"], out
        # The files are in the job's directories, none in the node's own.
        tmp = host_tmp_of(mode, job_id)
        for name in (f"a-{tag}", f"plain-{tag}", f"wrapped-{tag}"):
            assert (tmp / name).exists(), (name, out)
            assert not (Path("/tmp") / name).exists(), name
        for name in (f"b-{tag}", f"pty-{tag}"):
            assert not (Path("/dev/shm") / name).exists(), name
            if mode == "jobns":
                assert (Path(f"/dev/shm/job-{job_id}") / name).exists(), (name, out)
        if mode == "jobns":
            assert not Path(f"/var/tmp/v-{tag}").exists()
            assert (Path(f"/tmp/job-{job_id}/var_tmp") / f"v-{tag}").exists()
        else:
            # Slurm 22.05's job_container/tmpfs makes /tmp and /dev/shm private, not
            # /var/tmp (Dirs= came in 23.02): the job wrote to the node's own.
            Path(f"/var/tmp/v-{tag}").unlink()
        # A concurrent job of another user on the same node sees none of it.
        other = sbatch(bob, work, "ls -A /tmp /dev/shm /var/tmp; srun ls -A /tmp /dev/shm\n")
        seen = output(work, other)
        assert tag not in seen, seen
    finally:
        (work / f"gate-{tag}").touch()
    wait_gone(job_id)
    assert not Path(f"/tmp/job-{job_id}").exists()
    assert not Path(f"/dev/shm/job-{job_id}").exists()
    assert not (JC_BASE / job_id).exists()
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    assert f"/jobs/{job_id}/" not in mounts and f"/slurmjc/{job_id}/" not in mounts
    wait_idle()


def test_a_job_user_cannot_mount_in_the_job_namespace(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    alice = users[0]
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for call, args in (('mount', (b'none', b'/tmp', b'tmpfs', 0, None)),\n"
        "                   ('umount2', (b'/tmp', 2)),\n"
        "                   ('mount', (None, b'/', None, 1 << 18 | 1 << 14, None))):\n"
        "    rc = getattr(libc, call)(*args)\n"
        "    print(call, rc, os.strerror(ctypes.get_errno()))\n"
        "print('userns', os.readlink('/proc/self/ns/user'))\n"
    )
    (work / "probe.py").write_text(probe)
    job_id = sbatch(
        alice, work, f"srun /usr/bin/python3 {work}/probe.py\n/usr/bin/python3 {work}/probe.py\n"
    )
    out = output(work, job_id)
    lines = [ln for ln in out.splitlines() if ln.startswith(("mount", "umount2"))]
    assert len(lines) == 6, out
    assert all(" -1 Operation not permitted" in ln for ln in lines), out
    # The namespace belongs to the host's user namespace: no user namespace of hers.
    host_userns = str(Path("/proc/self/ns/user").readlink())
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("userns")] == [
        host_userns,
        host_userns,
    ], out
    wait_gone(job_id)


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_a_refused_job_fails_with_the_reason_and_the_node_stays_idle(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    alice = users[0]
    tag = uuid.uuid4().hex[:8]
    job_id = sbatch(
        alice,
        work,
        f"echo ran > /tmp/x-{tag}; echo ran-{tag}\n",
        "--comment=jobns: shm capacity=2gib",
        wait=False,
    )
    wait_gone(job_id, timeout=120)
    out = output(work, job_id)
    assert "jobns: job" in out and "was refused by jobns setup" in out and "'gib'" in out, out
    assert f"ran-{tag}" not in out, out  # the batch script never started
    # The reason is the first line (slurmstepd may add "write to unblock task 0 failed").
    assert f"error: jobns: job {job_id} was refused" in out.splitlines()[0], out
    assert not list(Path("/tmp").glob(f"x-{tag}"))
    wait_idle()
    assert node_state() == "idle"


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_a_missing_pin_fails_the_next_step_not_the_node(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    alice = users[0]
    tag = uuid.uuid4().hex[:8]
    script = (
        f"touch {work}/ready-{tag}\n"
        f"while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done\n"
        f"srun sh -c 'echo step-ran-{tag}'; echo srun-exit=$?\n"
    )
    job_id = sbatch(alice, work, script, wait=False)
    try:
        wait_for(work / f"ready-{tag}", job_id, work)
        pin = STATE / job_id / "ns" / "mnt"
        subprocess.run(["umount", "-l", str(pin)], check=True)  # the pin is gone
    finally:
        (work / f"gate-{tag}").touch()
    wait_gone(job_id)
    out = output(work, job_id)
    assert f"step-ran-{tag}" not in out, out
    assert "srun-exit=1" in out and "is not a pinned mount namespace" in out, out
    wait_idle()


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_a_job_not_set_up_by_jobns_does_not_run(mode: str, work: Path, users: list[OsUser]) -> None:
    """The plugin fails closed for a job without a record (no prolog on this node, or
    a prolog that is not jobns): it never runs outside a namespace."""
    alice = users[0]
    tag = uuid.uuid4().hex[:8]
    script = (
        f"touch {work}/ready-{tag}\n"
        f"while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done\n"
        f"srun sh -c 'echo step-ran-{tag}'\n"
    )
    job_id = sbatch(alice, work, script, wait=False)
    try:
        wait_for(work / f"ready-{tag}", job_id, work)
        (STATE / job_id / "run.env").unlink()  # as if its prolog never ran
    finally:
        (work / f"gate-{tag}").touch()
    deadline = time.monotonic() + 60
    while subprocess.run(
        ["squeue", "-h", "-j", job_id], capture_output=True, text=True
    ).stdout.strip():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    out = output(work, job_id)
    assert f"step-ran-{tag}" not in out, out
    assert f"job {job_id} is not set up on this node" in out, out
    wait_gone(job_id)
    wait_idle()


def jobns_records() -> list[str]:
    """The jobs jobns holds on this node (their directories), marks and locks aside."""
    return sorted(p.name for p in STATE.iterdir() if p.is_dir()) if STATE.exists() else []


def job_shm_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if "/job-" in line.split()[4]]


def scontrol(*args: str) -> None:
    r = subprocess.run(["scontrol", *args], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def eligible_now(job_id: str) -> None:
    """Until a requeued job runs again (or ended). Slurm lets it start once its last
    credential expired (ci/start-slurm's cred_expire=30); an administrator's
    StartTime=now would let it start sooner, but slurmd then may skip its prolog (it
    still holds the job id), which no user can cause."""
    deadline = time.monotonic() + 150
    while True:
        q = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if q not in ("PENDING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
            return  # running again (or ended)
        assert time.monotonic() < deadline, f"job {job_id} still {q}"
        time.sleep(0.5)


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_jobs_that_end_at_once_leave_nothing_set_up(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    """Issue 30, finding 1: ten jobs whose launch fails at once (their output file cannot
    be opened), so slurmd runs each epilog milliseconds after its prolog returned. None
    may stay set up after Slurm ended it (before: 1 to 5 of 10 kept their /dev/shm
    capacity mounted until the next gc), and the node stays idle."""
    alice = users[0]
    ids = []
    for _ in range(10):
        r = subprocess.run(
            [
                "su",
                alice.name,
                "-c",
                "sbatch --parsable -o /nonexistent/x.out "
                "'--comment=jobns: shm capacity=64MiB' --wrap true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip().split(";")[0])
    for job_id in ids:
        wait_gone(job_id, timeout=120)
    time.sleep(1)  # a late setup would have set a job up again by now
    assert [j for j in jobns_records() if j in ids] == []
    assert [m for m in job_shm_mounts() if any(f"job-{j}" in m for j in ids)] == []
    wait_idle()


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_her_requeue_with_other_options_never_drains_the_node(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    """Issue 30, finding 1: requeuehold, a new comment, release: the job's second run asks
    for other options than its first. It is a new run (Slurm's restart count): the last
    run is ended and the new one set up as asked (before: "it is already set up on this
    node with other options" drained the node)."""
    alice = users[0]
    tag = uuid.uuid4().hex[:8]
    script = (
        "df -k --output=size /dev/shm | tail -1 >> "
        f"{work}/shm-{tag}\ntouch {work}/ready-{tag}-$SLURM_RESTART_COUNT\n"
        f"while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done\n"
    )
    job_id = sbatch(alice, work, script, "--comment=jobns: shm capacity=64MiB", wait=False)
    try:
        deadline = time.monotonic() + 120
        while not list(work.glob(f"ready-{tag}-*")):
            assert time.monotonic() < deadline, output(work, job_id)
            time.sleep(0.1)
        scontrol("requeuehold", job_id)
        scontrol("update", f"JobId={job_id}", "Comment=jobns: shm capacity=32MiB")
        scontrol("release", job_id)
        eligible_now(job_id)
        wait_for(work / f"ready-{tag}-1", job_id, work)
    finally:
        (work / f"gate-{tag}").touch()
    wait_gone(job_id, timeout=120)
    sizes = (work / f"shm-{tag}").read_text().split()
    assert sizes == [str(64 * 1024), str(32 * 1024)], sizes
    wait_idle()


@pytest.mark.parametrize("mode", ["jobns"], indirect=True)
def test_her_failed_stage_out_and_requeue_never_drain_the_node(
    mode: str, work: Path, users: list[OsUser]
) -> None:
    """Issue 30, finding 2: her stage-out destination is not writable (her own 0500
    directory), so the epilog keeps the job in staging-out; her `scontrol requeue` then
    runs a new setup, which ends the last run first. That failure is hers: the new run
    is refused with the reason and the node stays in service (before: drained). Once
    she fixes the directory, the next epilog stages out and nothing is left."""
    alice = users[0]
    tag = uuid.uuid4().hex[:8]
    ro = work / f"ro-{tag}"
    ro.mkdir(mode=0o500)
    os.chown(ro, alice.uid, alice.gid)
    script = (
        f"echo out-${{SLURM_RESTART_COUNT:-0}} > /tmp/out-{tag}\n"
        f"touch {work}/ready-{tag}-${{SLURM_RESTART_COUNT:-0}}\n"
        f"while [ ! -e {work}/gate-{tag} ]; do sleep 0.1; done\n"
    )
    comment = f"--comment=jobns: stage_out source=/tmp/out-{tag} destination={ro}/out"
    job_id = sbatch(alice, work, script, comment, wait=False)
    try:
        wait_for(work / f"ready-{tag}-0", job_id, work)
        (work / f"gate-{tag}").touch()
        deadline = time.monotonic() + 60
        while True:  # the epilog keeps run 0 in staging-out
            r = subprocess.run([JOBNS, "status"], capture_output=True, text=True, check=False)
            if job_id in r.stdout and "staging-out" in r.stdout:
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(0.2)
        (work / f"gate-{tag}").unlink()
        r = subprocess.run(
            ["su", alice.name, "-c", f"scontrol requeue {job_id}"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        eligible_now(job_id)
        deadline = time.monotonic() + 120
        while "was refused" not in output(work, job_id):
            assert node_state() not in ("drain", "drng"), output(work, job_id)
            assert time.monotonic() < deadline, output(work, job_id)
            time.sleep(0.2)
        assert "last run" in output(work, job_id), output(work, job_id)
        assert node_state() not in ("drain", "drng")
    finally:
        subprocess.run(["scancel", job_id], check=False)
        (work / f"gate-{tag}").touch()
        ro.chmod(0o700)
    # The administrator's part, once she fixed it: the kept run resumes its stage-out.
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = subprocess.run([JOBNS, "teardown", "--job-id", job_id], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wait_gone(job_id, timeout=120)
    assert (ro / "out").read_text() == "out-0\n"
    wait_idle()
