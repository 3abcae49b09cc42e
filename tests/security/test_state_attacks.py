"""Attacks on job state and on other users' jobs: records, pins and locks are private to
root and the job's user; only root sets up, tears down or collects; nobody reaches into
another user's job or into a root process of jobns (DESIGN rules 4 and 5; contract 5)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import OsUser
from tests.security.conftest import (
    PTRACE_ATTACH,
    STEAL_FDS,
    TRY_OPEN,
    World,
    descendants,
    identity,
    no_crash,
    one_line,
    uids_of,
)

pytestmark = pytest.mark.root


def opened(world: World, user: OsUser, paths: list[Path]) -> dict[str, str]:
    r = world.python(user, TRY_OPEN, *map(str, paths))
    assert r.returncode == 0, r.stderr
    return dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())


def test_bob_cannot_open_alices_pins_or_records(world: World) -> None:
    """Attack: bob opens alice's job state: the namespace pins (to join or hold her
    namespace), state.json and run.env (her paths, options, errors). Defence: every open
    fails with EACCES (PermissionError); alice herself can read run.env and state.json."""
    assert world.setup("90").returncode == 0
    d = world.box.state / "jobs/90"
    private = [d / "ns/mnt", d / "ns/user", d / "state.json", d / "run.env"]
    got = opened(world, world.bob, private)
    assert got == {str(p): "PermissionError" for p in private}
    mine = opened(world, world.alice, [d / "run.env", d / "state.json"])
    assert set(mine.values()) == {"ok"}, mine
    assert world.run("90", "true", user=world.alice).returncode == 0
    assert world.teardown("90").returncode == 0
    world.assert_clean()


def test_bob_cannot_plant_anything_in_the_state_directory(world: World) -> None:
    """Attack: bob pre-creates entries for a future job in the state directory (a record,
    a lock, a job directory, a symlink), or fills it. Defence: the state directory is
    root-only: every attempt fails with PermissionError; a later setup is unaffected."""
    assert world.setup("91").returncode == 0
    state, jobs = world.box.state, world.box.state / "jobs"
    attempts = [
        f"open:{state}/junk",
        f"mkdir:{jobs}/92",
        f"open:{jobs}/92.lock",
        f"symlink:{jobs}/93",
        f"open:{jobs}/91/run.env.tmp-1",
        f"mkdir:{jobs}/91/ns/x",
        f"open:{jobs}/91/state.json",
    ]
    code = r"""
import os, sys
for a in sys.argv[1:]:
    op, path = a.split(":", 1)
    try:
        if op == "open":
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        elif op == "mkdir":
            os.mkdir(path)
        else:
            os.symlink("/tmp", path)
        print(a, "ok")
    except OSError as e:
        print(a, type(e).__name__)
"""
    r = world.python(world.bob, code, *attempts)
    assert r.returncode == 0, r.stderr
    results = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert results == {a: "PermissionError" for a in attempts}
    assert world.setup("92").returncode == 0
    assert world.run("92", "true", user=world.alice).returncode == 0
    for job in ("91", "92"):
        assert world.teardown(job).returncode == 0
    world.assert_clean()


@pytest.mark.parametrize("how", ["plain", "user-flag", "slurm-env"])
def test_bob_cannot_join_alices_job(world: World, how: str) -> None:
    """Attack: bob runs a task in alice's job (knowing its id), directly, naming her as the
    user, or through Slurm's variables. Defence: 125 and one line; nothing runs; her
    files stay hers."""
    assert world.setup("93").returncode == 0
    assert (
        world.run("93", "echo secret > /tmp/s; chmod 600 /tmp/s", user=world.alice).returncode == 0
    )
    marker = world.w / "bob-ran"
    args = {
        "plain": ["--job-id", "93"],
        "user-flag": ["--job-id", "93", "--user", "jobnsalice"],
        "slurm-env": [],
    }[how]
    env = {"SLURM_JOB_ID": "93", "SLURM_JOB_USER": "jobnsalice"} if how == "slurm-env" else None
    r = world.box.run(
        ["run", *args, "--", "sh", "-c", f"cat /tmp/s; touch {marker}"], user=world.bob, env=env
    )
    assert r.returncode == 125, (r.stdout, r.stderr)
    one_line(r)
    assert "secret" not in r.stdout and not marker.exists()
    assert world.teardown("93").returncode == 0
    world.assert_clean()


@pytest.mark.parametrize(
    "argv",
    [
        ["setup", "--job-id", "94", "--user", "jobnsbob"],
        ["setup", "--job-id", "95"],
        ["teardown", "--job-id", "94"],
        ["teardown", "--job-id", "94", "--force", "--hurry"],
        ["gc"],
        ["gc", "--no-slurm"],
        ["recover", "--job-id", "94"],
        ["recover"],
    ],
    ids=[
        "setup-hers",
        "setup-new",
        "teardown",
        "teardown-force",
        "gc",
        "gc-no-slurm",
        "recover-hers",
        "recover-all",
    ],
)
def test_bob_cannot_run_root_subcommands(world: World, argv: list[str]) -> None:
    """Attack: bob runs the root-only subcommands against alice's job (or all jobs).
    Defence: 125 and one line saying root is needed; alice's job is unaffected."""
    assert world.setup("94").returncode == 0
    record = (world.box.state / "jobs/94/state.json").read_bytes()
    r = world.box.run(argv, user=world.bob)
    assert r.returncode == 125, (r.stdout, r.stderr)
    one_line(r)
    assert "root" in r.stderr
    assert (world.box.state / "jobs/94/state.json").read_bytes() == record
    assert world.run("94", "true", user=world.alice).returncode == 0
    assert world.teardown("94").returncode == 0
    world.assert_clean()


def test_bob_cannot_ptrace_or_steal_from_alices_job_tasks(world: World) -> None:
    """Attack: bob ptrace-attaches to, pidfd_getfd()s from, and reads /proc of a task of
    alice's job. Defence: all refused (EPERM / PermissionError)."""
    assert world.setup("96").returncode == 0
    _, pid = world.task("96", world.alice)
    r = world.python(world.bob, PTRACE_ATTACH, str(pid))
    assert r.stdout.strip() == "errno 1", r.stdout + r.stderr
    stolen = json.loads(world.python(world.bob, STEAL_FDS, str(pid)).stdout)
    assert stolen["got"] == [] and stolen["errors"] == [1], stolen
    got = opened(
        world,
        world.bob,
        [Path(f"/proc/{pid}/environ"), Path(f"/proc/{pid}/ns/mnt"), Path(f"/proc/{pid}/root/tmp")],
    )
    assert set(got.values()) == {"PermissionError"}, got
    assert world.teardown("96").returncode == 0
    world.assert_clean()


def test_alice_cannot_reach_root_processes_of_her_own_job(world: World) -> None:
    """Attack: root (slurmstepd-like) runs a task of alice's job; alice ptraces or
    pidfd_getfd()s every process of that task tree she can find (the jobns supervisor,
    its children) to get root's fds or control. Defence: any process with a root uid
    refuses her (EPERM); any process running as her holds nothing of root's (no state
    file, lock or base directory)."""
    box, alice = world.box, world.alice
    assert world.setup("97").returncode == 0
    pidfile = world.w / "root-task.pid"
    sup = world.start_jobns(
        ["run", "--job-id", "97", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]
    )
    world.wait_file(pidfile)
    protected = {identity(box.local), identity(box.shm), identity(box.state)}
    for root, dirs, files in os.walk(box.state):
        protected |= {identity(Path(root) / n) for n in [*dirs, *files]}
    checked = 0
    for pid in [sup.pid, *descendants(sup.pid)]:
        uids = uids_of(pid)
        if not uids:
            continue
        checked += 1
        stolen = json.loads(world.python(alice, STEAL_FDS, str(pid)).stdout)
        if 0 in uids:
            assert stolen["got"] == [], (pid, uids, stolen)
            r = world.python(alice, PTRACE_ATTACH, str(pid))
            assert r.stdout.strip() != "attached", (pid, uids)
        else:
            leaked = [fd for fd, dev, ino in stolen["got"] if (dev, ino) in protected]
            assert leaked == [], (pid, uids, leaked)
    assert checked >= 2
    assert world.teardown("97").returncode == 0
    world.assert_clean()


def test_status_and_env_as_another_user_do_not_crash(world: World) -> None:
    """Attack: bob runs `jobns status` and `jobns env --job-id <alice's>` (which read job
    state he may not read). Defence: no traceback, no internal error, and none of alice's
    job's private details (her user name) in what bob sees from her record."""
    assert world.setup("98").returncode == 0
    for args in (["status"], ["status", "--json"], ["env", "--job-id", "98"]):
        r = world.box.run(args, user=world.bob)
        no_crash(r)
        assert r.returncode in (0, 125), (args, r.stdout, r.stderr)
        if r.returncode == 125:
            one_line(r)
        if args[0] == "status":
            assert world.alice.name not in r.stdout, r.stdout
    assert world.teardown("98").returncode == 0
    world.assert_clean()
