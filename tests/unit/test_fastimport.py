"""The task path's fast imports agree with the plain modules they stand in for (no root)."""

from __future__ import annotations

import os
import signal as plain_signal

import prctl

from jobns.launcher.system import fastimport, libc


def test_signal_is_the_plain_modules_c_half() -> None:
    fast = fastimport.signal
    for name in (
        "SIGTERM",
        "SIGKILL",
        "SIGCONT",
        "SIGINT",
        "SIGCHLD",
        "SIG_DFL",
        "SIG_IGN",
        "SIG_BLOCK",
        "SIG_SETMASK",
    ):
        assert getattr(fast, name) == getattr(plain_signal, name), name
    for name in ("signal", "pthread_sigmask", "sigwaitinfo", "sigtimedwait"):
        assert callable(getattr(fast, name)), name


def test_prctl_wrappers_do_what_prctl_does() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # in a child: these settings must not leak into the test process
        try:
            libc.set_pdeathsig(plain_signal.SIGUSR1)
            libc.set_child_subreaper(True)
            libc.set_dumpable(False)
            got = (
                prctl.get_pdeathsig(),
                bool(prctl.get_child_subreaper()),
                bool(prctl.get_dumpable()),
            )
            os.write(w, repr(got).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert data == repr((int(plain_signal.SIGUSR1), True, False))
