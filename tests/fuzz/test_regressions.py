"""Regression tests (no root) for the bugs the fuzz campaign found and fixed: each the
minimal input hypothesis shrank it to, and the one-line refusal now expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobns.hook.state import parse as parse_state
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.config import Config
from jobns.launcher.model.directives import (
    DirectiveError,
    Symbols,
    confine,
    normalise,
    parse_directives,
    parse_script,
    resolve_path,
    substitute,
)
from jobns.launcher.model.job import layout_from, lookup_user
from jobns.launcher.system.errors import JobnsError
from tests.fuzz.support import check_message


def refused(f: object, *args: object) -> str:
    """f(*args) raises JobnsError (nothing else) with a one-line message; the message."""
    assert callable(f)
    with pytest.raises(JobnsError) as e:
        f(*args)
    check_message(str(e.value))
    return str(e.value)


# directives.py: '%' followed by a control character (a script line can hold ESC, a
# --directives item a line break) was named raw in the error: a second line, or a
# terminal escape, in the prolog's output and in every task's refusal.
@pytest.mark.parametrize("path", ["%\n", "/s/%\x1b[31m", "/s/%\x85", "/s/%\u2028"])
def test_unknown_symbol_that_is_a_control_character(path: str) -> None:
    msg = refused(substitute, path, Symbols())
    assert "unknown symbol" in msg


def test_unknown_symbol_in_a_script_line() -> None:
    msg = refused(parse_script, "#JOBNS stage_in source=/s/%\x1b destination=/tmp/x\n")
    assert "unknown symbol '%\\x1b'" in msg
    assert "unknown symbol '%q'" in refused(substitute, "/s/%q", Symbols())  # unchanged


# directives.py: a lone surrogate (JSON can carry one: "\ud800") in a path, a symbol's
# value or a root raised UnicodeEncodeError from the byte-length checks.
@pytest.mark.parametrize(
    ("f", "args"),
    [
        (substitute, ("/s/%x", Symbols(job_name="\ud800"))),
        (substitute, ("%d", Symbols(workdir="/\ud800"))),
        (normalise, ("/\ud800",)),
        (confine, ("/a", ["/\ud800"])),
        (resolve_path, ("/s/%u", Symbols(user="a\udfff"), ["/s"])),
        (parse_directives, ("stage_in source=/\ud800 destination=/tmp/x",)),
    ],
)
def test_lone_surrogates_are_refused(f: object, args: tuple[object, ...]) -> None:
    assert "surrogate" in refused(f, *args)


def test_surrogate_escaped_bytes_still_count_as_bytes() -> None:
    # os.fsdecode's U+DC80..U+DCFF stand for undecodable bytes: valid in file names.
    assert normalise("/a/\udcff") == "/a/\udcff"
    with pytest.raises(DirectiveError, match="longer than 255"):
        normalise("/" + "\udcff" * 256)


# The config's checker (then a home-made validator, now jsonschema behind
# config.schema_error): a document key was printed raw in "<key>: unknown key": a TOML key
# "\f" or "\n" (quoted keys may hold any escape) gave a config error of two lines.
# config._where quotes such a key.
@pytest.mark.parametrize(
    "text", ['"\\f" = []', '"a\\nb" = 1', '[arc]\n"\\u001b[2J" = 1', '"x.y" = 1']
)
def test_config_key_with_control_characters(text: str) -> None:
    msg = refused(config_mod.parse, text, "site.toml")
    assert "unknown key" in msg


def test_plain_keys_are_still_shown_plain() -> None:
    assert "frob: unknown key" in refused(config_mod.parse, "frob = 1", "site.toml")


# The config's checker (then a home-made validator, now jsonschema behind
# config.schema_error): TOML has nan and inf; every minimum/maximum comparison with nan is
# false, so `kill_wait = nan` was a valid config, and a nan reached the supervisor
# (sigtimedwait: ValueError) and the job record (jsonfast refuses nan: ValueError).
# config._non_finite refuses them before jsonschema sees the document.
@pytest.mark.parametrize(
    "text",
    [
        "kill_wait = nan",
        "kill_wait = -nan",
        "kill_wait = inf",
        "[staging]\ntimeout = nan",
        "[lifecycle]\nprogram_timeout = nan",
    ],
)
def test_config_numbers_must_be_finite(text: str) -> None:
    assert "not a number in JSON" in refused(config_mod.parse, text, "site.toml")


def test_checker_refuses_nan_like_json_cannot_hold_it() -> None:
    assert config_mod.schema_error({"kill_wait": float("nan")})
    assert config_mod.schema_error({"kill_wait": 2.5}) is None


# config.py: a NUL, control character or lone surrogate in a base path, a root or a
# command was accepted; `jobns status` then died in os.listdir (ValueError: embedded null
# byte), `jobns run` in execve (a NUL in RUNTIME_LOCAL_SCRATCH_MOVE_TOOL).
@pytest.mark.parametrize(
    "text",
    [
        'local_base = "/a\\u0000b"',
        'state_dir = "/run/\\u001b[2Jx"',
        'shm_base = "/a\\tb"',
        '[arc]\nmovetool = "cp\\u0000 -a"',
        '[arc]\nshared_scratch = "/x\\u0000"',
        '[staging]\nstage_roots = ["/s\\u0000"]',
        '[staging]\nstdio = ["out\\u0000"]',
        '[lifecycle]\npre_run = "/bin/x\\u0000"',
        'local_base = "/\ud800"',
    ],
)
def test_config_strings_usable_by_the_kernel(text: str) -> None:
    refused(config_mod.parse, text, "site.toml")


def test_config_paths_with_ordinary_unicode_still_load() -> None:
    doc = config_mod.parse(
        'local_base = "/var/lib/jobns-\u00e9t\u00e9"\n[arc]\nmovetool = "cp -a"\n', "site.toml"
    )
    assert Config(doc, "site.toml").local_base == "/var/lib/jobns-\u00e9t\u00e9"


# config.py: the --config / JOBNS_CONFIG path was shown raw in every message about the file
# (a user's `jobns env --config $'x\n...'` printed two lines), and a NUL in it made open()
# raise ValueError (an internal error).
@pytest.mark.parametrize(
    "path", ["/nonexistent/x\nforged", "/nonexistent/\x1b[2J", "/x\0y", "/nonexistent/\udcff"]
)
def test_config_path_shown_quoted(path: str) -> None:
    msg = refused(config_mod.load, path, {})
    assert "no such file" in msg and repr(path) in msg


def test_config_path_plain_is_shown_plain(tmp_path: Path) -> None:
    bad = tmp_path / "jobns.toml"
    bad.write_text("kill_wait = -1\n")
    assert f"read config {bad}: kill_wait: must be >= 0" in refused(config_mod.load, str(bad), {})


# job.py: '²' is a digit to str.isdigit but not to int(): `--user ²` (or SLURM_JOB_UID,
# or a container's org.jobns.user annotation) raised ValueError; so did a NUL or a lone
# surrogate (from a container's JSON) in a user name, out of getpwnam.
@pytest.mark.parametrize("spec", ["\u00b2", "\u0661\u00b2", "root\x00", "\ud800", "a\udcff"])
def test_lookup_user_odd_specs(spec: str) -> None:
    assert "no such user" in refused(lookup_user, spec)


def test_lookup_user_arabic_indic_digits_are_no_uid() -> None:
    # int('\u0660') == 0: taken as uid 0 (root) before; now a name, which does not exist.
    assert "no such user" in refused(lookup_user, "\u0660")


# job.py: `--use-shared-tmpdir=$'a\nb'` was echoed raw: a two-line error.
def test_layout_error_quotes_the_value() -> None:
    assert "'a\\nb'" in refused(layout_from, "a\nb")


# jobns/hook/state.py: a bundle path with a NUL (os.open: ValueError, an internal error of the
# hook), a control character or line separator (raw in the bundle's error messages), or
# a lone surrogate (unencodable) is no bundle a runtime made: refused on reading the state.
@pytest.mark.parametrize(
    "bundle",
    ["\\u0000", "/b\\u0000", "\\u001f", "/b\\n", "\\u0085", "/b\\u2028", "\\ud800", "/b\\udcff"],
)
def test_oci_state_bundle_path_is_checked(bundle: str) -> None:
    data = (
        f'{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"{bundle}"}}'
    ).encode()
    assert "contains a NUL, a control character" in refused(parse_state, data)


def test_oci_state_ordinary_bundle_paths_still_parse() -> None:
    data = (
        '{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,'
        '"bundle":"/run/containers/\u00e9t\u00e9 b"}'
    ).encode()
    assert parse_state(data).bundle == "/run/containers/\u00e9t\u00e9 b"


# Found by the fuzz campaign in jobns/hook/ and the prolog, fixed by their owners.


def test_oci_config_with_a_null_process_env() -> None:
    from jobns.hook import oci_config

    doc: dict[str, object] = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"env": None},
    }
    new = oci_config.rewrite(doc, [], {"TMPDIR": "/tmp"}, {}, None)
    process = new["process"]
    assert isinstance(process, dict) and process["env"] == ["TMPDIR=/tmp"]


@pytest.mark.parametrize("path", ["/nonexistent/\x1b[2J\nforged line", "/b\x00", "/b\ud800"])
def test_a_bundle_path_that_cannot_be_named_is_one_clean_line(path: str) -> None:
    from jobns.hook import bundle as bundle_mod

    with pytest.raises(JobnsError) as e:
        bundle_mod.load(path)
    check_message(str(e.value))


@pytest.mark.parametrize("path", ["/nonexistent/a\nforged line", "a\x00b", "/\x1b[2J"])
def test_a_script_path_that_cannot_be_named_is_one_clean_line(path: str) -> None:
    from jobns.launcher.lifecycle.lifecycle import gather_directives
    from jobns.launcher.model.request import Request

    with pytest.raises(JobnsError) as e:
        gather_directives(Request(script=path), {}, None)
    check_message(str(e.value))
