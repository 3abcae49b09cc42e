"""How root tells its own mounts from a user's (no root): the mount id of an fd, the
recorded identity of a mount, and the opens that never enter a mount (launcher.system.removal),
also on kernels without openat2."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.model.record import TreeRecord
from jobns.launcher.system import mountinfo, removal
from jobns.launcher.system.mountinfo import Identity, Mount


def test_mount_id_of_an_fd_is_its_mount_in_the_table() -> None:
    fd = os.open("/", os.O_PATH)
    try:
        m = mountinfo.by_id(mountinfo.mount_id(fd))
    finally:
        os.close(fd)
    assert m is not None and m.point == "/"
    st = os.stat("/")
    assert Identity.of(m).dev == st.st_dev


def tmpfs(mid: str = "42", dev: str = "0:77", fstype: str = "tmpfs", source: str = "x") -> Mount:
    return Mount(dev, "/t", fstype, source, (), mid, parent_id="1")


def test_an_identity_matches_only_the_mount_it_was_taken_of() -> None:
    ident = Identity.of(tmpfs())
    assert ident.matches(tmpfs())
    assert ident.matches(tmpfs(source="anything: the source proves nothing"))
    assert not ident.matches(tmpfs(mid="43"))  # another mount
    assert not ident.matches(tmpfs(dev="0:78"))  # the id reused by another file system
    # The id and even the device reused by a FUSE mount named like ours: still not ours.
    assert not ident.matches(tmpfs(fstype="fuse.squashfuse", source="jobns-shm-1"))


def test_an_identity_survives_the_record_and_a_damaged_one_is_none() -> None:
    ident = Identity(42, os.makedev(7, 3), "ext4")
    back = Identity.from_dict(ident.to_dict())
    assert back is not None and back.matches(Mount("7:3", "/t", "ext4", "/dev/loop3", (), "42"))
    for bad in (None, "x", {}, {"id": "42", "dev": 1, "fstype": "ext4"}, {"id": 1, "dev": 1}):
        assert Identity.from_dict(bad) is None


def test_a_tree_record_keeps_its_mount_identity() -> None:
    rec = {
        "role": "shm",
        "base": "/dev/shm",
        "parents": [],
        "name": "job-1",
        "children": [],
        "remove": True,
        "capacity": 1 << 20,
        "backing": "tmpfs",
        "made": True,
        "mount": {"id": 42, "dev": 77, "fstype": "tmpfs"},
    }
    t = TreeRecord.from_dict(rec)
    assert t.mount is not None and (t.mount.mount_id, t.mount.dev) == (42, 77)
    assert t.to_dict() == rec
    del rec["mount"]  # a record of the previous version
    assert TreeRecord.from_dict(rec).mount is None


@pytest.fixture(params=["openat2", "fallback"])
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run with openat2, and as on a kernel without it (the O_PATH + mount id fallback)."""
    saved = removal._OPENAT2[0]
    removal._OPENAT2[0] = request.param == "openat2"
    yield str(request.param)
    removal._OPENAT2[0] = saved


def test_open_here_opens_plain_entries_and_never_follows_a_link(
    tmp_path: Path, kernel: str
) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = removal.open_here(top, "d/e")
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "d" / "e"))
        os.close(fd)
        assert removal.stat_here(top, "f").st_size == 1
        assert os.path.samestat(removal.stat_here(top, "link"), os.lstat(tmp_path / "link"))
        for name in ("link", "link/e"):
            with pytest.raises(OSError) as e:
                removal.open_here(top, name)
            assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
    finally:
        os.close(top)


def test_open_here_never_enters_a_mount(kernel: str) -> None:
    """/proc is a mount of its own below /: looked at, never entered (EXDEV)."""
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("proc", "proc/self"):
            with pytest.raises(OSError) as e:
                removal.open_here(root, name)
            assert e.value.errno == errno.EXDEV
        with pytest.raises(OSError) as e:
            removal.stat_here(root, "proc")
        assert e.value.errno == errno.EXDEV
    finally:
        os.close(root)


def test_detach_at_leaves_a_plain_entry_alone(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert removal.detach_at(top, "d") is False
        assert removal.detach_at(top, "missing") is False
    finally:
        os.close(top)
    assert removal.take_detached() == []
