"""The one exception jobns raises for anything an operator must fix, and its exit codes."""

from __future__ import annotations

# Exit codes, as documented in README "Exit codes". 126/127 and 128+N follow the shell.
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


def describe_oserror(op: str, path: str, err: OSError) -> str:
    """'op path: reason' for an OSError, without Python's noisy repr."""
    reason = err.strerror or str(err)
    return f"{op} {path}: {reason}"
