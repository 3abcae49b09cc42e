"""Logs where administrators look (issue 14), for real (root): setup, teardown, gc and
recover send one syslog line per action and every failure, with the job id and user.

The lines are read from a datagram socket the test binds, named by the documented test
hook JOBNS_TEST_SYSLOG_SOCKET (docs/admin.md "Logs"), in the RFC 3164 form the C library sends
to /dev/log: `<PRI>TIMESTAMP jobns[PID]: COMMAND job=ID user=NAME: WHAT`. One test also
goes the C library's own way, to a /dev/log the test binds in a private mount namespace.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox

pytestmark = pytest.mark.root

LINE = re.compile(
    r"^<(\d+)>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d jobns\[(\d+)\]: (\S+)"
    r"((?: job=\S+)?)((?: user=\S+)?): (.+)$"
)
INFO, WARNING, ERR = 3 * 8 + 6, 3 * 8 + 4, 3 * 8 + 3  # facility daemon


class Listener:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def lines(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536).decode())
            except BlockingIOError:
                return out

    def parsed(self) -> list[tuple[int, str, str, str, str]]:
        """(priority, command, job, user, message) of every line; each must parse."""
        out = []
        for text in self.lines():
            m = LINE.match(text)
            assert m, text
            out.append(
                (int(m[1]), m[3], m[4].removeprefix(" job="), m[5].removeprefix(" user="), m[6])
            )
        return out


@pytest.fixture
def syslog(sandbox: Sandbox) -> Iterator[Listener]:
    listener = Listener(sandbox.root / "syslog.sock")
    yield listener
    listener.sock.close()


def env(listener: Listener, **extra: str) -> dict[str, str]:
    return {"JOBNS_TEST_SYSLOG_SOCKET": str(listener.path), **extra}


def test_setup_and_teardown_log_each_state_and_the_outcome(
    sandbox: Sandbox, users: list[OsUser], syslog: Listener
) -> None:
    alice = users[0].name
    r = sandbox.run(["setup", "--job-id", "L1", "--user", alice], env=env(syslog))
    assert r.returncode == 0, r.stderr
    lines = syslog.parsed()
    assert all(
        cmd == "setup" and job == "L1" and user == alice for _, cmd, job, user, _ in lines
    ), lines
    said = [msg for _, _, _, _, msg in lines]
    assert said == [
        "state staging-in",
        "state staged-in",
        "state pre-run",
        "state running",
        "done",
    ], said
    assert {p for p, *_ in lines} == {INFO}
    # The epilog is given only the job id (as Slurm's Epilog): the user comes from the record.
    r = sandbox.run(["teardown", "--job-id", "L1"], env=env(syslog))
    assert r.returncode == 0, r.stderr
    lines = syslog.parsed()
    said = [msg for _, _, _, _, msg in lines]
    assert said == [
        "state post-run",
        "state staging-out",
        "state teardown",
        "state complete",
        "done",
    ], said
    assert all(
        cmd == "teardown" and job == "L1" and user == alice for _, cmd, job, user, _ in lines
    ), lines


def test_failures_and_refusals_are_logged(
    sandbox: Sandbox, users: list[OsUser], syslog: Listener
) -> None:
    # A node-side failure: an unknown user (the prolog exits 125).
    r = sandbox.run(["setup", "--job-id", "L2", "--user", "nosuchuser-jobns"], env=env(syslog))
    assert r.returncode == 125
    lines = syslog.parsed()
    assert len(lines) == 1, lines
    prio, cmd, job, user, msg = lines[0]
    assert (prio, cmd, job, user) == (ERR, "setup", "L2", "nosuchuser-jobns")
    assert msg.startswith("failed (exit 125): ") and "nosuchuser-jobns" in msg
    # A user-caused refusal: the prolog exits 0, the reason is logged as a warning.
    r = sandbox.run(
        ["setup", "--job-id", "L3", "--user", users[0].name, "--directives", "shm capacity=2gib"],
        env=env(syslog),
    )
    assert r.returncode == 0 and "refused" in r.stderr, r.stderr
    lines = syslog.parsed()
    warnings = [x for x in lines if x[0] == WARNING]
    assert len(warnings) == 1 and "refused" in warnings[0][4] and "2gib" in warnings[0][4]
    assert warnings[0][1:4] == ("setup", "L3", users[0].name)
    assert lines[-1][4] == "done"
    assert sandbox.run(["teardown", "--job-id", "L3"]).returncode == 0
    # A directive jobns does not know refuses the job, which is logged as a warning.
    r = sandbox.run(
        ["setup", "--job-id", "L7", "--user", users[0].name, "--directives", "frobnicate x=1"],
        env=env(syslog),
    )
    assert r.returncode == 0, r.stderr
    warnings = [x for x in syslog.parsed() if x[0] == WARNING]
    assert len(warnings) == 1 and "frobnicate" in warnings[0][4], warnings
    assert warnings[0][1:4] == ("setup", "L7", users[0].name)
    assert sandbox.run(["teardown", "--job-id", "L7"]).returncode == 0
    # A dry run changes nothing and logs nothing.
    r = sandbox.run(
        ["setup", "--job-id", "L4", "--user", users[0].name, "--dry-run"], env=env(syslog)
    )
    assert r.returncode == 0 and syslog.lines() == []


def test_gc_and_recover_log_what_they_do(
    sandbox: Sandbox, users: list[OsUser], syslog: Listener
) -> None:
    alice = users[0].name
    assert sandbox.run(["setup", "--job-id", "L5", "--user", alice]).returncode == 0
    r = sandbox.run(["recover"], env=env(syslog))
    assert r.returncode == 0, r.stderr
    lines = syslog.parsed()
    assert (INFO, "recover", "L5", alice, "running: nothing to do") in lines, lines
    assert lines[-1][1:] == ("recover", "", "", "done")
    # A leftover tree (a crashed standalone task) and a job whose epilog was interrupted.
    left = sandbox.local / "job-L6"
    for d in (left, left / "tmp", left / "var_tmp"):
        d.mkdir(mode=0o700 if d == left else 0o1777)
        d.chmod(0o700 if d == left else 0o1777)
    os.chown(left, users[0].uid, users[0].gid)
    for d in (left / "tmp", left / "var_tmp"):
        os.chown(d, users[0].uid, users[0].gid)
    r = sandbox.run(["gc", "--no-slurm"], env=env(syslog))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = syslog.parsed()
    assert any(
        cmd == "gc" and str(left) in msg and msg.startswith("removing")
        for _, cmd, _, _, msg in lines
    ), lines
    assert not left.exists()
    assert sandbox.run(["teardown", "--job-id", "L5"]).returncode == 0


DEV_LOG = """set -e
old=$(mktemp -d {root}/olddev.XXXX)
mount --rbind /dev "$old"
mount -t tmpfs -o mode=0755 jobns-test /dev
for n in null zero urandom random full tty; do touch /dev/$n; mount --bind "$old/$n" /dev/$n; done
mkdir /dev/shm /dev/pts
mount --rbind "$old/shm" /dev/shm
mount --rbind "$old/pts" /dev/pts
ln -s /proc/self/fd /dev/fd
umount -l "$old"
exec {python} -c "$1" "$2" "$3" "$4"
"""
LISTEN = """
import socket, subprocess, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/dev/log")
s.settimeout(1)
for sub in (["setup", "--user", sys.argv[2]], ["teardown"]):
    r = subprocess.run([sys.argv[1], sub[0], "--config", sys.argv[3], "--job-id", "L9", *sub[1:]],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
try:
    while True:
        print(s.recv(65536).decode())
except socket.timeout:
    pass
"""


def test_the_c_librarys_syslog_reaches_dev_log(sandbox: Sandbox, users: list[OsUser]) -> None:
    """No test hook: the lines go through the stdlib syslog module to /dev/log, here a
    socket the test binds over a tmpfs /dev in a private mount namespace (this VM has no
    syslog daemon)."""
    import shutil
    import subprocess

    from tests.conftest import JOBNS, require

    require(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    script = sandbox.root / "devlog.sh"
    script.write_text(DEV_LOG.format(root=sandbox.root, python="/opt/jobns/venv/bin/python"))
    r = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "bash",
            str(script),
            LISTEN,
            JOBNS,
            users[0].name,
            str(sandbox.config),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        check=False,
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln]
    parsed = [LINE.match(ln) for ln in lines]
    assert all(parsed), lines
    said = [(m[3], m[4], m[5], m[6]) for m in parsed if m]
    who = (" job=L9", f" user={users[0].name}")
    assert ("setup", *who, "state running") in said and ("setup", *who, "done") in said
    assert ("teardown", *who, "state complete") in said and ("teardown", *who, "done") in said
    assert {int(m[1]) for m in parsed if m} == {INFO}
    assert not os.path.exists("/dev/log")  # the host's /dev was never touched


def test_without_the_hook_lines_go_to_the_c_librarys_syslog() -> None:
    """No test socket: launcher.system.log goes through the stdlib syslog module (a missing
    /dev/log is no error: logging never fails a prolog)."""
    import subprocess

    code = (
        "import os, syslog; calls = []; syslog.syslog = lambda *a: calls.append(a); "
        "os.environ.pop('JOBNS_TEST_SYSLOG_SOCKET', None); from jobns.launcher.system import log; "
        "log.begin('setup', '7', 'alice'); log.log('state running'); "
        "assert calls == [(syslog.LOG_INFO, 'setup job=7 user=alice: state running')], "
        "calls"
    )
    r = subprocess.run(
        ["/opt/jobns/venv/bin/python", "-I", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
