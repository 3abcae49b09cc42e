"""`jobns run` for real: namespaces, mounts, users, signals, teardown (as root and as users)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, host_mounts, job_mounts

pytestmark = pytest.mark.root


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout}s")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


# --- layouts, isolation, no leftovers -------------------------------------------------


def test_local_layout_binds_and_cleans_up(sandbox: Sandbox) -> None:
    mounts_before = job_mounts(sandbox)
    ready, gate = sandbox.root / "ready", sandbox.root / "gate"
    script = (
        "echo data > /tmp/f; echo v > /var/tmp/g; echo s > /dev/shm/h; "
        f"touch {ready}; while [ ! -e {gate} ]; do sleep 0.05; done; "
        "cat /proc/self/mountinfo"
    )
    p = sandbox.popen(
        ["run", "--job-id", "L1", "--", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    wait_for(ready)
    # Seen from the host while the job runs: the files are where docs/design.md "Directory layouts"
    # says.
    assert (sandbox.local / "job-L1/tmp/f").read_text() == "data\n"
    assert (sandbox.local / "job-L1/var_tmp/g").read_text() == "v\n"
    assert (sandbox.shm / "job-L1/h").read_text() == "s\n"
    gate.touch()
    mountinfo, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    for target in ("/tmp", "/var/tmp", "/dev/shm"):
        opts = [ln.split()[5] for ln in mountinfo.splitlines() if ln.split()[4] == target]
        assert any("nosuid" in o and "nodev" in o for o in opts), (target, opts)
    assert sandbox.leftovers() == []
    assert job_mounts(sandbox) == mounts_before


def test_two_concurrent_jobs_are_isolated(sandbox: Sandbox) -> None:
    gate = sandbox.root / "gate"
    procs = []
    for jid in ("A", "B"):
        script = (
            f"echo {jid} > /tmp/mine; echo {jid} > /dev/shm/mine; "
            f"touch {sandbox.root}/{jid}.ready; while [ ! -e {gate} ]; do sleep 0.05; done; "
            "cat /tmp/mine /dev/shm/mine; ls /tmp"
        )
        procs.append(
            sandbox.popen(
                ["run", "--job-id", jid, "--", "sh", "-c", script],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    for jid in ("A", "B"):
        wait_for(sandbox.root / f"{jid}.ready")
    # Both run now: each job's /tmp holds only its own file.
    assert (sandbox.local / "job-A/tmp/mine").read_text() == "A\n"
    assert (sandbox.local / "job-B/tmp/mine").read_text() == "B\n"
    gate.touch()
    outs = [p.communicate(timeout=30) for p in procs]
    assert outs[0][0].split() == ["A", "A", "mine", "pmix"]
    assert outs[1][0].split() == ["B", "B", "mine", "pmix"]
    assert [p.returncode for p in procs] == [0, 0]
    assert sandbox.leftovers() == []


def test_host_tmp_is_hidden(sandbox: Sandbox) -> None:
    marker = Path("/tmp") / f"jobns-host-marker-{os.getpid()}"
    marker.write_text("host")
    try:
        r = sandbox.run(["run", "--job-id", "H", "--", "ls", "-a", "/tmp"])
        assert r.returncode == 0, r.stderr
        assert marker.name not in r.stdout
    finally:
        marker.unlink()


def test_shared_layout(sandbox: Sandbox) -> None:
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "S1",
            "--use-shared-tmpdir",
            "--",
            "sh",
            "-c",
            f"touch /tmp/x /var/tmp/y; ls {sandbox.shared}/job-S1/tmp "
            f"{sandbox.shared}/job-S1/var_tmp; ls -d {sandbox.local}/job-S1 || true",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:4] == [
        f"{sandbox.shared}/job-S1/tmp:",
        "pmix",
        "x",
        f"{sandbox.shared}/job-S1/var_tmp:",
    ]
    assert "No such file" in r.stderr  # the shared layout makes no local job directory
    assert sandbox.leftovers() == []


def test_per_node_layout_and_no_rm(sandbox: Sandbox) -> None:
    host = socket.gethostname().split(".")[0]
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "P1",
            "--use-shared-tmpdir=per-node",
            "--no-rm-tmpdir",
            "--",
            "sh",
            "-c",
            "echo keep > /tmp/result; touch /dev/shm/seg",
        ]
    )
    assert r.returncode == 0, r.stderr
    kept = sandbox.shared / "job-P1" / host / "tmp" / "result"
    assert kept.read_text() == "keep\n"
    assert (sandbox.shared / "job-P1" / host / "var_tmp").is_dir()
    # --no-rm-tmpdir keeps only the shared directories; /dev/shm/job-ID always goes.
    assert not (sandbox.shm / "job-P1").exists()
    assert not (sandbox.local / "job-P1").exists()


def test_per_node_layout_is_removed_without_no_rm(sandbox: Sandbox) -> None:
    r = sandbox.run(["run", "--job-id", "P2", "--use-shared-tmpdir=per-node", "--", "true"])
    assert r.returncode == 0, r.stderr
    assert sandbox.leftovers() == []


def test_shared_without_shared_base_is_refused(sandbox: Sandbox) -> None:
    sandbox.config.write_text(f'local_base = "{sandbox.local}"\nshm_base = "{sandbox.shm}"\n')
    r = sandbox.run(["run", "--job-id", "S2", "--use-shared-tmpdir", "--", "true"])
    assert r.returncode == 125
    assert "shared_base" in r.stderr and r.stderr.count("\n") == 1
    assert sandbox.leftovers() == []


def test_tasks_of_one_job_share_and_last_one_removes(sandbox: Sandbox) -> None:
    first = sandbox.popen(
        [
            "run",
            "--job-id",
            "J",
            "--",
            "sh",
            "-c",
            f"touch /tmp/one; touch {sandbox.root}/one.ready; sleep 1.5",
        ]
    )
    wait_for(sandbox.root / "one.ready")
    r = sandbox.run(["run", "--job-id", "J", "--", "ls", "/tmp"])
    assert r.returncode == 0, r.stderr
    assert "one" in r.stdout.split()
    # The second task ended first: the first still runs, so the tree must still be there.
    assert (sandbox.local / "job-J" / "tmp" / "one").exists()
    assert first.wait(timeout=30) == 0
    assert sandbox.leftovers() == []


# --- propagation ----------------------------------------------------------------------


def test_host_mounts_propagate_in_and_job_mounts_do_not_leak(sandbox: Sandbox) -> None:
    shared_mnt = sandbox.root / "nfs"
    shared_mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "jobns-test-top", str(shared_mnt)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(shared_mnt)], check=True)
        (shared_mnt / "later").mkdir()
        leak = sandbox.root / "leak"
        leak.mkdir()
        p = sandbox.popen(
            [
                "run",
                "--job-id",
                "M",
                "--",
                "sh",
                "-c",
                f"mount -t tmpfs jobinner {leak}; touch {sandbox.root}/m.ready; "
                f"while [ ! -e {shared_mnt}/later/seen ]; do sleep 0.05; done; "
                f"echo visible",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for(sandbox.root / "m.ready")
        # An "autofs/NFS" mount made on the host while the job runs appears inside it.
        subprocess.run(
            ["mount", "-t", "tmpfs", "jobns-test-later", str(shared_mnt / "later")], check=True
        )
        (shared_mnt / "later" / "seen").touch()
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        assert out.strip() == "visible"
        assert "jobinner" not in host_mounts()
    finally:
        subprocess.run(["umount", "-R", str(shared_mnt)], check=False)


# --- users and modes ------------------------------------------------------------------


def test_root_runs_task_as_job_user(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "U1",
            "--user",
            alice.name,
            "--",
            "sh",
            "-c",
            f"id -u; id -g; touch /tmp/f; stat -c '%u %a' /tmp /tmp/f /dev/shm "
            f"{sandbox.local}/job-U1",
        ]
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == str(alice.uid) and lines[1] == str(alice.gid)
    assert lines[2:6] == [
        f"{alice.uid} 1777",
        f"{alice.uid} 644",
        f"{alice.uid} 700",
        f"{alice.uid} 700",
    ]


def test_slurm_job_user_variable_selects_user(sandbox: Sandbox, users: list[OsUser]) -> None:
    bob = users[1]
    r = sandbox.run(
        ["run", "--", "id", "-un"], env={"SLURM_JOB_ID": "77", "SLURM_JOB_USER": bob.name}
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == bob.name


def test_supplementary_groups_are_the_users(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    subprocess.run(["groupadd", "-f", "jobnsextra"], check=True)
    subprocess.run(["usermod", "-aG", "jobnsextra", alice.name], check=True)
    r = sandbox.run(["run", "--job-id", "G", "--user", alice.name, "--", "id", "-Gn"])
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted([alice.name, "jobnsextra"])


def test_unprivileged_mode_as_ordinary_user(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice = users[0]
    mounts_before = job_mounts(sandbox)
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "N1",
            "--",
            "sh",
            "-c",
            "id -u; cat /proc/self/uid_map; touch /tmp/a /var/tmp/b /dev/shm/c; "
            f"stat -c '%u' {sandbox.local}/job-N1/tmp/a /dev/shm/c",
        ],
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[0] == str(alice.uid)
    assert out[1].split() == [str(alice.uid), str(alice.uid), "1"]  # only herself mapped
    assert out[2:4] == [str(alice.uid), str(alice.uid)]  # files land owned by her on the host
    assert sandbox.leftovers() == []
    assert job_mounts(sandbox) == mounts_before


def test_ordinary_user_cannot_run_for_someone_else(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice, bob = users
    r = sandbox.run(["run", "--job-id", "X1", "--user", bob.name, "--", "true"], user=alice)
    assert r.returncode == 125
    assert "only root" in r.stderr and r.stderr.count("\n") == 1
    assert sandbox.leftovers() == []


def test_refused_user_namespace_is_one_clear_line(sandbox: Sandbox, users: list[OsUser]) -> None:
    # The kernel refuses CLONE_NEWUSER to a chrooted process (EPERM), exactly as it does
    # when the sysctl disables it; the sysctl itself is not writable on these VMs
    # (no CAP_SYS_RESOURCE), so a chroot onto a bind of / produces the real refusal.
    alice = users[0]
    jail = sandbox.root / "jail"
    jail.mkdir()
    script = (
        f"mount --rbind / {jail} && cd / && exec chroot --userspec={alice.name}:"
        f"{alice.name} {jail} " + " ".join(sandbox.cmd(["run", "--job-id", "NS0", "--", "true"]))
    )
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 125
    assert "user.max_user_namespaces" in r.stderr and r.stderr.count("\n") == 1
    assert sandbox.leftovers() == []


# --- environment ----------------------------------------------------------------------


def test_environment_tmpdir_pmix_arc(sandbox: Sandbox, users: list[OsUser]) -> None:
    sandbox.write_config(
        '[arc]\nshared_filesystem = true\nscratchdir = "/mnt/scratch/arc"\n'
        'movetool = "rsync -av"\nshared_scratch = "/net/wn/scratch"\n'
    )
    r = sandbox.run(
        [
            "run",
            "--",
            "sh",
            "-c",
            "env; stat -c '%n %u %a' $PMIX_SERVER_TMPDIR; ls -A $PMIX_SERVER_TMPDIR",
        ],
        user=users[0],
        env={"SLURM_JOB_ID": "88", "SLURM_STEP_ID": "3", "SLURM_PROCID": "5"},
    )
    assert r.returncode == 0, r.stderr
    env = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    assert env["TMPDIR"] == "/tmp"
    assert env["PMIX_SYSTEM_TMPDIR"] == "/tmp"
    assert env["PMIX_SERVER_TMPDIR"] == "/tmp/pmix"
    # PMIx libraries take these from their server (PMIx_Get), never from the environment.
    assert not {"PMIX_TMPDIR", "PMIX_NSDIR", "PMIX_PROCDIR", "PMIX_TDIR_RMCLEAN"} & set(env)
    assert env["RUNTIME_NODE_SEES_FRONTEND"] == "yes"
    assert env["RUNTIME_LOCAL_SCRATCH_DIR"] == "/mnt/scratch/arc"
    assert env["RUNTIME_LOCAL_SCRATCH_MOVE_TOOL"] == "rsync -av"
    assert env["RUNTIME_FRONTEND_SEES_NODE"] == "/net/wn/scratch"
    # /tmp/pmix is the job user's, mode 0700, and empty: no per-step or per-rank directory.
    assert r.stdout.endswith(f"\n/tmp/pmix {users[0].uid} 700\n"), r.stdout


def test_no_arc_section_sets_no_runtime_variables(sandbox: Sandbox) -> None:
    r = sandbox.run(["run", "--job-id", "E", "--", "env"])
    assert r.returncode == 0, r.stderr
    assert "RUNTIME_" not in r.stdout


def test_cwd_under_host_tmp_is_reresolved_with_a_warning(sandbox: Sandbox) -> None:
    here = Path("/tmp") / f"jobns-cwd-{os.getpid()}"
    here.mkdir()
    try:
        r = sandbox.run(["run", "--job-id", "C", "--", "pwd"], cwd=str(here))
    finally:
        here.rmdir()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "/tmp"
    assert "does not exist inside the job" in r.stderr


# --- exit codes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmd", "code"),
    [
        (["true"], 0),
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "kill -9 $$"], 128 + 9),
        (["sh", "-c", "kill -TERM $$"], 128 + 15),
        (["/nonexistent/prog"], 127),
        (["no-such-command-jobns"], 127),
        (["/etc/passwd"], 126),
    ],
)
def test_exit_codes(sandbox: Sandbox, cmd: list[str], code: int) -> None:
    r = sandbox.run(["run", "--job-id", "X", "--", *cmd])
    assert r.returncode == code, r.stderr
    if code in (126, 127):
        assert r.stderr.count("\n") == 1 and cmd[0] in r.stderr
    assert sandbox.leftovers() == []


def test_program_under_host_tmp_is_explained(sandbox: Sandbox) -> None:
    prog = Path("/tmp") / f"jobns-prog-{os.getpid()}"
    prog.write_text("#!/bin/sh\necho hi\n")
    prog.chmod(0o755)
    try:
        r = sandbox.run(["run", "--job-id", "T", "--", str(prog)])
    finally:
        prog.unlink()
    assert r.returncode == 127
    assert "private" in r.stderr and "hidden" in r.stderr


# --- signals --------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
def test_signals_are_forwarded(sandbox: Sandbox, sig: signal.Signals) -> None:
    log = sandbox.root / "sig.log"
    ready = sandbox.root / "ready"
    script = (
        f"trap 'echo got >> {log}; exit 7' {sig.name[3:]}; touch {ready}; "
        "while :; do sleep 0.05; done"
    )
    p = sandbox.popen(["run", "--job-id", "F", "--", "sh", "-c", script])
    wait_for(ready)
    p.send_signal(sig)
    assert p.wait(timeout=20) == 7
    assert log.read_text() == "got\n"


def test_sigcont_reaches_a_stopped_task(sandbox: Sandbox) -> None:
    ready = sandbox.root / "ready"
    p = sandbox.popen(
        [
            "run",
            "--job-id",
            "K",
            "--",
            "sh",
            "-c",
            f"touch {ready}; kill -STOP $$; echo resumed > {sandbox.root}/out",
        ]
    )
    wait_for(ready)
    time.sleep(0.3)
    p.send_signal(signal.SIGCONT)
    assert p.wait(timeout=20) == 0
    assert (sandbox.root / "out").read_text() == "resumed\n"


def test_sigterm_escalates_to_sigkill_for_whole_tree(sandbox: Sandbox) -> None:
    """A task that ignores SIGTERM, and a setsid'd, double-forked grandchild that ignores it too."""
    pids = sandbox.root / "pids"
    script = (
        "trap '' TERM; "
        # setsid + a background subshell: a grandchild in its own session, re-parented
        # to jobns (subreaper) once its parent exits.
        f'setsid sh -c \'trap "" TERM; (trap "" TERM; echo $$ >> {pids}; '
        f"exec sleep 300) & ' ; "
        f"echo $$ >> {pids}; while :; do sleep 0.1; done"
    )
    p = sandbox.popen(["run", "--job-id", "ESC", "--kill-wait", "1", "--", "sh", "-c", script])
    deadline = time.monotonic() + 20
    while not pids.exists() or len(pids.read_text().split()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    task_pids = [int(x) for x in pids.read_text().split()]
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=30)
    elapsed = time.monotonic() - t0
    assert code == 128 + 9  # the task ignored SIGTERM, so SIGKILL ended it
    assert elapsed >= 1.0  # kill_wait was honoured before SIGKILL
    # Every process of the task tree is gone before jobns exits: none left alive.
    assert [pid for pid in task_pids if alive(pid)] == []
    assert sandbox.leftovers() == []


def test_second_sigterm_kills_at_once(sandbox: Sandbox) -> None:
    ready = sandbox.root / "ready"
    p = sandbox.popen(
        [
            "run",
            "--job-id",
            "T2",
            "--kill-wait",
            "60",
            "--",
            "sh",
            "-c",
            f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done",
        ]
    )
    wait_for(ready)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 128 + 9


def test_leftover_daemon_is_terminated_when_command_exits(sandbox: Sandbox) -> None:
    pidfile = sandbox.root / "daemon.pid"
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "D",
            "--",
            "sh",
            "-c",
            f"setsid sleep 300 & echo $! > {pidfile}; exit 0",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert not alive(int(pidfile.read_text()))
    assert sandbox.leftovers() == []


def test_task_dies_with_jobns(sandbox: Sandbox) -> None:
    pidfile = sandbox.root / "task.pid"
    p = sandbox.popen(
        ["run", "--job-id", "PD", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]
    )
    wait_for(pidfile)
    while not pidfile.read_text().strip():
        time.sleep(0.02)
    task = int(pidfile.read_text())
    p.kill()
    p.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(task):
        assert time.monotonic() < deadline, "task survived jobns (no parent-death signal)"
        time.sleep(0.05)


# --- teardown of what jobs leave --------------------------------------------------------


def test_teardown_copes_with_hostile_leftovers(sandbox: Sandbox, users: list[OsUser]) -> None:
    victim = sandbox.root / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    script = (
        "set -e; mkdir -p /tmp/locked/inner && touch /tmp/locked/inner/f; "
        "chmod 000 /tmp/locked/inner /tmp/locked; "
        "mkdir -p /tmp/ro && touch /tmp/ro/f && chmod 500 /tmp/ro; mkfifo /tmp/fifo; "
        "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('/tmp/sock')\"; "
        f"ln -s {victim} /tmp/link-to-victim; ln -s {victim}/keep /dev/shm/link-to-file; "
        "d=/tmp/deep; for i in $(seq 200); do d=$d/d; done; mkdir -p $d; touch $d/bottom"
    )
    for user in (None, users[0]):  # root's task and an unprivileged user's own tree
        r = sandbox.run(["run", "--job-id", "HOST", "--", "sh", "-c", script], user=user)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        assert sandbox.leftovers() == []
        assert (victim / "keep").read_text() == "precious"  # symlinks were not followed


def test_removal_of_many_files(sandbox: Sandbox) -> None:
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "MANY",
            "--",
            "sh",
            "-c",
            "mkdir /tmp/m && cd /tmp/m && seq 1 5000 | xargs touch",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert sandbox.leftovers() == []


# --- bad input: one line, exit 125, nothing created, chowned or removed ----------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--job-id", "../etc", "--", "true"], "job id"),
        (["--job-id", "", "--", "true"], "job id"),
        (["--job-id", "a/b", "--", "true"], "job id"),
        (["--job-id", "x" * 129, "--", "true"], "longer than"),
        (["--job-id", "ok"], "no command"),
        (["--job-id", "ok", "--user", "no-such-user-jobns", "--", "true"], "no such user"),
        (["--job-id", "ok", "--kill-wait", "soon", "--", "true"], "--kill-wait"),
        (["--job-id", "ok", "--net", "bridge", "--", "true"], "--net"),
        (["--job-id", "ok", "--use-shared-tmpdir=sideways", "--", "true"], "per-node"),
        (["--job-id", "ok", "--bogus", "--", "true"], "unknown option"),
    ],
)
def test_bad_input(sandbox: Sandbox, args: list[str], needle: str) -> None:
    r = sandbox.run(["run", *args])
    assert r.returncode == 125
    assert needle in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("jobns: ")
    assert sandbox.leftovers() == []


def test_missing_config_file_is_refused(sandbox: Sandbox) -> None:
    r = sandbox.run(
        ["run", "--job-id", "c", "--", "true"], env={"JOBNS_CONFIG": "/nonexistent/jobns.toml"}
    )
    # --config (from the sandbox) wins over JOBNS_CONFIG: this run is fine.
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        ["/opt/jobns/venv/bin/jobns", "run", "--job-id", "c", "--", "true"],
        env={"JOBNS_CONFIG": "/nonexistent/jobns.toml", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 125
    assert "/nonexistent/jobns.toml" in r.stderr and r.stderr.count("\n") == 1


def test_bad_config_is_refused(sandbox: Sandbox) -> None:
    sandbox.config.write_text("kill_wait = -1\n")
    r = sandbox.run(["run", "--job-id", "c", "--", "true"])
    assert r.returncode == 125
    assert "kill_wait" in r.stderr and r.stderr.count("\n") == 1
    sandbox.config.write_text('local_base = "relative/path"\n')
    r = sandbox.run(["run", "--job-id", "c", "--", "true"])
    assert r.returncode == 125 and "local_base" in r.stderr


def test_unwritable_base_is_refused(sandbox: Sandbox, users: list[OsUser]) -> None:
    sandbox.local.chmod(0o755)  # root's; the user cannot make her job directory there
    r = sandbox.run(["run", "--job-id", "W", "--", "true"], user=users[0])
    assert r.returncode == 125
    assert str(sandbox.local) in r.stderr and "Permission denied" in r.stderr
    assert r.stderr.count("\n") == 1
    assert sandbox.leftovers() == []


def test_planted_symlink_is_refused_and_target_untouched(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    target = sandbox.root / "etc-like"
    target.mkdir(mode=0o755)
    (target / "passwd").write_text("root:x:0:0")
    link = sandbox.local / "job-SYM"
    link.symlink_to(target)
    os.lchown(link, users[1].uid, users[1].gid)  # planted by another user
    r = sandbox.run(["run", "--job-id", "SYM", "--user", users[0].name, "--", "true"])
    assert r.returncode == 125
    assert "symbolic link" in r.stderr and r.stderr.count("\n") == 1
    assert link.is_symlink()
    st = target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)  # not chowned, not chmodded
    assert (target / "passwd").read_text() == "root:x:0:0"
    assert sorted(os.listdir(sandbox.shm)) == []  # nothing half-made either


def test_someone_elses_directory_is_refused(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice, bob = users
    squat = sandbox.local / "job-SQ"
    squat.mkdir(mode=0o700)
    os.chown(squat, bob.uid, bob.gid)
    (squat / "bobs").write_text("mine")
    r = sandbox.run(["run", "--job-id", "SQ", "--user", alice.name, "--", "true"])
    assert r.returncode == 125
    assert "owner uid" in r.stderr and r.stderr.count("\n") == 1
    assert (squat / "bobs").read_text() == "mine"
    assert squat.stat().st_uid == bob.uid


def test_dry_run_touches_nothing(sandbox: Sandbox, users: list[OsUser]) -> None:
    r = sandbox.run(["run", "--job-id", "DRY", "--user", users[0].name, "--dry-run", "--", "true"])
    assert r.returncode == 0, r.stderr
    assert f"mkdir  {sandbox.local}/job-DRY  mode 0700" in r.stdout
    assert f"bind   {sandbox.local}/job-DRY/tmp -> /tmp" in r.stdout
    assert "env    TMPDIR=/tmp" in r.stdout
    assert sandbox.leftovers() == []


def test_net_none_has_only_loopback_up(sandbox: Sandbox, users: list[OsUser]) -> None:
    # Connecting to 127.0.0.1 works only when lo is up in the job's network namespace.
    probe = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "socket.create_connection(s.getsockname(), timeout=5); print('lo-up')"
    )
    for user in (None, users[0]):
        r = sandbox.run(
            [
                "run",
                "--job-id",
                "NET",
                "--net",
                "none",
                "--",
                "sh",
                "-c",
                f'cat /proc/net/dev; python3 -c "{probe}"',
            ],
            user=user,
        )
        assert r.returncode == 0, r.stderr
        ifaces = [ln.split(":")[0].strip() for ln in r.stdout.splitlines()[2:] if ":" in ln]
        assert ifaces == ["lo"]
        assert r.stdout.splitlines()[-1] == "lo-up"
