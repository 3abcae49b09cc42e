"""Staging plans (launcher.staging.model) and the [arc]/[staging]/[lifecycle] config (no root)."""

from __future__ import annotations

import pytest

from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.directives import DirectiveError, Directives, Symbols, parse_script
from jobns.launcher.model.job import Job, User
from jobns.launcher.model.plan import Plan
from jobns.launcher.model.plan import build as build_plan
from jobns.launcher.staging.model import Staging, build, job_to_host, session_dir_from
from jobns.launcher.system.errors import JobnsError

ALICE = User("alice", 1000, 1000, (1000,), "/home/alice")


def config(extra: str = "", movetool: str = "", shared: bool = True) -> Config:
    text = (
        'local_base = "/l"\nshm_base = "/s"\nshared_base = "/c"\n'
        f"[arc]\nshared_filesystem = {'true' if shared else 'false'}\n"
        f'scratchdir = "/scratch"\nmovetool = "{movetool}"\n'
        '[staging]\nsession_roots = ["/sess1", "/sess2"]\nstage_roots = ["/data"]\n' + extra
    )
    return Config(parse(text, "/t.toml"), "/t.toml")


def job(layout: str = "local") -> Job:
    return Job("42", ALICE, "node1", layout)


SYMS = Symbols(job_id="42", user="alice", job_name="sim", workdir="/sess1/ARCid")


def plan_for(cfg: Config, j: Job | None = None) -> tuple[Job, Plan]:
    j = j or job()
    return j, build_plan(cfg, j)


# ---------------------------------------------------------------------- session dirs


def test_session_dir_from_flag_and_template() -> None:
    cfg = config('session_dir = "%d"\n')
    assert session_dir_from("/sess2/ARCx", cfg, SYMS) == ("/sess2/ARCx", None)
    assert session_dir_from(None, cfg, SYMS) == ("/sess1/ARCid", None)
    # A working directory that is not a session directory: not an ARC job.
    path, note = session_dir_from(None, cfg, Symbols(job_id="1", workdir="/home/alice"))
    assert path is None and note is not None and "outside the allowed" in note
    path, note = session_dir_from(None, cfg, Symbols(job_id="1"))
    assert path is None and note is not None and "working directory is not known" in note
    assert session_dir_from(None, config(), SYMS) == (None, None)  # no template: no staging


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("/etc/passwd", "outside the allowed directories"),
        ("/sess1", "directly below one of"),
        ("/sess1/a/b", "directly below one of"),
        ("/sess1/../etc", "contains '..'"),
        ("/sess1/a%20b", "not a safe path component"),
        ("relative/x", "relative"),
    ],
)
def test_bad_session_dir_flags(flag: str, needle: str) -> None:
    with pytest.raises(JobnsError, match="--session-dir") as e:
        session_dir_from(flag, config(), SYMS)
    assert needle in str(e.value)


# ------------------------------------------------------------------------ the plan


def test_static_and_dynamic_scratch() -> None:
    cfg = config()
    j, plan = plan_for(cfg)
    st, notes = build(cfg, j, plan, None, "/sess1/ARCid", SYMS)
    assert notes == [] and st is not None
    assert st.session_dir == "/sess1/ARCid" and st.scratch_dir == "/scratch/ARCid"
    assert st.runtime_scratchdir == "/scratch" and st.link_stdio
    assert st.stdio == ["stdout", "stderr"]
    cfg = config("dynamic_scratch = true\n")
    j, plan = plan_for(cfg)
    st, _ = build(cfg, j, plan, None, "/sess1/ARCid", SYMS)
    assert st is not None and st.scratch_dir == "/scratch/42/ARCid"
    assert st.runtime_scratchdir == "/scratch/42"
    assert st.scratch_tree is not None and st.scratch_tree.parents == ("42",)


def test_no_staging_at_all() -> None:
    cfg = config()
    j, plan = plan_for(cfg)
    assert build(cfg, j, plan, None, None, SYMS) == (None, [])


def test_session_without_scratchdir_is_an_error() -> None:
    cfg = Config(parse('[staging]\nsession_roots = ["/sess1"]\n', "/t"), "/t")
    j, plan = plan_for(cfg)
    with pytest.raises(JobnsError, match="scratchdir is not set"):
        build(cfg, j, plan, None, "/sess1/ARCid", SYMS)


@pytest.mark.parametrize("tool", ["mv", "/bin/mv -f", "rsync -a --remove-source-files"])
def test_movetools_that_delete_sources_are_refused(tool: str) -> None:
    cfg = config(movetool=tool)
    j, plan = plan_for(cfg)
    with pytest.raises(JobnsError, match="deletes its sources itself"):
        build(cfg, j, plan, None, "/sess1/ARCid", SYMS)


def test_job_paths_map_to_the_host_trees() -> None:
    cfg = config()
    for layout, tmp in (
        ("local", "/l/job-42/tmp"),
        ("shared", "/c/job-42/tmp"),
        ("per-node", "/c/job-42/node1/tmp"),
    ):
        _, plan = plan_for(cfg, job(layout))
        assert job_to_host("/tmp/a/b", plan, None) == f"{tmp}/a/b"
        assert job_to_host("/var/tmp", plan, None) == tmp.replace("/tmp", "/var_tmp")
        assert job_to_host("/dev/shm/x", plan, None) == "/s/job-42/x"
        assert job_to_host("/scratch/A/x", plan, "/scratch/A") == "/scratch/A/x"
    with pytest.raises(JobnsError, match="internal error"):
        job_to_host("/etc", plan, None)


def directives(*lines: str) -> Directives:
    return parse_script("#!/bin/sh\n" + "".join(f"#JOBNS {ln}\n" for ln in lines) + "true\n")


def test_stage_directives_resolve_to_host_paths() -> None:
    cfg = config()
    j, plan = plan_for(cfg)
    d = directives(
        "stage_in source=/data/%u/in destination=/tmp/in",
        "stage_in source=%d/x destination=/scratch/ARCid/x",
        "stage_out source=/dev/shm/out destination=/data/%u/out-%j-%x",
        "stage_out source=/tmp/\\\\%j destination=/data/lit",
    )
    st, _ = build(cfg, j, plan, d, "/sess1/ARCid", SYMS)
    assert st is not None
    assert [(c.source, c.destination) for c in st.stage_in] == [
        ("/data/alice/in", "/l/job-42/tmp/in"),
        ("/sess1/ARCid/x", "/scratch/ARCid/x"),
    ]  # the session dir is always a host root
    assert [(c.source, c.destination) for c in st.stage_out] == [
        ("/s/job-42/out", "/data/alice/out-42-sim"),
        ("/l/job-42/tmp/%j", "/data/lit"),
    ]
    assert st.stage_in[0].line == "#JOBNS stage_in source=/data/%u/in destination=/tmp/in"
    # The record is all a crash recovery has: it must round-trip.
    again = Staging.from_record(st.record())
    assert again is not None and again.record() == st.record()


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("stage_in source=/etc/shadow destination=/tmp/x", "line 2: "),
        ("stage_in source=/data/x destination=/home/alice/x", "outside the allowed"),
        ("stage_out source=/etc/shadow destination=/data/x", "outside the allowed"),
        ("stage_in source=/data/%x/y destination=/tmp/x", "cannot be substituted for %x"),
    ],
)
def test_stage_directives_outside_their_roots_name_the_line(line: str, needle: str) -> None:
    cfg = config()
    j, plan = plan_for(cfg)
    syms = Symbols(job_id="42", user="alice", job_name="../..", workdir="/w")
    with pytest.raises(DirectiveError) as e:
        build(cfg, j, plan, directives(line), None, syms)
    assert needle in str(e.value) and "line 2" in str(e.value)


def test_stage_directives_without_configured_roots() -> None:
    cfg = Config(parse("", "/t"), "/t")
    j, plan = plan_for(cfg)
    with pytest.raises(DirectiveError, match="no directories are configured for staging"):
        build(cfg, j, plan, directives("stage_in source=/x destination=/tmp/x"), None, SYMS)


def test_describe_says_what_moves_where() -> None:
    cfg = config(movetool="rsync -a")
    j, plan = plan_for(cfg)
    st, _ = build(
        cfg,
        j,
        plan,
        directives("stage_out source=/tmp/o destination=/data/o"),
        "/sess1/ARCid",
        SYMS,
    )
    assert st is not None
    text = "\n".join(st.describe())
    assert "move /sess1/ARCid/* -> /scratch/ARCid/" in text and "movetool 'rsync -a'" in text
    assert "keep stdout, stderr in /sess1/ARCid" in text
    assert "copy out /l/job-42/tmp/o -> /data/o" in text


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[staging]\nsession_roots = ["rel"]', "session_roots: 'rel' must be an absolute"),
        ('[staging]\nstage_roots = ["/a/../b"]', "stage_roots: '/a/../b' must be an absolute"),
        ('[staging]\nstdio = ["a/b"]', "stdio: 'a/b' must be a file name"),
        ('[staging]\nsession_dir = "%d"\nsession_roots = ["/s"]', "needs [arc] scratchdir"),
        ('[arc]\nscratchdir = "/x"\n[staging]\nsession_dir = "%d"', "needs session_roots"),
        (
            '[arc]\nscratchdir = "/tmp/arc"\n[staging]\nsession_dir = "%d"\nsession_roots = ["/s"]',
            "is under /tmp",
        ),
        ('[arc]\nmovetool = "rsync \'-a"', "No closing quotation"),
        ('[lifecycle]\npre_run = "prerun.sh"', "absolute path"),
        ('[lifecycle]\npost_run = "  "', "is blank"),
        ("[lifecycle]\nprogram_timeout = 0", "program_timeout: must be >= 1"),
        ('[directives]\nword = "#JOBNS"', "does not match"),
        ('[directives]\nwordd = "X"', "directives.wordd: unknown key"),
        ("[capacity]\nshm_max = true", "capacity.shm_max: must be of type string or integer"),
        ("[staging]\ntimeout = -1", "staging.timeout: must be >= 0"),
    ],
)
def test_bad_staging_config_names_the_key(text: str, needle: str) -> None:
    with pytest.raises(JobnsError, match="read config /f") as e:
        parse(text, "/f")
    assert needle in str(e.value)


def test_full_staging_config() -> None:
    cfg = config(
        'session_dir = "%d"\ndynamic_scratch = true\nstdio = ["out.txt"]\n'
        'timeout = 60\n[lifecycle]\npre_run = "/sbin/pre --x"\n'
        '[directives]\nword = "BB_X"\n[capacity]\ngranularity = 4096\n'
        'shm_max = "1GiB"\n'
    )
    assert cfg.staging.session_dir == "%d" and cfg.staging.dynamic_scratch
    assert cfg.staging.stdio == ["out.txt"] and cfg.staging.timeout == 60.0
    assert cfg.lifecycle.pre_run == "/sbin/pre --x" and cfg.lifecycle.post_run == ""
    assert cfg.lifecycle.program_timeout == 300.0
    assert cfg.directive_word == "BB_X" and cfg.capacity["granularity"] == 4096


# ------------------------------------------------ every staging worker has a deadline


@pytest.mark.parametrize(
    ("extra", "seconds"), [("", 3600.0), ("timeout = 0", 3600.0), ("timeout = 3", 3.0)]
)
def test_staging_timeout_bounds_every_worker_by_default(extra: str, seconds: float) -> None:
    """[staging] timeout is each staging worker's deadline: 3600 s unless set; 0 (what
    older configs wrote for "no limit") is the default too, never unbounded."""
    cfg = config(extra)
    assert cfg.staging.timeout == seconds
    j, p = plan_for(cfg)
    directives = parse_script("#JOBNS stage_in source=/data/x destination=/tmp/x\n", "JOBNS")
    staging, _ = build(cfg, j, p, directives, None, SYMS)
    assert staging is not None
    assert Staging.from_record(staging.record()).deadline == seconds  # type: ignore[union-attr]


def test_a_record_without_a_staging_timeout_gets_the_default_deadline() -> None:
    """A job set up by a version whose timeout 0 meant "no limit" is torn down with the
    default deadline."""
    rec = Staging(stage_in=[]).record()
    rec["timeout"] = 0
    staging = Staging.from_record(rec)
    assert staging is not None and staging.deadline == 3600.0
    del rec["timeout"]
    staging = Staging.from_record(rec)
    assert staging is not None and staging.deadline == 3600.0


# ------------------------------------- a stage path stays on the file systems it names


MOUNTS = {1: "/", 2: "/data", 3: "/data/alice/nfs", 4: "/tmp/job-7/mnt", 5: "/datax"}


@pytest.mark.parametrize(
    ("path", "mount", "foreign"),
    [
        ("/data/alice/f", 1, None),  # "/" is an ancestor of every path
        ("/data/alice/f", 2, None),  # the root's own file system
        ("/data/alice/nfs/f", 3, None),  # a mount on the path itself
        ("/data/alice/nfs", 3, None),  # the path is the mount point
        ("/data/alice/f", 3, "the file system mounted at /data/alice/nfs"),  # a sibling's
        ("/data/alice/lnk", 4, "the file system mounted at /tmp/job-7/mnt"),  # her FUSE
        ("/data/alice/f", 5, "the file system mounted at /datax"),  # a prefix, not a parent
        ("/data/alice/f", 99, "a mount of another mount namespace"),  # /proc/PID/root/...
    ],
)
def test_stage_confined_allows_only_mounts_the_path_passes_through(
    path: str, mount: int, foreign: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobns.launcher.staging import transfer

    monkeypatch.setattr(transfer, "mount_id", lambda fd: mount)
    assert transfer.stage_confined(0, path, lambda: MOUNTS) == foreign


def test_mount_table_reads_this_process_mounts_and_fd_mount_ids() -> None:
    import os

    from jobns.launcher.staging import transfer

    table = transfer.mount_table()
    fd = os.open("/", os.O_PATH)
    try:
        assert table[transfer.mount_id(fd)] == "/"
    finally:
        os.close(fd)
    assert transfer._unescape("/a\\040b\\134c") == "/a b\\c"


def test_a_magic_link_is_never_followed(tmp_path: object) -> None:
    """open_stage_path follows ordinary links but refuses /proc/PID/root and the like."""
    import errno
    import os
    from pathlib import Path

    from jobns.launcher.staging import transfer

    assert isinstance(tmp_path, Path)
    (tmp_path / "f").write_text("x")
    (tmp_path / "plain").symlink_to(tmp_path / "f")
    (tmp_path / "magic").symlink_to(f"/proc/{os.getpid()}/root{tmp_path}/f")
    os.close(transfer.open_stage_path(str(tmp_path / "plain"), os.O_PATH))
    with pytest.raises(OSError) as e:
        transfer.open_stage_path(str(tmp_path / "magic"), os.O_PATH)
    assert e.value.errno == errno.ELOOP and "openat2" in str(e.value)
    fd = transfer.open_stage_dir(str(tmp_path / "made" / "deep"))
    os.close(fd)
    assert (tmp_path / "made" / "deep").is_dir()


def test_fork_report_messages_are_parsed_like_fork_does() -> None:
    from jobns.launcher.staging import transfer

    assert transfer._failure(b"") is None
    assert transfer._failure(b"125 U the reason") == "the reason"
    assert transfer._failure(b"garbage") == "garbage"
