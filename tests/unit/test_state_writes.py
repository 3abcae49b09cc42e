"""Record writes (no root): fsynced only where a write outlives a reboot (issue 21)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from jobns.launcher.protocol import state
from jobns.launcher.system import libc


def on_tmpfs(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return libc.fs_type(fd) in (libc.TMPFS_MAGIC, libc.RAMFS_MAGIC)
    finally:
        os.close(fd)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_a_record_on_tmpfs_is_never_fsynced(fsyncs: list[int]) -> None:
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        assert on_tmpfs(shm)
        state.write_atomic(str(shm / "state.json"), b"{}\n", what="job record")
        assert (shm / "state.json").read_bytes() == b"{}\n"
        assert (shm / "state.json").stat().st_mode & 0o777 == 0o600
        assert fsyncs == []
    finally:
        shutil.rmtree(shm)


def test_a_record_on_disk_is_fsynced_unless_it_means_nothing_after_a_reboot(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    if on_tmpfs(tmp_path):
        pytest.skip(f"{tmp_path} is on tmpfs here")
    state.write_atomic(str(tmp_path / "state.json"), b"{}\n", what="job record")
    assert len(fsyncs) == 1
    state.write_atomic(str(tmp_path / "run.env"), b"version=1\n", what="join record", durable=False)
    assert len(fsyncs) == 1
    assert sorted(os.listdir(tmp_path)) == ["run.env", "state.json"]  # no temporary left
