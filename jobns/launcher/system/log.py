"""Syslog (journald) lines for the root commands: setup, teardown, gc, recover.

Slurm discards a prolog's and an epilog's output, so what jobns does on a node and
every failure also go where administrators look: one line per action, with the job id
and user, as `jobns[PID]: <command> job=<id> user=<name>: <what>` (facility daemon;
`journalctl -t jobns`, or /var/log/syslog with rsyslog). Never on the `jobns run` path:
only the root commands import this module.

Test hook (docs/admin.md "Logs"): with JOBNS_TEST_SYSLOG_SOCKET=<path> in root's environment the
lines go, in the same RFC 3164 form the C library sends to /dev/log, to that datagram
socket instead, so a test can read them without a syslog daemon.
"""

from __future__ import annotations

import os
import syslog

TEST_SOCKET_VAR = "JOBNS_TEST_SYSLOG_SOCKET"
LEVELS = {"info": syslog.LOG_INFO, "warning": syslog.LOG_WARNING, "error": syslog.LOG_ERR}
MAX_LINE = 4000

_opened = False
command = "jobns"  # the subcommand (launcher.commands.cli sets it for the commands that log)
_job: str | None = None
_user: str | None = None


def begin(name: str, job_id: str | None, user: str | None) -> None:
    """The command and, when known, its job and user: every later line carries them."""
    global command, _job, _user
    command, _job, _user = name, job_id, user


def outcome(code: int, error: str | None) -> None:
    """The command's last line: done, or failed with its one-line reason."""
    if code == 0 and error is None:
        log("done")
    else:
        log(f"failed (exit {code}): {error or 'see the messages above'}", level="error")


def line(name: str, message: str, job_id: str | None = None, user: str | None = None) -> str:
    """The text of one log line (one line, bounded, whatever a message carried)."""
    who = "".join(f" {k}={v}" for k, v in (("job", job_id), ("user", user)) if v)
    return " ".join(f"{name}{who}: {message}".split())[:MAX_LINE]


def log(
    message: str, job_id: str | None = None, user: str | None = None, level: str = "info"
) -> None:
    """Send one line about job_id (default: the command's job); never fails (logging
    must not fail a prolog)."""
    global _opened, _user
    if job_id is None:
        job_id = _job
    if job_id == _job and job_id is not None:
        if user and not _user:
            _user = user  # learnt from the record (an epilog is given only the id)
        user = user or _user
    text = line(command, message, job_id, user)
    priority = LEVELS.get(level, syslog.LOG_INFO)
    try:
        sock_path = os.environ.get(TEST_SOCKET_VAR)
        if sock_path:
            _send_test(sock_path, priority, text)
            return
        if not _opened:
            syslog.openlog("jobns", syslog.LOG_PID, syslog.LOG_DAEMON)
            _opened = True
        syslog.syslog(priority, text)
    except (OSError, ValueError):
        pass


def _send_test(path: str, priority: int, text: str) -> None:
    import socket  # only under the test hook: warn() may log from the OCI hook (hot set)
    import time

    stamp = time.strftime("%b %e %H:%M:%S")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(
            f"<{syslog.LOG_DAEMON | priority}>{stamp} jobns[{os.getpid()}]: {text}".encode(), path
        )


def command_line(
    name: str, opts: dict[str, str | bool | None], code: int | None, error: str | None
) -> None:
    """launcher.commands.cli's two calls: before the command (code None: who it is about), and
    after it (its outcome)."""
    if code is None or command != name:
        job = opts.get("job_id") or os.environ.get("SLURM_JOB_ID")
        user = opts.get("user") or os.environ.get("SLURM_JOB_USER")
        begin(name, str(job) if job else None, str(user) if user else None)
    if code is not None:
        outcome(code, error)
