"""Unit tests for launcher.model.directives: #JOBNS parsing, capacities, symbols, confinement."""

from __future__ import annotations

import math
import posixpath
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobns.launcher.model.directives import (
    MAX_BYTES,
    NO_ARRAY_TASK_ID,
    CommentError,
    DirectiveError,
    Directives,
    NodeCount,
    Stage,
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

BS2 = "\\\\"  # the two-backslash "stop processing" marker, as typed in a script

KI, MI, GI, TI, PI = 1024, 1024**2, 1024**3, 1024**4, 1024**5
UNITS = {
    "K": KI, "KiB": KI, "M": MI, "MiB": MI, "G": GI, "GiB": GI, "T": TI, "TiB": TI,
    "P": PI, "PiB": PI, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
}  # fmt: skip

SYMBOLS = Symbols(job_id="4242", user="alice", job_name="run1", workdir="/home/alice/proj")
ARRAY = Symbols(
    job_id="4250",
    array_job_id="4242",
    array_task_id="7",
    user="alice",
    job_name="run1",
    workdir="/home/alice/proj",
)


def script(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- capacities


@pytest.mark.parametrize(("suffix", "unit"), sorted(UNITS.items()))
def test_every_size_suffix(suffix: str, unit: int) -> None:
    assert parse_capacity(f"3{suffix}") == 3 * unit


def test_exact_values_of_suffixes() -> None:
    # Spelled out, so a wrong table in both module and test cannot agree by accident.
    assert parse_capacity("1K") == 1024
    assert parse_capacity("1KiB") == 1024
    assert parse_capacity("1KB") == 1000
    assert parse_capacity("2GiB") == 2147483648
    assert parse_capacity("2GB") == 2000000000
    assert parse_capacity("1PiB") == 1125899906842624
    assert parse_capacity("1PB") == 1000000000000000


def test_bare_number_is_bytes() -> None:
    assert parse_capacity("4096") == 4096
    assert parse_capacity("1") == 1


def test_node_suffix_is_a_distinct_kind() -> None:
    nodes = parse_capacity("2N")
    assert nodes == NodeCount(2)
    assert isinstance(nodes, NodeCount)
    assert not isinstance(nodes, int)


@pytest.mark.parametrize(("text", "expected"), [
    ("1.5GiB", 1610612736),
    ("1.5K", 1536),
    ("0.5", 1),            # half a byte rounds up to one
    ("1.001K", 1026),      # 1025.024 rounds up
    ("2.0G", 2 * GI),
    ("0.1KB", 100),
])  # fmt: skip
def test_decimals_round_up_to_whole_bytes(text: str, expected: int) -> None:
    assert parse_capacity(text) == expected


@pytest.mark.parametrize(("text", "suggestion"), [
    ("2gib", "'GiB'"), ("2g", "'G'"), ("2kb", "'KB'"), ("2Kb", "'KB'"), ("2n", "'N'"),
    ("2kIB", "'KiB'"),
])  # fmt: skip
def test_suffix_case_is_strict_with_a_hint(text: str, suggestion: str) -> None:
    with pytest.raises(DirectiveError, match="case-sensitive") as info:
        parse_capacity(text)
    assert suggestion in str(info.value)


@pytest.mark.parametrize("text", ["2B", "2Gi", "2EiB", "2GiBs", "2bytes"])
def test_unknown_suffixes_are_rejected(text: str) -> None:
    with pytest.raises(DirectiveError, match="unknown suffix"):
        parse_capacity(text)


@pytest.mark.parametrize("text", [
    "", "G", "-1G", "+1G", "1e3", "1_000", ".5G", "5.G", "1,5G", " 1G", "1 G", "0x10", "١٢",
    "1.2.3G",
])  # fmt: skip
def test_malformed_capacities(text: str) -> None:
    with pytest.raises(DirectiveError, match="not a number"):
        parse_capacity(text)


@pytest.mark.parametrize("text", ["0", "0K", "0.0GiB", "0.000"])
def test_zero_is_rejected(text: str) -> None:
    with pytest.raises(DirectiveError, match="greater than zero"):
        parse_capacity(text)


@pytest.mark.parametrize("text", ["0N", "1.5N"])
def test_node_counts_must_be_whole_and_positive(text: str) -> None:
    with pytest.raises(DirectiveError, match="node count"):
        parse_capacity(text)


def test_overflow_limits() -> None:
    assert parse_capacity(str(MAX_BYTES)) == 2**63 - 1
    with pytest.raises(DirectiveError, match="maximum"):
        parse_capacity(str(2**63))
    with pytest.raises(DirectiveError, match="maximum"):
        parse_capacity("8192PiB")  # exactly 2**63
    assert parse_capacity("8191PiB") == 8191 * PI
    with pytest.raises(DirectiveError, match="too many digits"):
        parse_capacity("1" * 41)
    with pytest.raises(DirectiveError, match="too large"):
        parse_capacity(f"{2**63}N")


@settings(max_examples=300)
@given(n=st.integers(min_value=1, max_value=8191), suffix=st.sampled_from(sorted(UNITS)))
def test_formatted_capacity_parses_back(n: int, suffix: str) -> None:
    assert parse_capacity(f"{n}{suffix}") == n * UNITS[suffix]


@given(n=st.integers(min_value=1, max_value=10**9))
def test_formatted_node_count_parses_back(n: int) -> None:
    assert parse_capacity(f"{n}N") == NodeCount(n)


@given(
    whole=st.integers(min_value=0, max_value=1000),
    frac=st.integers(0, 999),
    suffix=st.sampled_from(["", *sorted(UNITS)]),
)
def test_decimal_capacity_is_the_exact_ceiling(whole: int, frac: int, suffix: str) -> None:
    text = f"{whole}.{frac:03d}{suffix}"
    exact = Fraction(f"{whole}.{frac:03d}") * UNITS.get(suffix, 1)
    if exact == 0:
        with pytest.raises(DirectiveError):
            parse_capacity(text)
    else:
        assert parse_capacity(text) == math.ceil(exact)


# --------------------------------------------------------------------------- granularity


@pytest.mark.parametrize(("size", "granularity", "expected"), [
    (2000, 1000, 2000),    # exact multiple is unchanged
    (1001, 1000, 2000),    # rounds up
    (1999, 1000, 2000),
    (1, 1000, 1000),       # below the granularity: one granule
    (999, 1000, 1000),
    (12345, 1, 12345),     # granularity 1 changes nothing
    (5 * GI + 1, GI, 6 * GI),
])  # fmt: skip
def test_round_up(size: int, granularity: int, expected: int) -> None:
    assert round_up(size, granularity) == expected


def test_round_up_rejects_bad_granularity_and_overflow() -> None:
    with pytest.raises(JobnsError, match="granularity"):
        round_up(10, 0)
    with pytest.raises(DirectiveError, match="maximum"):
        round_up(MAX_BYTES, 2**62)
    with pytest.raises(DirectiveError):
        round_up(0, 10)


def test_granularity_applies_to_directive_capacities() -> None:
    text = script("#!/bin/sh", "#JOBNS tmp capacity=1500", "#JOBNS shm capacity=1KB")
    parsed = parse_script(text, granularity=1024)
    assert parsed.tmp_capacity == 2048
    assert parsed.shm_capacity == 1024


@given(size=st.integers(1, 2**40), granularity=st.integers(1, 2**20))
def test_round_up_is_smallest_multiple_not_below(size: int, granularity: int) -> None:
    rounded = round_up(size, granularity)
    assert rounded % granularity == 0
    assert size <= rounded < size + granularity


# ------------------------------------------------------------------------ script parsing

FULL = script(
    "#!/bin/bash",
    "#SBATCH --job-name=run1",
    "#JOBNS shm capacity=2GiB",
    "#SBATCH -N 2",
    "",
    "   ",
    "# an ordinary comment",
    "#JOBNS tmp capacity=10G",
    "#SBATCH --time=10",
    "#JOBNS shared_tmpdir=per-node",
    "#JOBNS no_rm_tmpdir",
    "#JOBNS stage_in source=/project/%u/input destination=/tmp/input",
    "#JOBNS stage_out source=/tmp/out destination=/project/%u/%j",
    "srun ./app",
)


def test_full_script_interleaved_with_sbatch() -> None:
    parsed = parse_script(FULL)
    assert parsed.present is True
    assert parsed.shm_capacity == 2 * GI
    assert parsed.tmp_capacity == 10 * GI
    assert parsed.layout == "per-node"
    assert parsed.no_rm_tmpdir is True
    assert parsed.stage_in == [
        Stage(
            "/project/%u/input",
            "/tmp/input",
            12,
            "#JOBNS stage_in source=/project/%u/input destination=/tmp/input",
        )
    ]
    assert [(s.source, s.destination, s.lineno) for s in parsed.stage_out] == [
        ("/tmp/out", "/project/%u/%j", 13)
    ]
    assert parsed.warnings == []


def test_no_directives() -> None:
    parsed = parse_script(script("#!/bin/sh", "#SBATCH -N1", "hostname"))
    assert parsed == Directives()
    assert parsed.present is False


def test_bare_directive_marks_presence_only() -> None:
    parsed = parse_script(script("#!/bin/sh", "#JOBNS", "hostname"))
    assert parsed.present is True
    assert parsed.tmp_capacity is None and parsed.stage_in == []


def test_directives_after_first_command_are_not_applied_but_warned() -> None:
    parsed = parse_script(
        script(
            "#!/bin/sh",
            "#JOBNS tmp capacity=1G",
            "echo hi",
            "#JOBNS shm capacity=1G",
            "#JOBNS stage_in source=/a destination=/b",
        )
    )
    assert parsed.tmp_capacity == GI
    assert parsed.shm_capacity is None
    assert parsed.stage_in == []
    assert len(parsed.warnings) == 2
    assert parsed.warnings[0].startswith("script line 4: '#JOBNS shm capacity=1G': directive after")


def test_invalid_directive_after_the_header_does_not_reject() -> None:
    parsed = parse_script(script("#!/bin/sh", "true", "#JOBNS tmp capacity=0"))
    assert parsed.tmp_capacity is None
    assert len(parsed.warnings) == 1


def test_first_line_command_means_no_header() -> None:
    parsed = parse_script(script("echo start", "#JOBNS tmp capacity=1G"))
    assert parsed.tmp_capacity is None and parsed.present is False


def test_script_without_shebang() -> None:
    assert parse_script(script("#JOBNS tmp capacity=1K", "true")).tmp_capacity == 1024


def test_indented_comment_does_not_end_the_header() -> None:
    parsed = parse_script(script("#!/bin/sh", "   # indented", "#JOBNS tmp capacity=1K"))
    assert parsed.tmp_capacity == 1024


def test_spaced_word_is_a_plain_comment() -> None:
    parsed = parse_script(script("#!/bin/sh", "# JOBNS tmp capacity=1K", "##JOBNS tmp"))
    assert parsed == Directives()


def test_other_directive_words_are_ignored_silently() -> None:
    parsed = parse_script(script("#!/bin/sh", "#JOBNSX tmp capacity=0", "#BB_LUA pool=p"))
    assert parsed == Directives()


def test_near_misses_after_the_header_are_warned() -> None:
    # After the first command (a here-document may write another job's script) only a warning.
    parsed = parse_script(
        script("#!/bin/sh", "true", "  #JOBNS tmp capacity=1G", "#jobns shm capacity=1G")
    )
    assert parsed.tmp_capacity is None and parsed.shm_capacity is None
    assert parsed.warnings == [
        "script line 3: '  #JOBNS tmp capacity=1G': indented directive is ignored; start it "
        "in column 1 (and move it above the first command)",
        "script line 4: '#jobns shm capacity=1G': directive word is case-sensitive; this line "
        "is ignored, write #JOBNS (and move it above the first command)",
    ]


@pytest.mark.parametrize(("line", "message"), [
    ("  #JOBNS tmp capacity=1G",
     "script line 2: '  #JOBNS tmp capacity=1G': indented directive is not applied; start it "
     "in column 1"),
    ("#jobns shm capacity=1G",
     "script line 2: '#jobns shm capacity=1G': directive word is case-sensitive; this line is "
     "not applied, write #JOBNS"),
    ("\t#Jobns", "script line 2: '\\t#Jobns': directive word is case-sensitive; this line is "
     "not applied, write #JOBNS"),
])  # fmt: skip
def test_near_misses_in_the_header_reject_the_job(line: str, message: str) -> None:
    # In the header only comments live: such a line can only be meant as a directive.
    with pytest.raises(DirectiveError) as info:
        parse_script(script("#!/bin/sh", line, "true"))
    assert str(info.value) == message


def test_custom_directive_word() -> None:
    text = script("#!/bin/sh", "#JOBNS tmp capacity=1G", "#BB_LUA tmp capacity=1K")
    parsed = parse_script(text, word="BB_LUA")
    assert parsed.tmp_capacity == 1024
    assert parse_script(text).tmp_capacity == GI


@pytest.mark.parametrize("word", ["", "#JOBNS", "JOB-NS", "JOB NS", "JÖBNS", "J" * 65])
def test_invalid_directive_words(word: str) -> None:
    with pytest.raises(JobnsError, match="directive word"):
        parse_script("#!/bin/sh\n", word=word)


def test_valid_directive_word() -> None:
    assert check_word("BB_LUA2") == "BB_LUA2"


def test_trailing_comment_is_ignored() -> None:
    parsed = parse_script(script("#JOBNS tmp capacity=1G # for the big run", "true"))
    assert parsed.tmp_capacity == GI
    assert parsed.warnings == []


@pytest.mark.parametrize(("line", "layout"), [
    ("#JOBNS shared_tmpdir", "shared"),
    ("#JOBNS shared_tmpdir=yes", "shared"),
    ("#JOBNS shared_tmpdir=per-node", "per-node"),
    ("#JOBNS shared_tmpdir=no", "local"),
])  # fmt: skip
def test_layouts(line: str, layout: str) -> None:
    assert parse_script(script(line)).layout == layout


def test_repeated_identical_lines_are_fine() -> None:
    parsed = parse_script(
        script(
            "#JOBNS shared_tmpdir",
            "#JOBNS shared_tmpdir=yes",
            "#JOBNS tmp capacity=1024",
            "#JOBNS tmp capacity=1K",
            "#JOBNS no_rm_tmpdir",
            "#JOBNS no_rm_tmpdir",
        )
    )
    assert (parsed.layout, parsed.tmp_capacity, parsed.no_rm_tmpdir) == ("shared", 1024, True)


def test_several_stages_keep_their_order() -> None:
    parsed = parse_script(
        script(
            "#JOBNS stage_in source=/a destination=/b", "#JOBNS stage_in destination=/d source=/c"
        )
    )
    assert [(s.source, s.destination) for s in parsed.stage_in] == [("/a", "/b"), ("/c", "/d")]


KNOWN = "known: shm, tmp, shared_tmpdir, no_rm_tmpdir, stage_in, stage_out"


@pytest.mark.parametrize(("line", "problem"), [
    # Each of these once ran the job otherwise than written, with a warning in the
    # prolog's log at most (issue 30, finding 7).
    ("#JOBNS stage_in type=file source=/a destination=/b",
     "unknown key 'type' for stage_in; write '#JOBNS stage_in source=PATH destination=PATH'"),
    ("#JOBNS tmp capacity=1G pool=fast",
     "unknown key 'pool' for tmp; write '#JOBNS tmp capacity=SIZE'"),
    ("#JOBNS shm Capacity=1G",
     "unknown key 'Capacity' for shm (keys are case-sensitive: did you mean 'capacity'?); "
     "write '#JOBNS shm capacity=SIZE'"),
    ("#JOBNS no_rm_tmpdir x=1",
     "unknown key 'x' for no_rm_tmpdir; no_rm_tmpdir takes no options"),
    ("#JOBNS no_rm_tmpdir hurry",
     "unexpected word 'hurry'; write '#JOBNS no_rm_tmpdir'"),
    ("#JOBNS shm capacity=2GiB extra",
     "unexpected word 'extra'; write '#JOBNS shm capacity=SIZE'"),
    ("#JOBNS shm =2GiB",
     "'=2GiB' has no key before '='; write '#JOBNS shm capacity=SIZE'"),
    ("#JOBNS frobnicate level=3", f"unknown directive 'frobnicate'; {KNOWN}"),
    ("#JOBNS SHM capacity=1G",
     f"unknown directive 'SHM' (directives are case-sensitive: did you mean 'shm'?); {KNOWN}"),
    ("#JOBNS shared_tmpdir per-node",
     "unexpected word 'per-node'; write 'shared_tmpdir=per-node'"),
    ("#JOBNS shm capacity=1G tmp capacity=2G",
     "'tmp' starts another directive; put each directive on a line of its own"),
    ("#JOBNS shm capacity=1G #JOBNS tmp capacity=2G",
     "a second #JOBNS directive inside this one is not applied; put each directive on a line "
     "of its own"),
    ("#JOBNS shm capacity=1G #jobns tmp capacity=2G",
     "a second #JOBNS directive inside this one is not applied; put each directive on a line "
     "of its own"),
    ("#JOBNS stage_in source=/my data destination=/tmp/x",
     "unexpected word 'data' after source=: a path cannot contain spaces; write '#JOBNS "
     "stage_in source=PATH destination=PATH'"),
])  # fmt: skip
def test_what_would_run_otherwise_rejects_the_job(line: str, problem: str) -> None:
    with pytest.raises(DirectiveError) as info:
        parse_script(script("#!/bin/sh", line, "true"))
    assert str(info.value) == f"script line 2: {line!r}: {problem}"
    assert info.value.problem == problem


@pytest.mark.parametrize(("capacity", "problem"), [
    ("2 GiB", "capacity '2 GiB' has a space inside; write 'capacity=2GiB'"),
    ("2 gib", "capacity '2 gib' has a space inside; write 'capacity=2GiB'"),
    ("1.5 G", "capacity '1.5 G' has a space inside; write 'capacity=1.5G'"),
    ("2G iB", "capacity '2G iB' has a space inside; write 'capacity=2GiB'"),
    ("2 000", "capacity '2 000' has a space inside; write 'capacity=2000'"),
    ("2\u00a0GiB", "capacity '2 GiB' has a space inside; write 'capacity=2GiB'"),  # pasted NBSP
    ("2 Gigabytes", "unexpected word 'Gigabytes'; write '#JOBNS shm capacity=SIZE'"),
    (" 2GiB", "'capacity= 2GiB' has a space around '='; write 'capacity=2GiB'"),
])  # fmt: skip
def test_a_size_with_a_space_rejects_the_job(capacity: str, problem: str) -> None:
    # 'capacity=2 GiB' once gave a 2-byte (one page) /dev/shm and a warning about key 'GiB'.
    line = f"shm capacity={capacity}"
    with pytest.raises(DirectiveError) as info:
        parse_directives(line, source="--comment")
    assert str(info.value) == f"--comment item 1: {line!r}: {problem}"


@pytest.mark.parametrize(("item", "problem"), [
    ("tmp capacity =1G", "'capacity =1G' has a space around '='; write 'capacity=1G'"),
    ("tmp capacity = 1G", "'capacity = 1G' has a space around '='; write 'capacity=1G'"),
    ("shared_tmpdir = no",
     "'shared_tmpdir = no' has a space around '='; write 'shared_tmpdir=no'"),
    ("shared_tmpdir= no",
     "'shared_tmpdir= no' has a space around '='; write 'shared_tmpdir=no'"),
    ("tmp capacity= \x00", "'capacity= \\x00' has a space around '='; write 'capacity=\\x00'"),
    ("stage_in source= /a destination=/b",
     "'source= /a' has a space around '='; write 'source=/a'"),
])  # fmt: skip
def test_a_space_around_equals_rejects_the_job(item: str, problem: str) -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives(item)
    assert str(info.value) == f"--directives item 1: {item!r}: {problem}"


def test_harmless_things_are_accepted_silently() -> None:
    parsed = parse_directives(
        f"shm capacity=1G # for MPI;; #JOBNS;stage_in source=/a {BS2} destination=/tmp/%j"
    )
    assert parsed.shm_capacity == GI and parsed.warnings == []
    assert parsed.stage_in[0].destination == f"{BS2}/tmp/%j"  # a lone marker still stops


def test_warnings_are_collected_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    parsed = parse_script(script("#JOBNS", "true", "#JOBNS tmp capacity=1G", "#JOBNS frob"))
    assert len(parsed.warnings) == 2
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(("lines", "lineno", "fragment"), [
    (["#!/bin/sh", "#SBATCH -N1", "#JOBNS tmp capacity=0"], 3, "greater than zero"),
    (["#JOBNS shm capacity=2gib"], 1, "did you mean 'GiB'"),
    (["#JOBNS shm capacity=2N"], 1, "node count"),
    (["#JOBNS shm"], 1, "shm needs capacity="),
    (["#JOBNS tmp capacity"], 1, "capacity needs a value"),
    (["#JOBNS tmp capacity="], 1, "capacity needs a value"),
    (["#JOBNS tmp capacity=1G capacity=2G"], 1, "given twice"),
    (["#JOBNS tmp capacity=1G", "#JOBNS tmp capacity=2G"], 2, "different values"),
    (["#JOBNS shm=1G"], 1, "takes no '=value'"),
    (["#JOBNS no_rm_tmpdir=yes"], 1, "takes no '=value'"),
    (["#JOBNS shared_tmpdir=maybe"], 1, "not one of yes, per-node, no"),
    (["#JOBNS shared_tmpdir", "", "#JOBNS shared_tmpdir=per-node"], 3, "contradicts"),
    (["#JOBNS stage_in source=/a"], 1, "stage_in needs destination="),
    (["#JOBNS stage_out"], 1, "stage_out needs source= and destination="),
    (["#JOBNS stage_in source=/a source=/b destination=/c"], 1, "given twice"),
    (["#JOBNS stage_in source=a destination=/b"], 1, "relative"),
    (["#JOBNS stage_in source=/a/../etc destination=/b"], 1, "'..'"),
    (["#JOBNS stage_in source=/a/%q destination=/b"], 1, "unknown symbol '%q'"),
    (["#JOBNS stage_in source=/a destination=/b/%"], 1, "lone '%'"),
    (['#JOBNS stage_in source="/a b" destination=/b'], 1, "quoting is not supported"),
    (["#JOBNS tmp capacity=1G\r"], 1, "dos2unix"),
])  # fmt: skip
def test_invalid_lines_are_rejected_with_line_numbers(
    lines: list[str], lineno: int, fragment: str
) -> None:
    text = script(*lines, "srun ./app")
    with pytest.raises(DirectiveError) as info:
        parse_script(text)
    err = info.value
    assert err.lineno == lineno
    assert err.line == text.split("\n")[lineno - 1]
    assert fragment in str(err)
    assert str(err).startswith(f"script line {lineno}: {err.line!r}: ")
    assert isinstance(err, JobnsError) and isinstance(err, Exception)


def test_stage_path_may_start_with_workdir_symbol() -> None:
    parsed = parse_script(script("#JOBNS stage_out source=/tmp/out destination=%d/results"))
    assert parsed.stage_out[0].destination == "%d/results"


# ----------------------------------------------------------------- --directives strings


def test_directives_string_with_and_without_prefix() -> None:
    parsed = parse_directives(
        "#JOBNS tmp capacity=1G; shm capacity=3KB\nno_rm_tmpdir ;  #JOBNS shared_tmpdir=per-node;;"
    )
    assert (parsed.tmp_capacity, parsed.shm_capacity) == (GI, 3000)
    assert parsed.no_rm_tmpdir is True and parsed.layout == "per-node"
    assert parsed.present is True


def test_directives_string_errors_name_the_item() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives("tmp capacity=1G;shm capacity=0")
    assert info.value.lineno == 2
    assert info.value.origin == "--directives"
    assert str(info.value).startswith("--directives item 2: 'shm capacity=0': ")


def test_directives_string_rejects_foreign_directives() -> None:
    with pytest.raises(DirectiveError, match="not a #JOBNS directive") as info:
        parse_directives("tmp capacity=1G\n#SBATCH -N1")
    assert info.value.lineno == 2


def test_directives_string_custom_word() -> None:
    assert parse_directives("#BB_LUA tmp capacity=1K", word="BB_LUA").tmp_capacity == 1024
    with pytest.raises(DirectiveError):
        parse_directives("#JOBNS tmp capacity=1K", word="BB_LUA")


def test_directives_string_unknown_verb_rejects() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives(" pool=fast capacity=1G ")
    assert str(info.value) == (
        f"--directives item 1: 'pool=fast capacity=1G': unknown directive 'pool'; {KNOWN}"
    )


def test_errors_name_the_source_and_show_the_item_stripped() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives("tmp capacity=1G; shm capcity=2GiB ", source="--comment")
    assert str(info.value) == (
        "--comment item 2: 'shm capcity=2GiB': unknown key 'capcity' for shm; "
        "write '#JOBNS shm capacity=SIZE'"
    )
    assert (info.value.origin, info.value.lineno, info.value.line) == (
        "--comment",
        2,
        "shm capcity=2GiB",
    )


def test_a_carriage_return_outside_a_script_names_no_dos2unix() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives("tmp capacity=1G\r\nshm capacity=1G", source="--comment")
    assert str(info.value) == (
        "--comment item 1: 'tmp capacity=1G': DOS line break (\\r\\n); remove the '\\r'"
    )


def test_the_comment_prefix_inside_directives_is_explained() -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives("jobns: shm capacity=1G")
    assert str(info.value) == (
        "--directives item 1: 'jobns: shm capacity=1G': unknown directive 'jobns:' "
        f"('jobns:' goes once, at the start of a job comment); {KNOWN}"
    )


# ------------------------------------------------------------------------- job comments


@pytest.mark.parametrize(("comment", "text"), [
    ("jobns: shm capacity=2GiB", " shm capacity=2GiB"),
    ("  jobns:tmp capacity=1G", "tmp capacity=1G"),
    ("jobns:", ""),
    ("run 3 jobns: tmp capacity=100MiB", " tmp capacity=100MiB"),   # job_submit.lua appends
    ("run 3 (jobns: shm capacity=1G", " shm capacity=1G"),
    # A second prefix at a token start begins more directives (job_submit.lua again).
    ("jobns: shm capacity=1GiB jobns: tmp capacity=1G", " shm capacity=1GiB ; tmp capacity=1G"),
    ("jobns: shm capacity=1GiB;jobns: no_rm_tmpdir", " shm capacity=1GiB;; no_rm_tmpdir"),
    ("jobns: stage_in source=/a/jobns:b destination=/tmp/x",  # inside a value: no prefix
     " stage_in source=/a/jobns:b destination=/tmp/x"),
])  # fmt: skip
def test_comment_directives(comment: str, text: str) -> None:
    assert comment_directives(comment) == text


def test_comment_with_two_prefixes_parses_both() -> None:
    text = comment_directives("jobns: shm capacity=1GiB jobns: tmp capacity=2GiB")
    assert text is not None
    parsed = parse_directives(text, source="--comment")
    assert (parsed.shm_capacity, parsed.tmp_capacity) == (GI, 2 * GI)


@pytest.mark.parametrize("comment", [
    "", "   ", "my run 3", "testing jobns today", "a jobns b", "jobns-test run 3",
    "jobns.sh run", "jobns, take 2", "jobns/run3", "jobnsfoo: x", "myjobns: x",
    "loving #jobns", "issue#JOBNS x", "#JOBNSX a", "# JOBNS shm capacity=1G",
    "see https://example.org/jobns/ for more", "#SBATCH --mem=1G",
    "jobn\u017f shm capacity=1G",  # a long s: case is folded in ASCII only
])  # fmt: skip
def test_ordinary_comments_are_none(comment: str) -> None:
    assert comment_directives(comment) is None


FIX = (
    "this looks meant for jobns, but directives follow 'jobns:' exactly (lower case, the "
    "colon right after); write --comment"
)
PASTED = "a job comment takes directives after 'jobns:', not as #JOBNS lines; write --comment"


@pytest.mark.parametrize(("comment", "message"), [
    ("jobns shm capacity=1GiB",
     f"--comment: 'jobns shm capacity=1GiB': {FIX} 'jobns: shm capacity=1GiB'"),
    ("JOBNS: shm capacity=1GiB",
     f"--comment: 'JOBNS: shm capacity=1GiB': {FIX} 'jobns: shm capacity=1GiB'"),
    ("  Jobns : tmp capacity=1G ",
     f"--comment: 'Jobns : tmp capacity=1G': {FIX} 'jobns: tmp capacity=1G'"),
    ("jobns=shm capacity=1G",
     f"--comment: 'jobns=shm capacity=1G': {FIX} 'jobns: shm capacity=1G'"),
    ("jobns", f"--comment: 'jobns': {FIX} 'jobns: shm capacity=2GiB'"),
    ("run 3; JOBNS: shm capacity=1GiB",
     f"--comment: 'run 3; JOBNS: shm capacity=1GiB': {FIX} 'run 3; jobns: shm capacity=1GiB'"),
    # The user's own part, before a prefix job_submit.lua appended, is not lost silently.
    ("JOBNS: shm capacity=1GiB jobns: tmp capacity=1G",
     "--comment: 'JOBNS: shm capacity=1GiB jobns: tmp capacity=1G': "
     f"{FIX} 'jobns: shm capacity=1GiB jobns: tmp capacity=1G'"),
    ("#JOBNS shm capacity=1GiB",
     f"--comment: '#JOBNS shm capacity=1GiB': {PASTED} 'jobns: shm capacity=1GiB'"),
    ("#jobns shm capacity=1GiB",
     f"--comment: '#jobns shm capacity=1GiB': {PASTED} 'jobns: shm capacity=1GiB'"),
    ("#JOBNS shm capacity=1G\n#JOBNS tmp capacity=1G",
     "--comment: '#JOBNS shm capacity=1G\\n#JOBNS tmp capacity=1G': "
     f"{PASTED} 'jobns: shm capacity=1G\\n; tmp capacity=1G'"),
    ("run 3 #JOBNS shm capacity=1G",
     f"--comment: 'run 3 #JOBNS shm capacity=1G': {PASTED} 'run 3 jobns: shm capacity=1G'"),
    ("#JOBNS", f"--comment: '#JOBNS': {PASTED} 'jobns: shm capacity=2GiB'"),
])  # fmt: skip
def test_comments_meant_for_jobns_reject_the_job(comment: str, message: str) -> None:
    with pytest.raises(CommentError) as info:
        comment_directives(comment)
    assert str(info.value) == message
    # A UserError: the caller cannot tell it from the site's error by a 'jobns:' in the
    # comment (there is none), and it must refuse only her job.
    assert isinstance(info.value, UserError) and isinstance(info.value, DirectiveError)


def test_comment_with_a_configured_directive_word() -> None:
    with pytest.raises(CommentError, match="not as #BB_LUA lines; write --comment 'jobns: "):
        comment_directives("#BB_LUA tmp capacity=1G", word="BB_LUA")
    assert comment_directives("#JOBNS tmp capacity=1G", word="BB_LUA") is None
    with pytest.raises(JobnsError, match="directive word"):
        comment_directives("jobns: x", word="B B")


def test_comment_errors_are_one_printable_line() -> None:
    with pytest.raises(CommentError) as info:
        comment_directives("JOBNS:\x1b[2J\n" + "x" * 500)
    message = str(info.value)
    assert message.isprintable() and len(message) < 700


# -------------------------------------------------------------------- symbol substitution


@pytest.mark.parametrize(("raw", "symbols", "expected"), [
    ("/s/%j", SYMBOLS, "/s/4242"),
    ("/s/%u", SYMBOLS, "/s/alice"),
    ("/s/%x", SYMBOLS, "/s/run1"),
    ("%d/out", SYMBOLS, "/home/alice/proj/out"),
    ("/s/%A_%a", ARRAY, "/s/4242_7"),
    ("/s/%j", ARRAY, "/s/4250"),
    ("/s/%A", SYMBOLS, "/s/4242"),                      # not an array: the job id
    ("/s/%a", SYMBOLS, "/s/4294967294"),                # not an array: Slurm's NO_VAL
    ("/s/100%%", SYMBOLS, "/s/100%"),
    ("/s/%%j", SYMBOLS, "/s/%j"),                       # %% first, then a plain j
    ("/s/%%%j", SYMBOLS, "/s/%4242"),
    ("/s/%%%%", SYMBOLS, "/s/%%"),
    ("/s/%u/%x/%j.%A.%a", ARRAY, "/s/alice/run1/4250.4242.7"),
    ("/plain/path", SYMBOLS, "/plain/path"),
])  # fmt: skip
def test_every_symbol(raw: str, symbols: Symbols, expected: str) -> None:
    assert substitute(raw, symbols) == expected


def test_no_array_task_id_constant() -> None:
    assert str(0xFFFFFFFE) == NO_ARRAY_TASK_ID


def test_replacements_are_not_rescanned() -> None:
    sneaky = Symbols(job_id="1", user="%j", job_name="%%x", workdir="/w/%u")
    assert substitute("/s/%u/%x", sneaky) == "/s/%j/%%x"
    assert substitute("%d/a", sneaky) == "/w/%u/a"


@pytest.mark.parametrize(("raw", "expected"), [
    (f"/s/%j{BS2}%j/%u", "/s/4242%j/%u"),      # stops at the marker, which is dropped
    (f"{BS2}/s/%j", "/s/%j"),                  # at the start: nothing substituted
    (f"/s/%j{BS2}", "/s/4242"),                # at the end: nothing left
    ("/s/a\\b/%j", "/s/a\\b/4242"),            # a single backslash is just a character
    (f"/s/\\{BS2}%j", "/s/\\%j"),              # three: the first pair stops, one stays
    (f"/s/{BS2}{BS2}%j", f"/s/{BS2}%j"),       # only the first marker is special
    (f"/s/{BS2}%", "/s/%"),                    # a lone % after the stop is not an error
    (f"/s/{BS2}%q", "/s/%q"),                  # nor an unknown symbol
])  # fmt: skip
def test_stop_marker(raw: str, expected: str) -> None:
    assert substitute(raw, SYMBOLS) == expected


def test_stop_marker_covers_the_rest_of_the_line() -> None:
    line = f"#JOBNS stage_in source=/proj/%u/{BS2}in destination=/tmp/%j"
    stage = parse_script(script(line)).stage_in[0]
    assert stage.source == f"/proj/%u/{BS2}in"
    assert stage.destination == f"{BS2}/tmp/%j"
    assert stage.resolve(SYMBOLS, ["/proj"], ["/tmp"]) == ("/proj/alice/in", "/tmp/%j")


def test_stop_marker_does_not_leak_to_earlier_values_or_other_lines() -> None:
    parsed = parse_script(
        script(
            f"#JOBNS stage_in destination=/tmp/%j source=/p/{BS2}%u",
            "#JOBNS stage_out source=/tmp/%j destination=/p/%u",
        )
    )
    assert parsed.stage_in[0].resolve(SYMBOLS, ["/p"], ["/tmp"]) == ("/p/%u", "/tmp/4242")
    assert parsed.stage_out[0].resolve(SYMBOLS, ["/tmp"], ["/p"]) == ("/tmp/4242", "/p/alice")


@pytest.mark.parametrize(("raw", "fragment"), [
    ("/s/%q", "unknown symbol '%q'"),
    ("/s/%J", "unknown symbol '%J'"),          # Slurm's stdio %J is not a burst buffer symbol
    ("/s/%", "lone '%'"),
    ("%", "lone '%'"),
    ("/s/%%%", "lone '%'"),
    (f"/s/%{BS2}", "unknown symbol '%\\'"),    # % cannot escape the marker
])  # fmt: skip
def test_bad_symbols(raw: str, fragment: str) -> None:
    with pytest.raises(DirectiveError) as info:
        substitute(raw, SYMBOLS)
    assert fragment in str(info.value)
    assert info.value.lineno is None


@pytest.mark.parametrize(("letter", "variable"), [
    ("j", "SLURM_JOB_ID"), ("A", "SLURM_JOB_ID"), ("u", "SLURM_JOB_USER"),
    ("x", "--job-name"), ("d", "SLURM_SUBMIT_DIR"),
])  # fmt: skip
def test_unknown_values_name_the_fix(letter: str, variable: str) -> None:
    with pytest.raises(DirectiveError, match=variable):
        substitute(f"/s/%{letter}", Symbols())
    assert substitute("/s/plain", Symbols()) == "/s/plain"


@pytest.mark.parametrize(
    "name", ["../../etc", "..", ".", "", "a/b", "/etc", "x\ny", "a\0b", "x" * 256]
)
def test_hostile_job_names_are_refused(name: str) -> None:
    with pytest.raises(DirectiveError, match="cannot be substituted for %x"):
        substitute("/scratch/alice/%x", Symbols(job_name=name))


def test_harmless_odd_job_names_are_kept() -> None:
    for name in ("my job", "...", "..a", "a..", "-rf", "%u", "日本"):
        assert substitute("/s/%x", Symbols(job_name=name)) == f"/s/{name}"


@pytest.mark.parametrize("workdir", ["relative/dir", "/home/../etc", "", "/home/a\0"])
def test_hostile_workdirs_are_refused(workdir: str) -> None:
    with pytest.raises(DirectiveError, match="cannot be substituted for %d"):
        substitute("%d/out", Symbols(workdir=workdir))


def test_workdir_is_normalised() -> None:
    assert substitute("%d/out", Symbols(workdir="//home/./alice/")) == "/home/alice/out"
    assert substitute("%d", Symbols(workdir="/")) == "/"


# -------------------------------------------------------------------------- Slurm env


def test_symbols_from_slurm_env() -> None:
    env = {
        "SLURM_JOB_ID": "4250",
        "SLURM_ARRAY_JOB_ID": "4242",
        "SLURM_ARRAY_TASK_ID": "7",
        "SLURM_SUBMIT_DIR": "/home/alice/proj",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_NAME": "run1",
    }
    assert Symbols.from_slurm_env(env, cwd="/ignored") == ARRAY


def test_symbols_from_slurm_env_non_array_and_fallbacks() -> None:
    symbols = Symbols.from_slurm_env({"SLURM_JOB_ID": "9"}, cwd="/here")
    assert symbols == Symbols(job_id="9", workdir="/here")
    assert substitute("/s/%A/%a", symbols) == "/s/9/4294967294"


def test_job_work_dir_wins_over_submit_dir() -> None:
    env = {"SLURM_JOB_WORK_DIR": "/work", "SLURM_SUBMIT_DIR": "/submit"}
    assert Symbols.from_slurm_env(env).workdir == "/work"
    assert Symbols.from_slurm_env({"SLURM_SUBMIT_DIR": "/submit"}).workdir == "/submit"


@pytest.mark.parametrize("var", ["SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"])
def test_non_numeric_ids_are_rejected(var: str) -> None:
    with pytest.raises(DirectiveError, match=var):
        Symbols.from_slurm_env({var: "12/../x"}, cwd="/")


# ---------------------------------------------------------------------------- confinement


@pytest.mark.parametrize(("path", "expected"), [
    ("/scratch/alice/x", "/scratch/alice/x"),
    ("/scratch", "/scratch"),                       # the root itself
    ("/scratch/", "/scratch"),
    ("/scratch//alice///x/", "/scratch/alice/x"),   # double slashes collapse
    ("//scratch/x", "/scratch/x"),                  # POSIX's special leading // too
    ("/scratch/./alice/.", "/scratch/alice"),
])  # fmt: skip
def test_confine_accepts_and_normalises(path: str, expected: str) -> None:
    assert confine(path, ["/scratch", "/project/"]) == expected


@pytest.mark.parametrize(("path", "fragment"), [
    ("/etc/passwd", "outside"),
    ("/scratchy/x", "outside"),                     # a name prefix is not a parent
    ("/", "outside"),
    ("//etc/passwd", "outside"),
    ("/scratch/../etc", "'..'"),
    ("/scratch/a/../b", "'..'"),                    # even when it would stay inside
    ("/scratch/..", "'..'"),
    ("scratch/x", "relative"),
    ("", "relative"),
    ("./scratch", "relative"),
    ("/scratch/a\0/../../etc", "NUL"),
    ("/scratch/a\nb", "control"),
    ("/scratch/" + "x" * 256, "longer than 255"),
    ("/scratch" + "/x" * 2100, "longer than 4095"),
])  # fmt: skip
def test_confine_rejects(path: str, fragment: str) -> None:
    with pytest.raises(DirectiveError) as info:
        confine(path, ["/scratch"])
    assert fragment in str(info.value)


def test_confine_needs_roots_and_validates_them() -> None:
    with pytest.raises(DirectiveError, match="no directories are configured"):
        confine("/scratch/x", [])
    with pytest.raises(DirectiveError, match="relative"):
        confine("/scratch/x", ["scratch"])
    with pytest.raises(DirectiveError, match=r"'\.\.'"):
        confine("/etc/x", ["/scratch/.."])
    assert confine("/anything/x", ["/"]) == "/anything/x"


def test_normalise() -> None:
    assert normalise("/a//b/./c/") == "/a/b/c"
    assert normalise("/") == "/"
    assert normalise("///") == "/"


@pytest.mark.parametrize("name", ["../../etc", "..", "../x", "a/../../..", "/etc"])
def test_substituted_traversal_cannot_escape(name: str) -> None:
    symbols = Symbols(job_id="1", user="alice", job_name=name, workdir="/home/alice")
    with pytest.raises(DirectiveError):
        resolve_path("/scratch/%u/%x/out", symbols, ["/scratch/alice"])


def test_literal_traversal_after_stop_marker_is_still_confined() -> None:
    with pytest.raises(DirectiveError, match=r"'\.\.'"):
        resolve_path(f"/scratch/%u/{BS2}../../etc", SYMBOLS, ["/scratch"])


def test_workdir_outside_roots_is_refused() -> None:
    with pytest.raises(DirectiveError, match="outside"):
        resolve_path("%d/out", SYMBOLS, ["/scratch"])
    assert resolve_path("%d/out", SYMBOLS, ["/home/alice"]) == "/home/alice/proj/out"


def test_stage_resolve_errors_name_the_line() -> None:
    text = script("#!/bin/sh", "#JOBNS stage_out source=/tmp/out destination=/project/%x")
    stage = parse_script(text).stage_out[0]
    with pytest.raises(DirectiveError) as info:
        stage.resolve(Symbols(job_name="../../etc"), ["/tmp"], ["/project"])
    assert info.value.lineno == 2
    assert str(info.value).startswith("script line 2: '#JOBNS stage_out source=/tmp/out ")
    with pytest.raises(DirectiveError, match="outside") as info:
        stage.resolve(SYMBOLS, ["/tmp"], ["/elsewhere"])
    assert info.value.lineno == 2


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@settings(max_examples=500)
@given(
    name=st.text(max_size=40),
    template=st.sampled_from(
        [
            "/scratch/alice/%x",
            "/scratch/alice/%x/out",
            f"/scratch/alice/%x{BS2}x",
            "/scratch/alice/%%%x",
            "/scratch/alice/%x/%x",
        ]
    ),
)
def test_arbitrary_job_names_never_escape(name: str, template: str) -> None:
    symbols = Symbols(job_id="1", user="alice", job_name=name, workdir="/home/alice")
    try:
        result = resolve_path(template, symbols, ["/scratch/alice"])
    except DirectiveError:
        return
    assert _within(result, "/scratch/alice")
    assert ".." not in result.split("/")
    assert posixpath.normpath(result) == result
    assert "\0" not in result


@settings(max_examples=500)
@given(
    path=st.lists(
        st.sampled_from(["/", ".", "..", "a", "scratch", "%", "\\", "\0", "x", "//", "tmp", "job"]),
        max_size=12,
    ).map("".join),
    roots=st.lists(
        st.sampled_from(["/scratch", "/scratch/a", "/tmp/job", "/x"]), min_size=1, max_size=3
    ),
)
def test_confine_never_returns_a_path_outside_the_roots(path: str, roots: list[str]) -> None:
    try:
        result = confine(path, roots)
    except DirectiveError:
        return
    assert any(_within(result, root) for root in roots)
    assert ".." not in result.split("/")
    assert posixpath.normpath(result) == result


@settings(max_examples=300)
@given(path=st.text(max_size=60))
def test_confine_arbitrary_text(path: str) -> None:
    try:
        result = confine(path, ["/scratch"])
    except DirectiveError:
        return
    assert _within(result, "/scratch")
    assert ".." not in result.split("/")


def test_a_bad_capacity_suggests_only_what_a_capacity_accepts() -> None:
    """The hint once offered `capacity=2N`, which shm and tmp then rejected (issue 14)."""
    from jobns.launcher.model.directives import parse_capacity

    with pytest.raises(JobnsError) as e:
        parse_capacity("lots")
    assert "2N" not in str(e.value) and "capacity=10GiB" in str(e.value)
