"""setup / run (joining) / teardown / env / status / gc, for real, as root and as users."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, host_mounts, job_mounts
from tests.integration.test_run import alive, wait_for

pytestmark = pytest.mark.root


def setup(box: Sandbox, job: str, *extra: str) -> None:
    r = box.run(["setup", "--job-id", job, *extra])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def teardown(box: Sandbox, job: str) -> None:
    """The epilog, and its release process (launcher.lifecycle.release) done."""
    r = box.run(["teardown", "--job-id", job])
    assert r.returncode == 0, r.stderr
    box.wait_released()


def assert_clean(box: Sandbox) -> None:
    assert box.leftovers() == []
    assert job_mounts(box) == []
    assert sorted(os.listdir(box.state / "jobs")) == []


def test_steps_share_the_job_namespace(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    setup(sandbox, "100", "--user", alice.name)
    # Two "steps" as the job user (how slurmstepd runs tasks) and one as root.
    r1 = sandbox.run(
        [
            "run",
            "--job-id",
            "100",
            "--",
            "sh",
            "-c",
            "echo step1 > /tmp/a; echo shm > /dev/shm/b; readlink /proc/self/ns/mnt",
        ],
        user=alice,
    )
    assert r1.returncode == 0, r1.stderr
    r2 = sandbox.run(
        [
            "run",
            "--job-id",
            "100",
            "--",
            "sh",
            "-c",
            "cat /tmp/a /dev/shm/b; readlink /proc/self/ns/mnt; id -u",
        ],
        user=alice,
    )
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.split()[:2] == ["step1", "shm"]
    assert r2.stdout.split()[2] == r1.stdout.split()[0]  # the very same mount namespace
    assert r2.stdout.split()[3] == str(alice.uid)
    r3 = sandbox.run(["run", "--job-id", "100", "--", "cat", "/tmp/a"])
    assert r3.returncode == 0 and r3.stdout == "step1\n", r3.stderr
    # The job's files are on the host where docs/design.md "Directory layouts" says, owned by the
    # job user.
    assert (sandbox.local / "job-100/tmp/a").stat().st_uid == alice.uid
    teardown(sandbox, "100")
    assert_clean(sandbox)


def test_concurrent_job_does_not_see_it(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice, bob = users
    setup(sandbox, "201", "--user", alice.name)
    setup(sandbox, "202", "--user", bob.name)
    assert (
        sandbox.run(["run", "--job-id", "201", "--", "touch", "/tmp/secret"], user=alice).returncode
        == 0
    )
    r = sandbox.run(["run", "--job-id", "202", "--", "ls", "-A", "/tmp"], user=bob)
    assert r.returncode == 0 and r.stdout.split() == ["pmix"], r.stdout
    # Bob cannot join Alice's job, even knowing its id.
    r = sandbox.run(["run", "--job-id", "201", "--", "true"], user=bob)
    assert r.returncode == 125 and "belongs to another user" in r.stderr
    teardown(sandbox, "201")
    teardown(sandbox, "202")
    assert_clean(sandbox)


def test_64_concurrent_tasks_land_in_one_namespace(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    setup(sandbox, "300", "--user", alice.name)
    n = 64
    # Each task waits (bounded) until all 64 files exist: proof they share /tmp and /dev/shm.
    script = (
        f"touch /tmp/task-$SLURM_PROCID /dev/shm/seg-$SLURM_PROCID; i=0; "
        f"while [ $(ls /tmp | grep -c task-) -lt {n} ] || "
        f"[ $(ls /dev/shm | grep -c seg-) -lt {n} ]; do "
        "i=$((i+1)); [ $i -gt 1200 ] && exit 9; sleep 0.05; done; "
        "readlink /proc/self/ns/mnt"
    )
    procs = [
        sandbox.popen(
            ["run", "--job-id", "300", "--", "sh", "-c", script],
            user=alice,
            env={"SLURM_PROCID": str(i), "SLURM_STEP_ID": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(n)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:  # never leave 64 spinning tasks behind a failed assertion
            p.kill()
    assert [p.returncode for p in procs] == [0] * n, [e for _, e in outs if e][:3]
    assert len({o.strip() for o, _ in outs}) == 1  # one namespace for all 64
    tmp = sandbox.local / "job-300/tmp"
    assert sorted(f.name for f in tmp.glob("task-*")) == sorted(f"task-{i}" for i in range(n))
    assert (tmp / "pmix").stat().st_uid == alice.uid  # made 64 times at once, one winner
    teardown(sandbox, "300")
    assert_clean(sandbox)


def test_setup_is_idempotent_and_refuses_other_options(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    setup(sandbox, "400", "--user", users[0].name)
    setup(sandbox, "400", "--user", users[0].name)
    r = sandbox.run(["setup", "--job-id", "400", "--user", users[0].name, "--use-shared-tmpdir"])
    assert r.returncode == 125 and "already set up" in r.stderr
    teardown(sandbox, "400")
    teardown(sandbox, "400")  # twice is fine
    assert_clean(sandbox)


def test_teardown_ends_a_task_ignoring_sigterm_and_its_setsid_child(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    setup(sandbox, "500", "--user", alice.name, "--kill-wait", "1")
    pids = sandbox.root / "pids"
    pids.touch()
    pids.chmod(0o666)
    p = sandbox.popen(
        [
            "run",
            "--job-id",
            "500",
            "--",
            "sh",
            "-c",
            f"trap '' TERM; setsid sh -c 'trap \"\" TERM; echo $$ >> {pids}; "
            f"exec sleep 300' & echo $$ >> {pids}; while :; do sleep 0.1; done",
        ],
        user=alice,
    )
    deadline = time.monotonic() + 20
    while len(pids.read_text().split()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    teardown(sandbox, "500")
    assert time.monotonic() - t0 >= 1.0  # kill_wait honoured before SIGKILL
    assert [int(x) for x in pids.read_text().split() if alive(int(x))] == []
    assert p.wait(timeout=20) == 128 + signal.SIGKILL
    assert_clean(sandbox)


def test_shared_per_node_setup_and_no_rm(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    host = os.uname().nodename.split(".")[0]
    setup(sandbox, "600", "--user", alice.name, "--use-shared-tmpdir=per-node", "--no-rm-tmpdir")
    assert (
        sandbox.run(
            ["run", "--job-id", "600", "--", "sh", "-c", "echo out > /tmp/result"], user=alice
        ).returncode
        == 0
    )
    teardown(sandbox, "600")
    assert (sandbox.shared / "job-600" / host / "tmp" / "result").read_text() == "out\n"
    assert not (sandbox.shm / "job-600").exists()
    assert job_mounts(sandbox) == []


def test_host_mount_made_after_setup_appears_in_joined_task(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    mnt = sandbox.root / "autofs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "top", str(mnt)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(mnt)], check=True)
        (mnt / "later").mkdir()
        setup(sandbox, "700", "--user", users[0].name)
        subprocess.run(["mount", "-t", "tmpfs", "later", str(mnt / "later")], check=True)
        (mnt / "later" / "here").touch()
        r = sandbox.run(["run", "--job-id", "700", "--", "ls", str(mnt / "later")], user=users[0])
        assert r.returncode == 0 and r.stdout.split() == ["here"], r.stderr
        teardown(sandbox, "700")
    finally:
        subprocess.run(["umount", "-R", str(mnt)], check=False)


def test_only_the_jobs_own_state_is_visible_inside_it(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Inside a job, state_dir shows its own directory alone (Slurm puts processes there,
    and the SPANK plugin and `jobns run` in them read its run.env), read-only: no other
    job's directory, and its own pins are empty files (mounts of the node's namespace).
    The second user, in her job, can neither write there nor see the first's job."""
    setup(sandbox, "710", "--user", users[0].name)
    setup(sandbox, "711", "--user", users[1].name)
    state = sandbox.state
    look = (
        f"ls -A {state} {state}/jobs; stat -c '%F %s' {state}/jobs/711/ns/mnt; "
        f"grep -c '^mnt_ns=' {state}/jobs/711/run.env; "
        f"touch {state}/jobs/711/x {state}/x {state}/jobs/x 2>&1 | wc -l; "
        f"mv {state}/jobs/711/run.env {state}/jobs/711/y 2>/dev/null || echo mv-refused; "
        f"ls {state}/jobs/710 2>&1 | grep -c 'No such file'"
    )
    r = sandbox.run(["run", "--job-id", "711", "--", "sh", "-c", look], user=users[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == [
        f"{state}:",
        "jobs",
        "",
        f"{state}/jobs:",
        "711",
        "regular empty file 0",
        "1",
        "3",
        "mv-refused",
        "1",
        "",
    ], r.stdout
    teardown(sandbox, "710")
    teardown(sandbox, "711")
    assert_clean(sandbox)


def test_env_and_status(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    sandbox.write_config('[arc]\nshared_filesystem = true\nscratchdir = "/scratch"\n')
    setup(sandbox, "800", "--user", alice.name)
    assert (
        sandbox.run(
            ["run", "--job-id", "800", "--", "sh", "-c", "head -c 100000 /dev/zero > /tmp/blob"],
            user=alice,
        ).returncode
        == 0
    )
    r = sandbox.run(["env", "--job-id", "800"], env={"SLURM_STEP_ID": "1", "SLURM_PROCID": "2"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(ln.startswith("export ") for ln in lines)
    env = dict(ln[len("export ") :].split("=", 1) for ln in lines)
    assert env["TMPDIR"] == "/tmp" and env["PMIX_SERVER_TMPDIR"] == "/tmp/pmix"
    assert env["RUNTIME_LOCAL_SCRATCH_DIR"] == "/scratch"
    r = sandbox.run(["env", "--job-id", "800", "--format", "json"])
    assert json.loads(r.stdout)["TMPDIR"] == "/tmp"
    # A TaskProlog's lines are taken verbatim by slurmstepd: no quoting (issue 14).
    r = sandbox.run(["env", "--job-id", "800", "--format", "slurm"])
    assert r.returncode == 0 and "export RUNTIME_NODE_SEES_FRONTEND=yes\n" in r.stdout
    assert "'" not in r.stdout, r.stdout
    r = sandbox.run(["status", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    (job,) = doc["jobs"]
    assert job["job_id"] == "800" and job["state"] == "running"
    assert job["user"]["name"] == alice.name and job["bytes"] >= 100000
    assert doc["users"][alice.name]["jobs"] == 1
    text = sandbox.run(["status"]).stdout
    assert "800" in text and alice.name in text and "PER USER" in text
    teardown(sandbox, "800")
    assert_clean(sandbox)
    r = sandbox.run(["env", "--job-id", "800"])  # not set up: an error, not defaults
    assert r.returncode == 125 and "not set up on this node" in r.stderr and r.stdout == ""


def test_setup_and_teardown_need_root(sandbox: Sandbox, users: list[OsUser]) -> None:
    for sub in ("setup", "teardown", "gc"):
        r = sandbox.run([sub, "--job-id", "9"] if sub != "gc" else [sub], user=users[0])
        assert r.returncode == 125 and "must run as root" in r.stderr, (sub, r.stderr)


def test_racing_setup_run_teardown_of_many_jobs(sandbox: Sandbox, users: list[OsUser]) -> None:
    """setup/run/teardown of one job racing each other, and of many jobs at once:
    afterwards no state, no mount and no directory is left, and nothing crashed."""
    alice = users[0]
    failures: list[str] = []

    def cycle(job: str) -> None:
        for _ in range(3):
            for args in (
                ["setup", "--job-id", job, "--user", alice.name],
                ["teardown", "--job-id", job],
            ):
                r = sandbox.run(args)
                if r.returncode != 0:
                    failures.append(f"{args}: {r.stderr}")

    def racer(job: str) -> None:
        for _ in range(6):
            r = sandbox.run(["run", "--job-id", job, "--", "true"], user=alice)
            # Between teardown and setup a run may fall back to a standalone namespace,
            # or lose the race to a teardown (killed): both are fine, crashes are not.
            if r.returncode not in (0, 125, 128 + 9, 128 + 15) or "Traceback" in r.stderr:
                failures.append(f"run {job}: {r.returncode} {r.stderr}")

    threads = [threading.Thread(target=cycle, args=(f"r{i}",)) for i in range(6)]
    threads += [threading.Thread(target=racer, args=(f"r{i}",)) for i in range(3)]
    threads += [threading.Thread(target=cycle, args=("same",)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert failures == []
    for job in [f"r{i}" for i in range(6)] + ["same"]:
        teardown(sandbox, job)
    # A racer's standalone run may still be finishing its own removal: give it a moment.
    deadline = time.monotonic() + 10
    while sandbox.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert_clean(sandbox)


def test_gc_removes_interrupted_jobs_and_orphan_trees(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    # 1. A job whose teardown was interrupted (its record says so).
    setup(sandbox, "900", "--user", alice.name)
    record_path = sandbox.state / "jobs/900/state.json"
    rec = json.loads(record_path.read_text())
    rec["state"] = "teardown"
    record_path.write_text(json.dumps(rec))
    # 2. A live job that must survive gc.
    setup(sandbox, "901", "--user", alice.name)
    # 3. A standalone run whose jobns was SIGKILLed: its task dies with it (pdeathsig)
    #    and its trees stay behind with nobody holding them.
    (sandbox.root / "w").mkdir(mode=0o1777)
    (sandbox.root / "w").chmod(0o1777)
    pidfile = sandbox.root / "w" / "pid"
    p = sandbox.popen(
        ["run", "--job-id", "902", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"],
        user=alice,
    )
    wait_for(pidfile)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert (sandbox.local / "job-902").is_dir()
    dry = sandbox.run(["gc", "--dry-run", "--no-slurm"])
    assert dry.returncode == 0, dry.stderr
    assert "would remove job 900" in dry.stdout and "job-902" in dry.stdout
    assert "901" not in dry.stdout
    assert (sandbox.local / "job-902").is_dir()  # dry run removed nothing
    r = sandbox.run(["gc", "--no-slurm"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (sandbox.local / "job-900").exists() and not (sandbox.local / "job-902").exists()
    assert not (sandbox.shm / "job-902").exists()
    assert (sandbox.local / "job-901").is_dir()
    assert sandbox.run(["run", "--job-id", "901", "--", "true"], user=alice).returncode == 0
    teardown(sandbox, "901")
    assert_clean(sandbox)


def test_a_squatter_is_moved_aside_and_keeps_everything(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    squat = sandbox.shm / "job-950"
    squat.mkdir(mode=0o755)  # root's, not what jobns makes for alice
    (squat / "mine").write_text("kept")
    r = sandbox.run(["setup", "--job-id", "950", "--user", users[0].name])
    assert r.returncode == 0 and "moved" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    moved = [p for p in sandbox.shm.iterdir() if p.name.startswith("job-950~moved-")]
    assert len(moved) == 1 and (moved[0] / "mine").read_text() == "kept"
    assert moved[0].stat().st_uid == 0 and (moved[0].stat().st_mode & 0o777) == 0o755
    teardown(sandbox, "950")
    assert [p.name for p in sandbox.shm.iterdir()] == [moved[0].name]  # kept, untouched
    shutil.rmtree(moved[0])
    assert_clean(sandbox)


def test_teardown_failure_is_retried_then_kept_as_teardown_fail(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    setup(sandbox, "960", "--user", users[0].name)
    # An immutable base directory (only root can set the flag: a node fault, not the
    # user's doing): teardown can neither rename the job's tree out of the way for its
    # release process nor remove it, and fails for real until the administrator clears
    # it. (An immutable file deep inside fails the release instead, which gc reports:
    # tests/integration/test_release.py.)
    stuck = sandbox.local
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    try:
        r = sandbox.run(["teardown", "--job-id", "960"])
        assert r.returncode == 125
        assert "teardown-fail" in r.stderr and "Operation not permitted" in r.stderr
        rec = json.loads((sandbox.state / "jobs/960/state.json").read_text())
        assert rec["state"] == "teardown-fail" and rec["teardown_failures"] == 1  # one epilog
        r = sandbox.run(["teardown", "--job-id", "960"])
        rec = json.loads((sandbox.state / "jobs/960/state.json").read_text())
        assert r.returncode == 125 and rec["teardown_failures"] == 2
        # --force forgets the record (the administrator cleans by hand): no lock is left.
        r = sandbox.run(["teardown", "--job-id", "960", "--force"])
        assert r.returncode == 125 and "forgot its record" in r.stderr
        assert sorted(os.listdir(sandbox.state / "jobs")) == []
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    shutil.rmtree(sandbox.local / "job-960")
    assert_clean(sandbox)


def test_run_of_a_job_set_up_for_someone_else_fails_cleanly(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    setup(sandbox, "970", "--user", users[0].name)
    r = sandbox.run(["run", "--job-id", "970", "--user", users[1].name, "--", "true"])
    assert r.returncode == 125 and "set up for uid" in r.stderr
    teardown(sandbox, "970")


def test_setup_dry_run_touches_nothing(sandbox: Sandbox, users: list[OsUser]) -> None:
    r = sandbox.run(["setup", "--job-id", "980", "--user", users[0].name, "--dry-run"])
    assert r.returncode == 0 and "bind" in r.stdout
    assert sandbox.leftovers() == [] and not Path(sandbox.state / "jobs").exists()


def test_no_pin_of_any_jobns_instance_is_visible_inside_a_job(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Another jobns instance (another config and state_dir) pins its jobs too: a job
    must see none of those pins (it could keep another job's namespace alive)."""
    import uuid

    from tests.conftest import Sandbox as Box

    root = Path("/var/lib/jobns-tests") / uuid.uuid4().hex[:12]
    root.mkdir(parents=True)
    other = Box(root, Path("/dev/shm") / f"jobns-tests-{root.name}")
    try:
        setup(other, "990", "--user", users[1].name)
        setup(sandbox, "991", "--user", users[0].name)
        r = sandbox.run(
            ["run", "--job-id", "991", "--", "cat", "/proc/self/mountinfo"], user=users[0]
        )
        assert r.returncode == 0, r.stderr
        assert [ln for ln in r.stdout.splitlines() if " - nsfs " in ln] == []
        assert str(other.state) not in r.stdout or " - nsfs " not in r.stdout
        teardown(sandbox, "991")
        teardown(other, "990")
    finally:
        subprocess.run(["umount", "-R", "-l", str(other.state)], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(other.shm, ignore_errors=True)


def test_status_for_root_and_for_a_user_with_standalone_jobs(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Root sees every job, set up or standalone; a user sees her own, without a
    traceback; the propagation of / is reported (issue 14)."""
    alice, bob = users
    setup(sandbox, "995", "--user", alice.name)
    setup(sandbox, "996", "--user", bob.name)
    task = sandbox.popen(["run", "--job-id", "997", "--", "sleep", "30"], user=alice)
    try:
        wait_for(sandbox.local / "job-997" / "tmp")
        everything = json.loads(sandbox.run(["status", "--json"]).stdout)["jobs"]
        states = {j["job_id"]: j["state"] for j in everything}
        assert states == {"995": "running", "996": "running", "997": "standalone"}, states
        r = sandbox.run(["status", "--json"], user=alice)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        mine = {j["job_id"] for j in json.loads(r.stdout)["jobs"]}
        assert mine == {"995", "997"}
        r = sandbox.run(["status"], user=bob)
        assert r.returncode == 0 and "996" in r.stdout and "995" not in r.stdout
        root_private = not root_is_shared()
        assert ("/ is a private mount" in r.stderr) == root_private
    finally:
        task.kill()
        task.wait()
    teardown(sandbox, "995")
    teardown(sandbox, "996")
    r = sandbox.run(["status", "--json"])
    assert [(j["job_id"], j["state"]) for j in json.loads(r.stdout)["jobs"]] == [
        ("997", "leftover")
    ]
    assert sandbox.run(["gc", "--no-slurm"]).returncode == 0
    assert_clean(sandbox)


def test_a_private_root_mount_is_reported_once_per_boot(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    (sandbox.state / "propagation-checked").unlink()
    private = not root_is_shared()
    r = sandbox.run(["setup", "--job-id", "998", "--user", users[0].name])
    assert r.returncode == 0 and ("/ is a private mount" in r.stderr) == private, r.stderr
    r = sandbox.run(["setup", "--job-id", "999", "--user", users[0].name])
    assert r.returncode == 0 and r.stderr == ""  # once
    dry = sandbox.run(["run", "--job-id", "x", "--dry-run", "--", "true"])
    assert "later host mounts appear if / is shared" in dry.stdout
    teardown(sandbox, "998")
    teardown(sandbox, "999")
    assert_clean(sandbox)


def root_is_shared() -> bool:
    root = [ln for ln in host_mounts().splitlines() if ln.split()[4] == "/"]
    return "shared:" in root[-1].split(" - ")[0]


def test_root_joins_an_enforced_job_and_runs_as_its_owner(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """[slurm] enforce: the namespace is root's; root joins it, then becomes the owner
    (with --net none too); the owner cannot join from outside (the plugin puts tasks in)."""
    alice = users[0]
    sandbox.write_config("[slurm]\nenforce = true\n")
    setup(sandbox, "1201", "--user", alice.name)
    for extra in ([], ["--net", "none"]):
        r = sandbox.run(
            ["run", "--job-id", "1201", *extra, "--", "sh", "-c", "id -u; touch /tmp/x"]
        )
        assert r.returncode == 0 and r.stdout.split() == [str(alice.uid)], r.stderr
    assert (sandbox.local / "job-1201" / "tmp" / "x").stat().st_uid == alice.uid
    r = sandbox.run(["run", "--job-id", "1201", "--", "true"], user=alice)
    assert r.returncode == 125 and "SPANK plugin" in r.stderr, r.stderr
    teardown(sandbox, "1201")
    assert_clean(sandbox)


def test_the_state_directory_is_bound_onto_itself_once(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Every setup checks that state_dir is a mount of its own (by mount id, without
    reading the node's whole mount table) and binds it onto itself only the first time."""
    for job in ("990", "991"):
        setup(sandbox, job, "--user", users[0].name)
    binds = [ln for ln in host_mounts().splitlines() if ln.split()[4] == str(sandbox.state)]
    assert len(binds) == 1, binds
    for job in ("990", "991"):
        teardown(sandbox, job)
    assert_clean(sandbox)


def test_a_first_call_with_umask_0_makes_a_state_dir_it_accepts(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """crun 1.28 (Podman 5.8's runtime in Debian forky) runs OCI hooks with umask 0. When
    such a hook is the node's first jobns call, the state directory and its parents are made
    then: os.makedirs gave the parents 0777 & ~umask = 0777, which jobns itself then refuses
    ("writable only by root") for every later job on the node, until an administrator fixes
    it. Seen in tests/e2e/test_rig_hpc_runtimes.py; here with `jobns setup` under umask 0."""
    alice = users[0]
    fresh = sandbox.root / "fresh" / "state"
    text = sandbox.config.read_text()
    sandbox.config.write_text(text.replace(f'"{sandbox.state}"', f'"{fresh}"'))
    job = "umask0-1"
    r = sandbox.run(
        ["setup", "--job-id", job, "--user", alice.name], preexec_fn=lambda: os.umask(0)
    )
    try:
        assert r.returncode == 0, r.stderr
        for d in (fresh.parent, fresh):
            assert d.stat().st_mode & 0o022 == 0, (d, oct(d.stat().st_mode))
    finally:
        sandbox.run(["teardown", "--job-id", job])
        subprocess.run(["umount", "-l", str(fresh)], capture_output=True, check=False)
