"""Capacities, states and the transfer engine (no root: the engine runs in-process here,
on the caller's own files, across file systems where /dev/shm is one of its own)."""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.lifecycle.lifecycle import removable
from jobns.launcher.model import capacity
from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.directives import DirectiveError, parse_script
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import Pins, Record, TreeRecord, host_dirs
from jobns.launcher.protocol import state
from jobns.launcher.staging.transfer import PART, Transfer, part_name
from jobns.launcher.system.errors import JobnsError

MI = 1024**2


def cfg(text: str = "") -> Config:
    return Config(parse(text, "/t.toml"), "/t.toml")


# ------------------------------------------------------------------------- capacities


def test_capacity_plan_from_directives_defaults_and_maxima() -> None:
    c = cfg('[capacity]\ngranularity = "1MiB"\nshm_default = "1500K"\ntmp_max = "4MiB"\n')
    gran = capacity.granularity(c)
    assert gran == MI
    d = parse_script("#JOBNS tmp capacity=3000K\n", granularity=gran)
    caps = capacity.plan(c, d, "local")
    assert (caps.shm, caps.tmp) == (2 * MI, 3 * MI)  # the default is rounded up too
    assert caps.for_tree("shm") == 2 * MI and caps.for_tree("local") == 3 * MI
    assert caps.for_tree("shared") is None
    assert capacity.Capacities.from_record(caps.record()).record() == caps.record()
    with pytest.raises(DirectiveError, match=r"tmp_max = 4194304 bytes"):
        capacity.plan(c, parse_script("#JOBNS tmp capacity=5MiB\n"), "local")
    # A site default for /tmp does not apply to shared layouts; a request is an error.
    c2 = cfg('[capacity]\ntmp_default = "1MiB"\n')
    assert capacity.plan(c2, None, "shared").tmp is None
    with pytest.raises(DirectiveError, match="needs the local layout"):
        capacity.plan(c2, parse_script("#JOBNS tmp capacity=1MiB\n"), "per-node")
    assert capacity.plan(cfg(), None, "local").record() == {"shm": None, "tmp": None}


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('"2N"', "a node count (N) is not a size"),
        ('"lots"', "not a number with an optional suffix"),
        ('"0"', "must be greater than zero"),
        ('"1gib"', "case-sensitive"),
    ],
)
def test_bad_capacity_config_names_the_key(value: str, needle: str) -> None:
    with pytest.raises(JobnsError, match=r"\[capacity\] shm_max") as e:
        capacity.config_size(cfg(f"[capacity]\nshm_max = {value}\n"), "shm_max")
    assert needle in str(e.value)


@pytest.mark.parametrize("tmp_backing", ["tmpfs", "disk"])
def test_describe_capacities(tmp_backing: str) -> None:
    """The dry run: each sized tree's backing says what it puts on the tree."""
    from jobns.launcher.backing import kinds
    from jobns.launcher.model.config import Config, parse
    from jobns.launcher.model.job import Job, User
    from jobns.launcher.model.plan import build

    config = Config(parse(f'[capacity]\ntmp_backing = "{tmp_backing}"\n', "/t.toml"), "/t.toml")
    plan = build(config, Job("5", User("alice", 1001, 1001, (1001,), "/h"), "n1", "local", False))
    assert capacity.Capacities(MI, None).describe() == [
        "# tmp: no capacity (/tmp and /var/tmp on the node's file system)"
    ]
    text = "\n".join(kinds.describe(config, plan, capacity.Capacities(MI, 2 * MI)))
    assert "tmpfs size=1048576 (1.0 MiB) on the shm tree (/dev/shm), mode 0700" in text
    if tmp_backing == "disk":
        assert "jobns-local-JOB.img: sparse file of 2097152 bytes (2.0 MiB), ext4 in it" in text
        assert "loop device (autoclear) on the tmp tree (/tmp and /var/tmp)" in text
    else:
        assert "tmpfs size=2097152 (2.0 MiB) on the tmp tree (/tmp and /var/tmp)" in text


# ----------------------------------------------------------------------------- states


def rec(**fields: object) -> Record:
    r = Record("1", "alice", 1000, 1000, "n1", "local", False, "pending", 30.0)
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def test_states_are_seed_003s_plus_refused_and_history_grows() -> None:
    assert state.STATES == (
        "pending",
        "staging-in",
        "staged-in",
        "pre-run",
        "running",
        "post-run",
        "staging-out",
        "teardown",
        "teardown-fail",
        "complete",
        "refused",
    )
    r = rec()
    r.set_state("staging-in")
    assert r.state == "staging-in" and [h["state"] for h in r.history] == ["pending", "staging-in"]
    with pytest.raises(AssertionError):
        r.set_state("allocating")


def test_record_round_trips_through_its_schema_and_rejects_damage() -> None:
    r = rec(
        trees=[TreeRecord(Tree("shm", "/s", (), "job-1", (), True), 1 << 20, True)],
        pins=Pins("/p/user", "/p/mnt", 1, 2),
        errors=["x"],
        ran=True,
    )
    back = Record.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.to_dict() == r.to_dict()
    assert back.trees[0].capacity == 1 << 20 and back.pins.mnt_ino == 2 and back.ran is True
    copy = back.copy()
    copy.trees[0].made = False
    assert back.trees[0].made is True  # a copy is deep
    damaged = r.to_dict()
    damaged["state"] = "exploded"
    with pytest.raises(JobnsError, match="state"):
        Record.from_dict(damaged)
    old = r.to_dict()
    del old["ran"]  # a record of the first version: the state decides
    assert Record.from_dict(old).has_run(True) and not Record.from_dict(old).has_run(False)


def test_what_teardown_removes() -> None:
    removed, kept = (
        Tree("local", "/l", (), "job-1", ("tmp",), True),
        Tree("shared", "/s", (), "job-1", ("tmp",), False),
    )
    assert removable(removed, True, rec(ran=False))
    assert not removable(removed, False, rec(ran=False))  # found in place by a failed setup
    assert removable(removed, False, rec(ran=True)) and not removable(kept, True, rec(ran=True))
    assert removable(removed, False, rec(ran=None))  # a record of the first version


def test_host_dirs_of_a_record() -> None:
    trees = [
        {
            "role": "local",
            "base": "/l",
            "parents": [],
            "name": "job-1",
            "children": ["tmp", "var_tmp"],
            "remove": True,
        },
        {
            "role": "shm",
            "base": "/s",
            "parents": [],
            "name": "job-1",
            "children": [],
            "remove": True,
        },
    ]
    r = rec(trees=[TreeRecord.from_dict(t) for t in trees])
    assert host_dirs(r) == {
        "/tmp": "/l/job-1/tmp",
        "/var/tmp": "/l/job-1/var_tmp",
        "/dev/shm": "/s/job-1",
    }


# ---------------------------------------------------------------------- the engine


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A directory on another file system than tmp_path (/dev/shm is a tmpfs)."""
    d = Path("/dev/shm") / f"jobns-unit-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def make(top: Path, files: dict[str, bytes | str]) -> None:
    """bytes: a file; str: a symlink to it."""
    for rel, data in files.items():
        p = top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            p.symlink_to(data)
        else:
            p.write_bytes(data)


def listing(top: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for root, _dirs, names in os.walk(top):
        for n in names:
            p = Path(root) / n
            rel = str(p.relative_to(top))
            out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes()
    return out


FILES: dict[str, bytes | str] = {
    "a": b"A" * 100_000,
    "d/b": b"B",
    "d/e/c": b"",
    "d/link": "../a",
    "outside": "/etc/passwd",
}


@pytest.mark.parametrize("where", ["same", "other"])
def test_move_merges_and_empties_the_source(tmp_path: Path, other_fs: Path, where: str) -> None:
    src = tmp_path / "src"
    dst = (tmp_path if where == "same" else other_fs) / "dst"
    src.mkdir()
    dst.mkdir()
    make(src, FILES)
    make(dst, {"d/old": b"kept", "a": b"replaced"})
    (src / "d" / "e").chmod(0o750)
    t = Transfer("staging-out")
    t.move_contents(str(src), str(dst))
    assert t.errors == [] and t.warnings == []
    assert os.listdir(src) == []
    assert listing(dst) == {**FILES, "d/old": b"kept"}  # symlinks moved as symlinks
    assert stat.S_IMODE((dst / "d" / "e").stat().st_mode) == 0o750
    assert (dst / "outside").is_symlink()  # never followed


def test_move_across_file_systems_resumes_after_a_crash(tmp_path: Path, other_fs: Path) -> None:
    src, dst = tmp_path / "src", other_fs / "dst"
    src.mkdir()
    dst.mkdir()
    make(src, {"a": b"new", "d/b": b"B"})
    # What a killed earlier run leaves: a copy already in place (its source not yet
    # deleted) and a half-written part file.
    make(dst, {"a": b"new", "d/" + part_name("b"): b"hal"})
    t = Transfer("staging-out")
    t.move_contents(str(src), str(dst))
    assert t.errors == []
    assert os.listdir(src) == [] and listing(dst) == {"a": b"new", "d/b": b"B"}
    # A part file found in a *source* is an interrupted copy's, never data: dropped.
    make(src, {"x": b"x", PART + "0123": b"junk"})
    t = Transfer("teardown")
    t.move_contents(str(src), str(dst))
    assert os.listdir(src) == [] and PART + "0123" not in os.listdir(dst)


def test_conflicting_types_keep_both(tmp_path: Path, other_fs: Path) -> None:
    src, dst = tmp_path / "src", other_fs / "dst"
    make(src, {"x/f": b"in a dir", "y": b"file"})
    make(dst, {"x": b"a file", "y/g": b"dir"})
    t = Transfer("staging-out")
    t.move_contents(str(src), str(dst))
    assert len(t.errors) == 2 and all("both are kept" in e for e in t.errors)
    assert listing(src) == {"x/f": b"in a dir", "y": b"file"}


def test_unreadable_own_file_is_still_moved(tmp_path: Path, other_fs: Path) -> None:
    src, dst = tmp_path / "src", other_fs / "dst"
    make(src, {"secret": b"s"})
    dst.mkdir()
    (src / "secret").chmod(0)
    t = Transfer("staging-out")
    t.move_contents(str(src), str(dst))
    assert t.errors == []
    assert stat.S_IMODE((dst / "secret").stat().st_mode) == 0
    (dst / "secret").chmod(0o600)
    assert (dst / "secret").read_bytes() == b"s"


def test_copy_path_files_and_directories(tmp_path: Path) -> None:
    make(tmp_path / "in", {"f": b"f", "sub/g": b"g", "sub/l": "f"})
    t = Transfer("staging-in")
    t.copy_path(str(tmp_path / "in" / "f"), str(tmp_path / "out" / "deep" / "f2"), "#l1")
    t.copy_path(str(tmp_path / "in"), str(tmp_path / "tree"), "#l2")
    t.copy_path(str(tmp_path / "missing"), str(tmp_path / "m"), "#l3")
    t.copy_path(str(tmp_path / "in" / "f"), str(tmp_path / "tree"), "#l4")
    assert len(t.errors) == 2
    assert "#l3" in t.errors[0] and "does not exist" in t.errors[0]
    assert "#l4" in t.errors[1] and "is a directory" in t.errors[1]
    assert (tmp_path / "out" / "deep" / "f2").read_bytes() == b"f"
    assert listing(tmp_path / "tree") == {"f": b"f", "sub/g": b"g", "sub/l": "f"}
    assert listing(tmp_path / "in") == {"f": b"f", "sub/g": b"g", "sub/l": "f"}  # kept
    out = Transfer("staging-out")
    out.copy_path(str(tmp_path / "missing"), str(tmp_path / "m"), "#l5")
    assert out.errors == [] and "does not exist" in out.warnings[0]


def test_fifo_and_socket(tmp_path: Path, other_fs: Path) -> None:
    import socket

    src, dst = tmp_path / "src", other_fs / "dst"
    src.mkdir()
    dst.mkdir()
    os.mkfifo(src / "pipe", 0o640)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock"))
    try:
        t = Transfer("staging-out")
        t.move_contents(str(src), str(dst))
    finally:
        sock.close()
    assert stat.S_ISFIFO((dst / "pipe").lstat().st_mode)
    assert "is a socket" in t.warnings[0] and (src / "sock").exists()


def test_stdio_links(tmp_path: Path) -> None:
    session, scratch = tmp_path / "session", tmp_path / "scratch"
    make(session, {"stdout": b"o"})
    scratch.mkdir()
    t = Transfer("staging-in")
    t.link_stdio(str(session), str(scratch), ["stdout", "stderr"])
    t.link_stdio(str(session), str(scratch), ["stdout", "stderr"])  # again: no change
    assert t.errors == []
    assert os.readlink(scratch / "stdout") == f"{session}/stdout"
    assert (session / "stderr").read_bytes() == b""
    (scratch / "stderr").unlink()
    (scratch / "stderr").write_bytes(b"the job's own")
    t.unlink_stdio(str(session), str(scratch), ["stdout", "stderr"])
    assert os.listdir(scratch) == ["stderr"]  # a file the job put there is an output
