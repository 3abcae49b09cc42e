"""Config parsing and validation (no root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobns.launcher.model.config import DEFAULT_PATH, config_path, load, parse
from jobns.launcher.system.errors import JobnsError


def test_defaults_without_file(tmp_path: Path) -> None:
    cfg = load(None, {"JOBNS_CONFIG": ""})
    if cfg.source is None:  # no /etc/jobns/jobns.toml on this machine
        assert (cfg.local_base, cfg.shm_base, cfg.shared_base) == ("/tmp", "/dev/shm", "")
        assert cfg.kill_wait == 30.0 and cfg.arc is None


def test_path_precedence() -> None:
    assert config_path("/a", {"JOBNS_CONFIG": "/b"}) == ("/a", True)
    assert config_path(None, {"JOBNS_CONFIG": "/b"}) == ("/b", True)
    assert config_path(None, {}) == (DEFAULT_PATH, False)


def test_full_file(tmp_path: Path) -> None:
    p = tmp_path / "j.toml"
    p.write_text(
        'local_base = "/scratch"\nshm_base = "/dev/shm"\nshared_base = "/lustre/x"\n'
        'kill_wait = 5\n[arc]\nshared_filesystem = false\nscratchdir = "/s"\n'
    )
    cfg = load(str(p), {})
    assert (cfg.local_base, cfg.shared_base, cfg.kill_wait) == ("/scratch", "/lustre/x", 5.0)
    assert cfg.arc is not None and cfg.arc.scratchdir == "/s" and not cfg.arc.shared_filesystem


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("kill_wait = -1", "kill_wait: must be >= 0"),
        ('kill_wait = "soon"', "kill_wait: must be of type number"),
        ("kill_wait = true", "kill_wait: must be of type number"),
        ('locl_base = "/x"', "locl_base: unknown key"),
        ('local_base = "tmp"', "absolute"),
        ('local_base = "/tmp/../etc"', "absolute"),
        ('local_base = "/tmp/"', "absolute"),
        ("[arc]\nshared_filesystem = false", "needs scratchdir"),
        ("[arc]\nmovtool = 'mv'", "arc.movtool: unknown key"),
        ("x = [", "not valid TOML"),
    ],
)
def test_bad_files_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(JobnsError, match="read config /f") as e:
        parse(text, "/f")
    assert needle in str(e.value)


def test_missing_explicit_file() -> None:
    with pytest.raises(JobnsError, match="no such file"):
        load("/nonexistent/jobns.toml", {})


def test_namespace_pid() -> None:
    """[namespace] pid: off by default, a boolean, nothing else in the section."""
    from jobns.launcher.model.config import Config, check

    assert not Config(parse("", "x"), "x").pid_ns
    assert Config(parse("[namespace]\npid = true\n", "x"), "x").pid_ns
    for bad in ('[namespace]\npid = "yes"\n', "[namespace]\nuser = true\n"):
        with pytest.raises(JobnsError, match="namespace"):
            check(parse(bad, "x"), "x")
