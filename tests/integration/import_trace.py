"""`import_trace.py FD ARGS...`: run the installed jobns's entry point with ARGS and write
the names of every module loaded, one line at each exec or exit, to FD
(tests/integration/test_hot_set.py). Run with `python -I`, as the #! line of the
installed script would run jobns, so nothing of the checkout is on the path."""

from __future__ import annotations

import atexit
import os
import sys

TYPE_CHECKING = False  # the tracer must not load typing (it would show in every trace)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

FD = int(sys.argv.pop(1))


def dump() -> None:
    try:
        os.write(FD, (" ".join(sorted(sys.modules)) + "\n").encode())
    except OSError:
        pass  # a forked child that closed its fds (the hook's holder): its parent wrote


def traced(call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: object) -> Any:
        dump()
        return call(*args)

    return wrapper


os.execv = traced(os.execv)
os.execve = traced(os.execve)
os._exit = traced(os._exit)
atexit.register(dump)
sys.argv[0] = "jobns"

from jobns.launcher.commands.entry import main  # noqa: E402

main()
