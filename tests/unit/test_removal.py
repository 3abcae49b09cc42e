"""launcher.system.removal on real trees the test builds in tmp_path (no root, no mounts).

Removal is fd-relative and never follows a link, grants an owner rwx on her own mode-000
or read-only directories, moves subtrees deeper than MAX_DEPTH up so the number of open
fds stays bounded, fans a wide directory out to threads, and goes on past a failure,
naming every path it could not remove.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobns.launcher.system import removal


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, removal.O_DIR)
    yield fd
    os.close(fd)


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory beside the tree: link targets that must survive removal."""
    out = tmp_path_factory.mktemp("outside")
    (out / "file").write_text("keep me")
    (out / "dir").mkdir()
    (out / "dir" / "inner").write_text("keep me too")
    return out


def assert_outside_intact(out: Path) -> None:
    assert (out / "file").read_text() == "keep me"
    assert (out / "dir" / "inner").read_text() == "keep me too"


def build_tree(top: Path) -> None:
    """Files, nested directories, an empty directory, a FIFO and a socket."""
    (top / "a" / "b" / "c").mkdir(parents=True)
    (top / "empty").mkdir()
    (top / "f").write_text("x")
    (top / "a" / "f").write_bytes(b"\0" * 4096)
    (top / "a" / "b" / "c" / "f").write_text("deep")
    (top / ".hidden").write_text("h")
    os.mkfifo(top / "a" / "fifo")
    # Bound through the directory's fd: a sun_path is short, tmp_path may not be.
    a_fd = os.open(top / "a", removal.O_DIR)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(f"/proc/self/fd/{a_fd}/s")
    finally:
        sock.close()
        os.close(a_fd)
    assert stat.S_ISSOCK(os.lstat(top / "a" / "s").st_mode)


def make_chain(top: Path, levels: int, name: str = "d") -> Path:
    """top/d/d/.../d (levels directories), a file at the bottom; returns the bottom."""
    path = top
    for _ in range(levels):
        path = path / name
    path.mkdir(parents=True)
    (path / "bottom").write_text("x")
    return path


# ------------------------------------------------------------------------- remove_entry


def test_remove_entry_removes_a_file(tmp_path: Path, dir_fd: int) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "other").write_text("y")
    assert removal.remove_entry(dir_fd, "f", f"{tmp_path}/f") == []
    assert os.listdir(tmp_path) == ["other"]


def test_remove_entry_removes_a_whole_tree(tmp_path: Path, dir_fd: int) -> None:
    build_tree(tmp_path / "t")
    (tmp_path / "sibling").write_text("y")
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert os.listdir(tmp_path) == ["sibling"]


def test_remove_entry_of_a_missing_name_is_no_error(tmp_path: Path, dir_fd: int) -> None:
    assert removal.remove_entry(dir_fd, "nothing", f"{tmp_path}/nothing") == []
    assert os.listdir(tmp_path) == []


def test_symlinks_inside_the_tree_are_unlinked_never_followed(
    tmp_path: Path, dir_fd: int, outside: Path
) -> None:
    top = tmp_path / "t"
    (top / "sub").mkdir(parents=True)
    (top / "to_file").symlink_to(outside / "file")
    (top / "to_dir").symlink_to(outside / "dir")
    (top / "sub" / "to_dir").symlink_to(outside / "dir")
    (top / "sub" / "dangling").symlink_to(outside / "missing")
    (top / "sub" / "to_root").symlink_to("/")
    (top / "sub" / "loop").symlink_to("loop")
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert os.listdir(tmp_path) == []
    assert_outside_intact(outside)


@pytest.mark.parametrize("target", ["file", "dir"])
def test_a_symlink_given_as_the_entry_itself_is_unlinked(
    tmp_path: Path, dir_fd: int, outside: Path, target: str
) -> None:
    (tmp_path / "link").symlink_to(outside / target)
    assert removal.remove_entry(dir_fd, "link", f"{tmp_path}/link") == []
    assert os.listdir(tmp_path) == []
    assert_outside_intact(outside)


def test_clear_dir_follows_no_symlink_either(tmp_path: Path, dir_fd: int, outside: Path) -> None:
    (tmp_path / "to_dir").symlink_to(outside / "dir")
    (tmp_path / "to_file").symlink_to(outside / "file")
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert os.listdir(tmp_path) == []
    assert_outside_intact(outside)


# ------------------------------------------------------------------------- clear_dir


def test_clear_dir_empties_the_directory_but_keeps_it(tmp_path: Path, dir_fd: int) -> None:
    build_tree(tmp_path)
    before = os.fstat(dir_fd)
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert os.listdir(tmp_path) == []
    after = os.stat(tmp_path)
    assert (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev)


def test_clear_dir_of_an_empty_directory(tmp_path: Path, dir_fd: int) -> None:
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert tmp_path.is_dir()


# ------------------------------------------------------------------------- permissions


@pytest.mark.parametrize("mode", [0o000, 0o100, 0o200, 0o400, 0o500, 0o300])
def test_an_owners_directory_without_permissions_is_removed(
    tmp_path: Path, dir_fd: int, mode: int
) -> None:
    """_open_for_clearing: the owner grants herself rwx (through an O_PATH fd) first."""
    top = tmp_path / "t"
    locked = top / "mid" / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "f").write_text("x")
    (locked / "inner" / "g").write_text("y")
    (locked / "inner").chmod(mode)
    locked.chmod(mode)
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert os.listdir(tmp_path) == []


def test_the_top_entry_itself_may_be_mode_000(tmp_path: Path, dir_fd: int) -> None:
    top = tmp_path / "t"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "f").write_text("x")
    top.chmod(0)
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert os.listdir(tmp_path) == []


def test_a_file_in_a_read_only_directory_is_removed(tmp_path: Path, dir_fd: int) -> None:
    """No write permission for the owner on the directory: removal still succeeds, because
    the owner's own directory is made rwx before it is emptied (the module's docstring:
    "an unprivileged owner first grants itself rwx")."""
    ro = tmp_path / "t" / "ro"
    ro.mkdir(parents=True)
    (ro / "f").write_text("x")
    (ro / "g").write_text("y")
    (ro / "f").chmod(0)  # the file's own mode does not matter for unlink
    ro.chmod(0o500)
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert os.listdir(tmp_path) == []


def test_clear_dir_grants_rwx_on_read_only_subdirectories(tmp_path: Path, dir_fd: int) -> None:
    for name, mode in (("r", 0o400), ("rx", 0o500), ("none", 0o000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
        (tmp_path / name).chmod(mode)
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


def test_what_cannot_be_removed_is_named_and_the_rest_still_goes(dir_fd: int) -> None:
    """Entries of procfs cannot be unlinked by anyone (not even root): every failure is
    reported with its path, and removal goes on past it."""
    proc_fd = os.open("/proc/self/fdinfo", removal.O_DIR)
    try:
        errors = removal.clear_dir(proc_fd, "/proc/self/fdinfo")
    finally:
        os.close(proc_fd)
    assert any(e.startswith(f"remove /proc/self/fdinfo/{dir_fd}: ") for e in errors), errors
    assert all(
        e.startswith(("remove /proc/self/fdinfo/", "open /proc/self/fdinfo/")) for e in errors
    ), errors
    assert os.path.exists(f"/proc/self/fdinfo/{dir_fd}")


def test_remove_entry_names_an_unremovable_file() -> None:
    """unlink says EPERM (as for an immutable file): the error list names the path."""
    me = f"/proc/{os.getpid()}"
    self_fd = os.open(me, removal.O_DIR)
    try:
        errors = removal.remove_entry(self_fd, "comm", f"{me}/comm")
    finally:
        os.close(self_fd)
    assert len(errors) == 1 and f"{me}/comm" in errors[0], errors
    assert os.path.exists(f"{me}/comm")


def test_a_failure_in_one_subtree_does_not_stop_the_others(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that cannot be unlinked: its path is reported, its siblings and the other
    subtrees are removed, and only its own ancestors stay (they cannot be empty)."""
    top = tmp_path / "t"
    for sub in ("a", "b", "c"):
        (top / sub / "x").mkdir(parents=True)
        (top / sub / "x" / "f").write_text("x")
        (top / sub / "g").write_text("y")
    real_unlink = os.unlink
    stuck = os.stat(top / "b" / "x" / "f").st_ino

    def unlink(name: str, *, dir_fd: int | None = None) -> None:
        if name == "f" and dir_fd is not None and os.stat(name, dir_fd=dir_fd).st_ino == stuck:
            raise PermissionError(1, "Operation not permitted")
        real_unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", unlink)
    errors = removal.remove_entry(dir_fd, "t", f"{tmp_path}/t")
    monkeypatch.undo()
    path = f"{tmp_path}/t"
    assert errors == [
        f"remove {path}/b/x/f: Operation not permitted",
        f"remove {path}/b/x: Directory not empty",
        f"remove {path}/b: Directory not empty",
        f"remove {path}: Directory not empty",
    ]
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["t", "t/b", "t/b/x", "t/b/x/f"]


def test_another_file_system_in_the_tree_is_never_entered(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subdirectory on another device (a mount, faked here by its st_dev) is reported
    and left untouched; everything else goes."""
    top = tmp_path / "t"
    (top / "mnt" / "deep").mkdir(parents=True)
    (top / "mnt" / "data").write_text("not ours")
    (top / "plain").mkdir()
    (top / "plain" / "f").write_text("x")
    mount_ino = os.stat(top / "mnt").st_ino
    real_fstat = os.fstat

    class Other:
        def __init__(self, st: os.stat_result) -> None:
            self.st_mode = st.st_mode
            self.st_ino = st.st_ino
            self.st_dev = st.st_dev + 1

    def fstat(fd: int) -> os.stat_result | Other:
        st = real_fstat(fd)
        return Other(st) if st.st_ino == mount_ino else st

    monkeypatch.setattr(os, "fstat", fstat)
    errors = removal.remove_entry(dir_fd, "t", f"{tmp_path}/t")
    monkeypatch.undo()
    assert errors == [
        f"remove {tmp_path}/t/mnt: a file system is mounted there; unmount it first",
        f"remove {tmp_path}/t: Directory not empty",
    ]
    assert (top / "mnt" / "data").read_text() == "not ours"
    assert (top / "mnt" / "deep").is_dir()
    assert os.listdir(top) == ["mnt"]


# ------------------------------------------------------------------------- deep trees


def watch_open_fds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the number of open fds each time removal opens a directory to clear it."""
    seen: list[int] = []
    real: Callable[[int, str], int] = removal._open_for_clearing

    def counting(parent_fd: int, name: str) -> int:
        fd = real(parent_fd, name)
        seen.append(open_fds())
        return fd

    monkeypatch.setattr(removal, "_open_for_clearing", counting)
    return seen


def test_a_tree_deeper_than_max_depth_is_removed_with_bounded_fds(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    levels = removal.MAX_DEPTH * 2 + 5
    bottom = make_chain(tmp_path / "t", levels)
    bottom.chmod(0)  # the deepest directory is mode 000 too
    seen = watch_open_fds(monkeypatch)
    before = open_fds()
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert open_fds() == before
    assert os.listdir(tmp_path) == []  # no .jobns-deep-* left behind either
    assert len(seen) == levels + 1  # every directory was opened once
    assert max(seen) <= before + removal.MAX_DEPTH + 2, (max(seen), before)


def test_clear_dir_of_a_deep_tree_leaves_nothing_moved_up(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_chain(tmp_path, removal.MAX_DEPTH * 2 + 5)
    make_chain(tmp_path, removal.MAX_DEPTH + 1, name="e")
    seen = watch_open_fds(monkeypatch)
    before = open_fds()
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert open_fds() == before
    assert os.listdir(tmp_path) == []
    assert max(seen) <= before + removal.MAX_DEPTH + 2, (max(seen), before)


@pytest.mark.parametrize(("extra", "moved"), [(0, 0), (1, 1), (2, 1)])
def test_only_directories_below_max_depth_are_moved_up(
    tmp_path: Path, dir_fd: int, monkeypatch: pytest.MonkeyPatch, extra: int, moved: int
) -> None:
    make_chain(tmp_path / "t", removal.MAX_DEPTH + extra)
    renamed: list[str] = []
    real_rename = os.rename

    def rename(src: str, dst: str, **kw: int) -> None:
        renamed.append(dst)
        real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", rename)
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert len(renamed) == moved
    assert all(name.startswith(".jobns-deep-") for name in renamed)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------- wide trees


@pytest.fixture
def fan_outs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pretend to have 4 CPUs (so the fan-out runs on any machine) and record each fan-out
    with the number of subdirectories it shared out."""
    calls: list[int] = []
    real = removal._fan_out

    def spy(
        root_fd: int,
        fd: int,
        path: str,
        dev: int,
        depth: int,
        deep: list[str],
        errors: list[str],
        subdirs: list[str],
    ) -> None:
        calls.append(len(subdirs))
        real(root_fd, fd, path, dev, depth, deep, errors, subdirs)

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(removal, "_fan_out", spy)
    return calls


def test_a_wide_directory_is_fanned_out_to_threads(
    tmp_path: Path, dir_fd: int, fan_outs: list[int]
) -> None:
    width = removal.FAN_OUT_MIN * 3
    top = tmp_path / "t"
    for i in range(width):
        build_tree(top / f"s{i}")
        # a wide directory inside a worker's share: workers do not fan out again
        for j in range(removal.FAN_OUT_MIN):
            (top / f"s{i}" / "a" / f"w{j}").mkdir()
    (top / "s0").chmod(0)
    for i in range(5):
        (top / f"file{i}").write_text("x")
    before = open_fds()
    assert removal.remove_entry(dir_fd, "t", f"{tmp_path}/t") == []
    assert fan_outs == [width]  # once, at the top
    assert os.listdir(tmp_path) == []
    assert open_fds() == before


def test_fewer_subdirectories_than_fan_out_min_stay_in_one_thread(
    tmp_path: Path, dir_fd: int, fan_outs: list[int]
) -> None:
    for i in range(removal.FAN_OUT_MIN - 1):
        (tmp_path / f"s{i}" / "x").mkdir(parents=True)
    for i in range(10):
        (tmp_path / f"f{i}").write_text("x")
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert fan_outs == []
    assert os.listdir(tmp_path) == []


def test_wide_and_deep_subtrees_are_removed_by_the_workers(
    tmp_path: Path, dir_fd: int, fan_outs: list[int]
) -> None:
    """Workers move their too-deep subtrees up into the top; clear_dir then removes them."""
    width = removal.FAN_OUT_MIN + 1
    for i in range(width):
        make_chain(tmp_path / f"s{i}", removal.MAX_DEPTH + 3)
    before = open_fds()
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert fan_outs == [width]
    assert os.listdir(tmp_path) == []
    assert open_fds() == before


def test_removal_on_one_cpu_does_not_fan_out(
    tmp_path: Path, dir_fd: int, fan_outs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    for i in range(removal.FAN_OUT_MIN * 2):
        (tmp_path / f"s{i}").mkdir()
    assert removal.clear_dir(dir_fd, str(tmp_path)) == []
    assert fan_outs == []
    assert os.listdir(tmp_path) == []
