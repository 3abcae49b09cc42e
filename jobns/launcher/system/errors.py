"""The one exception jobns raises for anything an operator must fix, its exit codes, and
the one warning path."""

from __future__ import annotations

import sys

# Exit codes, as documented in docs/command-line.md "Exit codes". 126/127 and 128+N follow the
# shell.
EXIT_OK = 0
EXIT_JOBNS_FAILED = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128


class JobnsError(Exception):
    """A failure jobns reports as one line on stderr (``jobns: <message>``).

    The message names the operation, the path and, where there is one, the fix.
    """

    def __init__(self, message: str, code: int = EXIT_JOBNS_FAILED) -> None:
        super().__init__(message)
        self.code = code


class UserError(JobnsError):
    """A failure the job's user caused (a bad directive, a squatted or hostile path, an
    unwritable stage-out destination, a mount or writer in the job's tree, a container
    that is not hers). It fails that user's job, never the node: setup and teardown
    record it and exit 0, and every task of the job then exits 125 with the reason
    (docs/admin.md "Who is failed by what")."""


def printable_path(path: str, what: str) -> str:
    """path, if it can be named in a one-line message and opened; else a JobnsError (a
    control character would forge a line or an escape on the terminal, a NUL or a lone
    surrogate cannot be a path)."""
    if path.isprintable() and "\x00" not in path:
        return path
    raise JobnsError(
        f"{what} {path!r}: the path has a control character, a NUL or a lone "
        "surrogate; name a plain path"
    )


def describe_oserror(op: str, path: str, err: OSError) -> str:
    """'op path: reason' for an OSError, without Python's noisy repr."""
    reason = err.strerror or str(err)
    return f"{op} {path}: {reason}"


def warn(msg: str, log: str | None = "warning") -> None:
    """One line `jobns: MSG` on stderr and, at the syslog level `log`, in the node's log
    (Slurm discards a prolog's and an epilog's output). A task's path passes log=None:
    it never loads the logger (tests/unit/test_log.py)."""
    sys.stderr.write(f"jobns: {msg}\n")
    if log is not None:
        from jobns.launcher.system.log import log as to_log

        to_log(msg, level=log)
