"""The C modules behind `signal` and `prctl`, typed as their Python faces.

jobns runs once per task, so import time is launch time: `signal` wraps
`_signal` in enums (~4 ms, mostly importing enum) and `prctl` builds classes
for every capability (~1.5 ms). The functions and constants we use are the C
modules' own, so we import those; mypy checks against the Python modules.
"""

from __future__ import annotations

import _prctl

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal


def set_pdeathsig(sig: int) -> None:
    _prctl.prctl(_prctl.PR_SET_PDEATHSIG, sig)


def set_child_subreaper(on: bool) -> None:
    _prctl.prctl(_prctl.PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def set_dumpable(on: bool) -> None:
    _prctl.prctl(_prctl.PR_SET_DUMPABLE, 1 if on else 0)


__all__ = ["set_child_subreaper", "set_dumpable", "set_pdeathsig", "signal"]
