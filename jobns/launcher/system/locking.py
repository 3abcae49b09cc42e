"""A flock that root waits for a bounded time.

Root must never hang on a lock whose holder it does not control (a job's user can
flock her own tree root; a second `jobns bb` step may be stuck): it polls a
non-blocking flock until a deadline, and the caller says what a timeout means.
Hot path (fs.acquire_tree): imports nothing but fcntl and time, both built in.
"""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, operation: int, seconds: float, poll: float) -> bool:
    """flock(fd, operation) (LOCK_SH or LOCK_EX), polled every `poll` seconds for at
    most `seconds`: True once held, False when the deadline passed first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(poll)
