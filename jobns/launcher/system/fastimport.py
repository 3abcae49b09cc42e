"""The C module behind `signal`, typed as its Python face, and the three prctl calls.

jobns runs once per task, so import time is launch time: `signal` wraps `_signal` in
enums (~4 ms, mostly importing enum), and python-prctl's C module costs a dlopen
(~0.2 ms) for three calls that launcher.system.libc (loaded anyway) makes directly. mypy checks
`signal` against the Python module; tests/unit/test_fastimport.py checks that these agree
with the plain `signal` and `prctl` modules.
"""

from __future__ import annotations

from jobns.launcher.system import libc

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal


# <linux/prctl.h>
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def set_pdeathsig(sig: int) -> None:
    libc.prctl(PR_SET_PDEATHSIG, int(sig))


def set_child_subreaper(on: bool) -> None:
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_dumpable(on: bool) -> None:
    libc.prctl(PR_SET_DUMPABLE, 1 if on else 0)


__all__ = ["set_child_subreaper", "set_dumpable", "set_pdeathsig", "signal"]
