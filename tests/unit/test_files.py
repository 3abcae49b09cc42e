"""launcher.system.files (issue 33, no root): the one write-to-a-temporary-name-then-rename."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from jobns.launcher.system import files


def names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_split() -> None:
    assert files.split("/run/jobns-config.cache") == ("/run", "jobns-config.cache")
    assert files.split("/x") == ("/", "x")
    assert files.split("x.prom") == (".", "x.prom")
    assert files.split("a/b/c") == ("a/b", "c")


def test_the_temporary_name_is_hidden_marked_and_never_the_names_suffix() -> None:
    a, b = files.temporary_name("jobns-1.json"), files.temporary_name("jobns-1.json")
    assert a != b and a.startswith(".jobns-1.json.tmp-") and not a.endswith(".json")
    assert files.is_temporary(a) and not files.is_temporary("jobns-1.json")
    assert not files.is_temporary("run.env.tmp-1")  # not hidden: not ours


@pytest.mark.parametrize("by", ["path", "fd"])
def test_write_replaces_the_file_with_exactly_the_mode(tmp_path: Path, by: str) -> None:
    (tmp_path / "f").write_bytes(b"old content, longer than the new\n")
    old_umask = os.umask(0o077)  # the mode is the caller's, not the umask's
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        where: int | str = fd if by == "fd" else str(tmp_path)
        files.write_atomic(where, "f", b"new\n", 0o644, fsync=False)
    finally:
        os.umask(old_umask)
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"new\n"
    assert (tmp_path / "f").stat().st_mode & 0o7777 == 0o644
    assert names(tmp_path) == ["f"]


def test_a_link_at_the_name_is_replaced_never_followed(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"keep")
    (tmp_path / "f").symlink_to(tmp_path / "target")
    files.write_atomic(str(tmp_path), "f", b"mine", 0o600, fsync=False)
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == b"mine"
    assert (tmp_path / "target").read_bytes() == b"keep"


def test_fsync_when_asked_or_when_the_callback_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs: list[int] = []
    monkeypatch.setattr(os, "fsync", fsyncs.append)  # counted, not done: a test file
    files.write_atomic(str(tmp_path), "a", b"1", 0o600, fsync=False)
    assert fsyncs == []
    files.write_atomic(str(tmp_path), "a", b"2", 0o600)  # the default: durable
    assert len(fsyncs) == 1
    asked: list[int] = []

    def never(fd: int) -> bool:
        asked.append(fd)
        return False

    files.write_atomic(str(tmp_path), "a", b"3", 0o600, fsync=never)
    assert len(asked) == 1 and len(fsyncs) == 1
    files.write_atomic(str(tmp_path), "a", b"4", 0o600, fsync=lambda fd: True)
    assert len(fsyncs) == 2
    assert (tmp_path / "a").read_bytes() == b"4" and names(tmp_path) == ["a"]


def test_prepare_runs_on_the_finished_file_after_its_mode_and_owner(tmp_path: Path) -> None:
    seen: list[os.stat_result] = []

    def prepare(fd: int) -> None:
        seen.append(os.fstat(fd))
        os.fchmod(fd, 0o640)  # what prepare sets (an ACL, say) stays

    owner = (os.getuid(), os.getgid())
    files.write_atomic(str(tmp_path), "f", b"data", 0o600, owner=owner, prepare=prepare)
    [st] = seen
    assert (st.st_mode & 0o7777, st.st_uid, st.st_size) == (0o600, os.getuid(), 4)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640


class Refused(Exception):
    pass


def test_nothing_is_left_when_prepare_fails(tmp_path: Path) -> None:
    def prepare(fd: int) -> None:
        raise Refused

    with pytest.raises(Refused):
        files.write_atomic(str(tmp_path), "f", b"data", 0o600, prepare=prepare)
    assert names(tmp_path) == []


def test_nothing_is_left_when_the_name_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"")  # not empty: rename(2) can never replace it
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for where in (str(tmp_path), fd):
            with pytest.raises(IsADirectoryError):
                files.write_atomic(where, "d", b"data", 0o600, fsync=False)
            assert names(tmp_path) == ["d"]
    finally:
        os.close(fd)
    assert names(tmp_path / "d") == ["x"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_nothing_is_made_in_a_directory_the_writer_cannot_write(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "f").write_bytes(b"old")
    ro.chmod(0o555)
    try:
        with pytest.raises(PermissionError):
            files.write_atomic(str(ro), "f", b"new", 0o644)
        assert names(ro) == ["f"] and (ro / "f").read_bytes() == b"old"
    finally:
        ro.chmod(0o755)


def test_a_temporary_keeps_its_fd_and_lock_past_the_commit(tmp_path: Path) -> None:
    t = files.Temporary(str(tmp_path), "rec", 0o600, os.O_RDWR | os.O_APPEND)
    try:
        fcntl.flock(t.fd, fcntl.LOCK_EX)
        [tmp] = names(tmp_path)
        assert files.is_temporary(tmp) and tmp.startswith(".rec.tmp-")
        files.write_all(t.fd, b"head\n")
        t.commit()
        t.discard()  # a no-op once committed
        assert names(tmp_path) == ["rec"]
        os.write(t.fd, b"more\n")
        other = os.open(tmp_path / "rec", os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        t.close()
    assert (tmp_path / "rec").read_bytes() == b"head\nmore\n"


def test_a_discarded_temporary_is_gone_and_its_name_untouched(tmp_path: Path) -> None:
    (tmp_path / "hold").write_bytes(b"old")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        t = files.Temporary(fd, "hold", 0o600, os.O_RDWR)
        files.write_all(t.fd, b"new")
        t.discard()
        t.close()
        t.close()  # twice: harmless
    finally:
        os.close(fd)
    assert names(tmp_path) == ["hold"] and (tmp_path / "hold").read_bytes() == b"old"
