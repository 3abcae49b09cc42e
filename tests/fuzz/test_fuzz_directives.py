"""Fuzz #JOBNS directives (no root): scripts, --directives strings, capacities, symbols and
path confinement. Whatever a user writes, the parser returns sane values or rejects the
job with one clean line (DirectiveError / JobnsError), never another exception."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.model.directives import (
    _SIZE_UNITS,
    LAYOUT_VALUES,
    MAX_BYTES,
    PATH_MAX,
    STOP,
    VERBS,
    DirectiveError,
    Directives,
    NodeCount,
    Symbols,
    check_word,
    comment_directives,
    confine,
    normalise,
    parse_capacity,
    parse_directives,
    parse_script,
    resolve_path,
    round_up,
    substitute,
)
from jobns.launcher.system.errors import JobnsError, UserError
from tests.fuzz.support import (
    NUMBERS,
    capacity_text,
    check_message,
    comment_text,
    directives_text,
    fuzz,
    hostile_text,
    optional,
    outcome,
    path_text,
    script_text,
    slurm_env,
    tried,
)

WORDS = st.one_of(
    st.sampled_from(
        ["JOBNS", "JOBNS", "BB", "jobns", "#JOBNS", "", "a b", "x" * 64, "x" * 65, "JOBNS\n"]
    ),
    hostile_text(8),
)
GRANULARITIES = st.one_of(
    st.sampled_from([1, 1, 1024, 1 << 20, 1000, 3, 0, -1, 2**62, 2**63, 2**64]),
    st.integers(-(2**65), 2**65),
)
ROOTS = ["/stage", "/session/x", "/tmp", "/var/tmp", "/dev/shm"]
roots = st.one_of(
    st.lists(st.sampled_from(ROOTS), max_size=3),
    st.lists(
        st.one_of(st.sampled_from([*ROOTS, "/", "rel", "/a/../b", ""]), path_text()), max_size=3
    ),
)
symbols = st.builds(
    Symbols,
    job_id=optional(st.one_of(NUMBERS, hostile_text(8))),
    array_job_id=optional(st.one_of(NUMBERS, hostile_text(8))),
    array_task_id=optional(st.one_of(NUMBERS, hostile_text(8))),
    workdir=optional(
        st.one_of(
            st.sampled_from(["/home/u/job", "/", "rel", "/a/../b", "/a/\x00", "/" + "x" * 5000]),
            path_text(),
        )
    ),
    user=optional(st.one_of(st.sampled_from(["alice", "..", ".", "", "a/b"]), hostile_text(8))),
    job_name=optional(
        st.one_of(st.sampled_from(["job", "../../etc", "%u", "x" * 300]), hostile_text(12))
    ),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CAPACITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)")


def check_directives(d: object, granularity: int) -> None:
    """Invariants of a parse that succeeded: what setup relies on."""
    assert isinstance(d, Directives)
    for cap in (d.shm_capacity, d.tmp_capacity):
        if cap is not None:
            assert type(cap) is int and 1 <= cap <= MAX_BYTES and cap % granularity == 0
    assert d.layout is None or d.layout in LAYOUT_VALUES.values()
    assert isinstance(d.no_rm_tmpdir, bool)
    for s in (*d.stage_in, *d.stage_out):
        assert isinstance(s.source, str) and isinstance(s.destination, str)
        assert s.source and s.destination
    for w in d.warnings:
        check_message(w)  # printed as a "jobns: warning: ..." line


def check_confined(path: str, allowed: list[str]) -> None:
    """A resolved stage path: canonical, inside a root, no '..', no control character."""
    assert path.startswith("/") and normalise(path) == path
    assert ".." not in path.split("/") and not _CONTROL.search(path)
    assert len(path.encode("utf-8", "surrogateescape")) <= PATH_MAX
    normal_roots = [normalise(r) for r in allowed]
    assert any(r == "/" or path == r or path.startswith(r + "/") for r in normal_roots)


@fuzz(2)
@given(text=capacity_text())
def test_parse_capacity(text: str) -> None:
    tried("directives.parse_capacity")
    got = outcome(parse_capacity, text)
    m = _CAPACITY.fullmatch(text)
    if isinstance(got, JobnsError):
        # Only a malformed or out-of-range text may be refused.
        if m and len(m.group(1)) <= 40 and m.group(2) in _SIZE_UNITS:
            size = math.ceil(Fraction(m.group(1)) * _SIZE_UNITS[m.group(2)])
            assert size <= 0 or size > MAX_BYTES, f"{text!r} refused: {got}"
        return
    assert m is not None, f"{text!r} accepted"
    number, suffix = m.groups()
    if isinstance(got, NodeCount):
        assert suffix == "N" and got.count == Fraction(number) and 1 <= got.count <= MAX_BYTES
    else:
        assert type(got) is int and 1 <= got <= MAX_BYTES
        assert got == math.ceil(Fraction(number) * (_SIZE_UNITS.get(suffix) or 1))
        assert parse_capacity(str(got)) == got


@fuzz()
@given(size=st.integers(-(2**64), 2**64), granularity=GRANULARITIES)
def test_round_up(size: int, granularity: int) -> None:
    tried("directives.round_up")
    got = outcome(round_up, size, granularity)
    if isinstance(got, int):
        assert got >= size and got % granularity == 0 and got - size < granularity
        assert got <= MAX_BYTES


@fuzz(2)
@given(path=path_text(), syms=symbols)
def test_substitute(path: str, syms: Symbols) -> None:
    tried("directives.substitute")
    got = outcome(substitute, path, syms)
    if "%" not in path and STOP not in path:
        assert got == path
    if isinstance(got, str) and STOP not in path:
        # Each symbol is one path component (or %d an absolute path): no value brings
        # a '..' component or a control character that the template did not have.
        template = path.replace("%%", "")
        if ".." not in template.split("/"):
            assert ".." not in got.split("/"), got
        if not _CONTROL.search(template):
            assert not _CONTROL.search(got), got


@fuzz(2)
@given(path=path_text(), syms=symbols, allowed=roots)
def test_resolve_path_stays_confined(path: str, syms: Symbols, allowed: list[str]) -> None:
    tried("directives.resolve_path")
    got = outcome(resolve_path, path, syms, allowed)
    if isinstance(got, str):
        check_confined(got, allowed)


@fuzz()
@given(path=st.one_of(path_text(), hostile_text(40)), allowed=roots)
def test_normalise_and_confine(path: str, allowed: list[str]) -> None:
    tried("directives.normalise")
    got = outcome(normalise, path)
    if isinstance(got, str):
        assert normalise(got) == got and not _CONTROL.search(got)
    confined = outcome(confine, path, allowed)
    if isinstance(confined, str):
        check_confined(confined, allowed)


@fuzz(2)
@given(text=script_text(), word=WORDS, granularity=GRANULARITIES, syms=symbols, allowed=roots)
def test_parse_script(
    text: str, word: str, granularity: int, syms: Symbols, allowed: list[str]
) -> None:
    tried("directives.parse_script")
    got = outcome(parse_script, text, word, granularity)
    if isinstance(got, JobnsError):
        return
    check_directives(got, granularity)
    for s in (*got.stage_in, *got.stage_out):
        resolved = outcome(s.resolve, syms, allowed, allowed)
        if isinstance(resolved, tuple):
            for path in resolved:
                check_confined(path, allowed)


@fuzz(2)
@given(text=directives_text(), word=WORDS, granularity=GRANULARITIES, syms=symbols, allowed=roots)
def test_parse_directives(
    text: str, word: str, granularity: int, syms: Symbols, allowed: list[str]
) -> None:
    tried("directives.parse_directives")
    got = outcome(parse_directives, text, word, granularity)
    if isinstance(got, JobnsError):
        return
    check_directives(got, granularity)
    check_nothing_dropped(text, word)
    for s in (*got.stage_in, *got.stage_out):
        resolved = outcome(s.resolve, syms, allowed, allowed)
        if isinstance(resolved, tuple):
            for path in resolved:
                check_confined(path, allowed)


_KEYS_OF = {
    "shm": {"capacity"},
    "tmp": {"capacity"},
    "shared_tmpdir": set(),
    "no_rm_tmpdir": set(),
    "stage_in": {"source", "destination"},
    "stage_out": {"source", "destination"},
}


def check_nothing_dropped(text: str, word: str) -> None:
    """An accepted --directives string used every word it holds (issue 30, finding 7):
    a known verb, then only its own keys with a value, a lone '\\\\' marker, or a trailing
    comment that is not another directive. Anything else must have rejected the job."""
    prefix = "#" + word
    for item in re.split(r"[\n;]", text):
        words = item.split()
        if words and words[0] == prefix:
            words = words[1:]
        if not words or words[0].startswith("#"):
            continue  # blank, or '#JOBNS # a comment'
        verb, _, _ = words[0].partition("=")
        assert verb in VERBS, f"{item!r} accepted"
        for token in words[1:]:
            if token.startswith("#"):
                assert token.lower() != prefix.lower(), f"{item!r} accepted"
                break
            key, eq, value = token.partition("=")
            assert token == STOP or (eq and value and key in _KEYS_OF[verb]), (
                f"{token!r} of {item!r} accepted"
            )


_CANONICAL = {spelling: unit for unit in _SIZE_UNITS for spelling in (unit, unit.lower())}


@fuzz()
@given(
    number=st.one_of(st.integers(1, 10**6).map(str), st.sampled_from(["1.5", "0.25", "007"])),
    unit=st.sampled_from(sorted(_CANONICAL)),
    space=st.sampled_from([" ", "  ", "\t", "\u00a0", "\u3000"]),
    verb=st.sampled_from(["shm", "tmp"]),
)
def test_a_size_with_a_space_is_refused(number: str, unit: str, space: str, verb: str) -> None:
    """'capacity=2 GiB' never becomes 2 bytes: it is refused with the spelling to use."""
    tried("directives.spaced_size")
    comment = f"jobns: {verb} capacity={number}{space}{unit}"
    text = comment_directives(comment)
    assert text is not None
    got = outcome(parse_directives, text, source="--comment")
    assert isinstance(got, DirectiveError), f"{comment!r} accepted"
    fixed = number + _CANONICAL[unit]
    assert str(got).startswith("--comment item 1: "), got
    assert str(got).endswith(f"has a space inside; write {'capacity=' + fixed!r}"), got


@fuzz()
@given(comment=comment_text(), word=WORDS)
def test_comment_directives(comment: str, word: str) -> None:
    """The comment's directive text, None for an ordinary comment, or a UserError."""
    tried("directives.comment_directives")
    got = outcome(comment_directives, comment, word)
    if isinstance(got, JobnsError):
        # A bad directive word is the site's; anything else refuses only the user's job.
        assert isinstance(got, UserError) or "directive word" in str(got), got
        return
    if got is None:
        assert not re.search(r"(?<![A-Za-z0-9_])jobns:", comment), comment
        return
    assert "jobns:" in comment and len(got) < len(comment)
    check_word(word)
    parsed = outcome(parse_directives, got, word, 1, "--comment")
    if isinstance(parsed, DirectiveError) and parsed.lineno is not None:
        assert str(parsed).startswith(f"--comment item {parsed.lineno}: "), parsed


@fuzz()
@given(
    ordinary=st.text(max_size=40).filter(lambda t: "jobns" not in t.lower()),
    directives=st.one_of(st.just(""), st.text(max_size=40)),
)
def test_comments_without_jobns_are_ordinary(ordinary: str, directives: str) -> None:
    """No comment without the letters 'jobns' in a row is ever taken for jobns's, and
    after 'jobns:' the text is handed on as it is."""
    tried("directives.comment_ordinary")
    assert comment_directives(ordinary) is None
    if "jobns" not in directives.lower():
        assert comment_directives(f"{ordinary} jobns:{directives}") == directives


@fuzz()
@given(text=hostile_text(80), word=WORDS)
def test_parsers_on_raw_text(text: str, word: str) -> None:
    tried("directives.raw_text")
    for parse in (parse_script, parse_directives):
        got = outcome(parse, text, word)
        if not isinstance(got, JobnsError):
            check_directives(got, 1)


@fuzz()
@given(word=WORDS)
def test_check_word(word: str) -> None:
    tried("directives.check_word")
    got = outcome(check_word, word)
    if isinstance(got, str):
        assert re.fullmatch(r"[A-Za-z0-9_]{1,64}", got)


@fuzz()
@given(env=slurm_env(), cwd=optional(path_text()))
def test_symbols_from_slurm_env(env: dict[str, str], cwd: str | None) -> None:
    tried("directives.Symbols.from_slurm_env")
    got = outcome(Symbols.from_slurm_env, env, cwd)
    if isinstance(got, Symbols):
        for v in (got.job_id, got.array_job_id, got.array_task_id):
            assert v is None or (v.isascii() and v.isdigit())
