"""The C module behind `signal`, typed as its Python face (the hot set only).

jobns runs once per task, so import time is launch time: `signal` wraps `_signal` in
enums (~4 ms, mostly importing enum). mypy checks `signal` against the Python module;
tests/unit/test_fastimport.py checks that the two agree.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal


__all__ = ["signal"]
