"""launcher.system.mountinfo: unescaping, parsing this process's real /proc/self/mountinfo, and
which mounts lie under a path (no root)."""

from __future__ import annotations

import os
import re

import pytest

from jobns.launcher.system import mountinfo
from jobns.launcher.system.mountinfo import Mount, mounts, under, unescape

# ------------------------------------------------------------------------- unescape


@pytest.mark.parametrize(
    ("field", "want"),
    [
        ("/plain/path", "/plain/path"),
        ("/a\\040b", "/a b"),
        ("/tab\\011x", "/tab\tx"),
        ("/nl\\012x", "/nl\nx"),
        ("/back\\134slash", "/back\\slash"),
        ("\\040\\040", "  "),
        ("/end\\040", "/end "),
        ("\\0401", " 1"),  # three digits only
        ("", ""),
    ],
)
def test_unescape_decodes_octal_escapes(field: str, want: str) -> None:
    assert unescape(field) == want


@pytest.mark.parametrize(
    "field",
    [
        "\\",
        "/a\\",
        "/a\\0",
        "/a\\04",
        "/a\\x41b",
        "/a\\\\b",
        "/a\\04x",
        "/a\\ b",
    ],
)
def test_a_backslash_without_three_octal_digits_stays(field: str) -> None:
    assert unescape(field) == field


@pytest.mark.parametrize("field", ["/a\\089", "/a\\900"])
def test_a_backslash_with_non_octal_digits_stays(field: str) -> None:
    assert unescape(field) == field


def test_unescape_inverts_the_kernels_escaping() -> None:
    """The kernel escapes space, tab, newline and backslash (fs/proc_namespace.c)."""
    for name in ("a b", "tab\there", "line\nbreak", "back\\slash", "all \t\n\\ four", "é ✓"):
        escaped = "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in name)
        assert unescape(escaped) == name


# ------------------------------------------------------------------------- mounts


def raw_lines() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return f.read().splitlines()


def test_mounts_parses_every_line_of_this_processs_mountinfo() -> None:
    found = mounts()
    lines = raw_lines()
    assert len(found) == len(lines)
    for m, line in zip(found, lines, strict=True):
        left, _, right = line.partition(" - ")
        fields = left.split()
        assert m.dev == fields[2] and re.fullmatch(r"\d+:\d+", m.dev)
        assert m.point == unescape(fields[4]) and m.point.startswith("/")
        assert m.fstype == right.split()[0] and m.fstype
        assert m.source == unescape(right.split()[1])
        assert m.optional == tuple(fields[6:])
        assert all(
            re.fullmatch(r"(shared|master|propagate_from):\d+|unbindable", o) for o in m.optional
        ), m.optional


def test_mounts_finds_the_root_and_proc() -> None:
    found = mounts()
    assert any(m.point == "/" for m in found)
    proc = [m for m in found if m.point == "/proc"]
    assert proc and proc[-1].fstype == "proc"
    st = os.stat("/proc")
    assert proc[-1].dev == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def test_under_the_real_proc() -> None:
    inside = under("/proc")
    assert inside and inside[0].point == "/proc"
    assert all(m.point == "/proc" or m.point.startswith("/proc/") for m in inside)


# ------------------------------------------------------------------------- under


def fake(points: list[str]) -> list[Mount]:
    return [Mount(f"0:{i}", p, "tmpfs", f"src{i}") for i, p in enumerate(points)]


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> list[Mount]:
    """A fake mount table, in mount order (bottom first)."""
    found = fake(
        [
            "/",
            "/proc",
            "/job/tmp/a/b",  # mounted before its parent mount point below
            "/job",
            "/job/tmp",
            "/jobx",  # a sibling with the same prefix: not under /job
            "/job/tmp/a",
            "/job",  # a second mount stacked on /job
            "/other/job",
            "/job/var_tmp",
        ]
    )
    monkeypatch.setattr(mountinfo, "mounts", lambda: found)
    return found


def points(ms: list[Mount]) -> list[str]:
    return [m.point for m in ms]


def test_under_returns_shallowest_first_then_mount_order(table: list[Mount]) -> None:
    got = under("/job")
    assert points(got) == ["/job", "/job", "/job/tmp", "/job/var_tmp", "/job/tmp/a", "/job/tmp/a/b"]
    # Two mounts on one point: bottom first, as in mountinfo.
    assert [m.dev for m in got[:2]] == ["0:3", "0:7"]


def test_under_accepts_a_trailing_slash(table: list[Mount]) -> None:
    assert points(under("/job/")) == points(under("/job"))


def test_under_a_path_without_mounts_is_empty(table: list[Mount]) -> None:
    assert under("/nothing") == []
    assert under("/jo") == []  # a prefix of a mount point is not a parent of it


def test_under_a_deeper_path(table: list[Mount]) -> None:
    assert points(under("/job/tmp")) == ["/job/tmp", "/job/tmp/a", "/job/tmp/a/b"]


def test_under_the_root_puts_the_root_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mountinfo, "mounts", lambda: fake(["/proc", "/", "/tmp"]))
    assert points(under("/")) == ["/", "/proc", "/tmp"]
