"""launcher.system.locking (a bounded flock) and launcher.system.rootdir (root's own
directories): real files in a temporary directory."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.locking import flock_within
from jobns.launcher.system.rootdir import ensure_root_dir


def test_flock_within_takes_a_free_lock(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "l", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert flock_within(fd, fcntl.LOCK_EX, 1.0, 0.01)
    finally:
        os.close(fd)


def test_flock_within_gives_up_at_its_deadline(tmp_path: Path) -> None:
    holder = os.open(tmp_path / "l", os.O_RDWR | os.O_CREAT, 0o600)
    waiter = os.open(tmp_path / "l", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t0 = time.monotonic()
        assert not flock_within(waiter, fcntl.LOCK_SH, 0.2, 0.01)
        assert time.monotonic() - t0 >= 0.2
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert flock_within(waiter, fcntl.LOCK_SH, 0.2, 0.01)
    finally:
        os.close(holder)
        os.close(waiter)


def test_ensure_root_dir_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(JobnsError, match=r"^helper: .*/link must be a directory of root's"):
        ensure_root_dir(str(tmp_path / "link"), 0o700, 0o077, "helper")


def test_ensure_root_dir_refuses_forbidden_bits(tmp_path: Path) -> None:
    path = tmp_path / "open"
    path.mkdir()
    path.chmod(0o777)
    with pytest.raises(JobnsError, match="remove it"):
        ensure_root_dir(str(path), 0o755, 0o022, "burst buffer")


def test_ensure_root_dir_makes_it_and_holds_it_to_root(tmp_path: Path) -> None:
    path = str(tmp_path / "new")
    if os.geteuid() == 0:
        ensure_root_dir(path, 0o700, 0o077, "helper")
        ensure_root_dir(path, 0o700, 0o077, "helper")  # there already: checked, kept
        assert os.stat(path).st_mode & 0o777 == 0o700
    else:
        # made, but not root's: an ordinary user's directory never passes
        with pytest.raises(JobnsError, match="must be a directory of root's"):
            ensure_root_dir(path, 0o700, 0o077, "helper")
        assert os.path.isdir(path)
