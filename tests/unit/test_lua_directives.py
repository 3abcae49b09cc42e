"""jobns/slurm/lua/jobns_directives.lua held to the Python parser (no root, lua5.1).

slurmctld runs the Lua checker at submission (burst_buffer.lua, job_submit.lua) so that
sbatch refuses a job with jobns's own message. It is a subset of
launcher.model.directives.parse_script: for every script it must either accept, or refuse
with exactly the message (str(DirectiveError)) Python gives, and it must refuse wherever
Python refuses for a reason in the subset. The script reaches Python as jobns reads a script
file (commands/check.py and the prolog: UTF-8 with errors="replace", universal newlines);
the Lua checker is given the raw bytes, as slurmctld has them.

check_comment() is held the same way to what the prolog's gather_directives does with the
job comment (comment_directives, then parse_directives(..., source="--comment")): the
comment reaches Python from the environment (SLURM_JOB_COMMENT: UTF-8, surrogateescape);
the Lua checker is given its raw bytes.

Out of the subset (Lua accepts; the prolog refuses), by Python's problem text:
OUT_OF_SUBSET below, the rules that compare sizes rounded to the node's [capacity]
granularity, which slurmctld does not know (for scripts and comments alike). Also out: a
line that does not end within the script's first 64 KiB, and a comment longer than 64 KiB
(MAX_JUDGED in the Lua file: slurmctld must not spend long on a hostile script or
comment). Each Lua run loads the checker in a sandbox without io, os, require or load, and
fails if it reads or sets any global.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobns.launcher.commands.cli import dispatch
from jobns.launcher.lifecycle.lifecycle import gather_directives
from jobns.launcher.model.directives import (
    VERBS,
    CommentError,
    DirectiveError,
    comment_directives,
    parse_directives,
    parse_script,
)
from jobns.launcher.model.request import Request
from jobns.launcher.system.errors import JobnsError

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "jobns/slurm/lua/jobns_directives.lua"
MAX_JUDGED = 64 * 1024

# Python's problems (DirectiveError.problem) that the Lua subset does not judge.
OUT_OF_SUBSET = (
    "shm capacity is given twice with different values",  # equal once rounded, maybe
    "tmp capacity is given twice with different values",
    "size ",  # round_up: "size N rounded up to granularity G is ... more than the maximum"
)

# Loads the checker as a chunk in a sandbox, runs one request on stdin, prints the answer.
DRIVER = r"""
local path, mode, word = arg[1], arg[2], arg[3]
local file = assert(io.open(path, "rb"))
local source = file:read("*a")
file:close()
local env = {
    string = string, table = table, math = math, ipairs = ipairs, pairs = pairs,
    type = type, tostring = tostring, tonumber = tonumber, error = error, pcall = pcall,
    select = select, setmetatable = setmetatable, getmetatable = getmetatable,
}
setmetatable(env, {
    __index = function(_, name) error("the checker reads the global " .. tostring(name), 2) end,
    __newindex = function(_, name) error("the checker sets the global " .. tostring(name), 2) end,
})
local chunk
if setfenv then -- Lua 5.1
    chunk = assert(loadstring(source, "=jobns_directives.lua"))
    setfenv(chunk, env)
else
    chunk = assert(load(source, "=jobns_directives.lua", "t", env))
end
local d = mode == "dofile" and dofile(path) or chunk()
local input = io.read("*a")
if mode == "decode" then
    io.write(d.decode(input))
elseif mode == "decode_escaped" then
    io.write(d.decode(input, true))
elseif mode == "repr" then
    io.write(d.repr(d.decode(input)))
else
    local ok, verdict = pcall(mode == "comment" and d.check_comment or d.check, input, word)
    if not ok then
        io.write("error\n", tostring(verdict))
    elseif verdict == nil then
        io.write("accept\n")
    else
        io.write("refuse\n", verdict)
    end
end
"""


class Lua:
    def __init__(self, interpreter: str, driver: Path) -> None:
        self.interpreter = interpreter
        self.driver = driver

    def run(self, mode: str, data: bytes, *args: str) -> bytes:
        r = subprocess.run(
            [self.interpreter, str(self.driver), str(MODULE), mode, *args],
            input=data,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert r.returncode == 0 and not r.stderr, (r.returncode, r.stderr.decode(errors="replace"))
        return r.stdout

    def check(self, data: bytes, word: str | None = None, mode: str = "check") -> str | None:
        """None if the checker accepts, else its message; an AssertionError if it fails."""
        out = self.run(mode, data, *([word] if word is not None else []))
        verdict, _, message = out.partition(b"\n")
        assert verdict in (b"accept", b"refuse"), out.decode(errors="replace")
        return message.decode() if verdict == b"refuse" else None

    def comment(self, data: bytes, word: str | None = None) -> str | None:
        """check_comment(): None if it accepts the job comment, else its message."""
        return self.check(data, word, mode="comment")

    def error(self, data: bytes, word: str, mode: str = "check") -> str:
        """The Lua error check() raises (a site's mistake, never a refusal)."""
        verdict, _, message = self.run(mode, data, word).partition(b"\n")
        assert verdict == b"error", (verdict, message)
        return message.decode()


@pytest.fixture(scope="module")
def lua(tmp_path_factory: pytest.TempPathFactory) -> Lua:
    interpreter = shutil.which("lua5.1")
    if interpreter is None:
        reason = "lua5.1 is not installed (ci/install-system installs it: apt-get install lua5.1)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    driver = tmp_path_factory.mktemp("lua") / "driver.lua"
    driver.write_text(DRIVER)
    return Lua(interpreter, driver)


def read_as_jobns(data: bytes) -> str:
    """The text parse_script gets from a script file: check.py and the prolog open it with
    encoding="utf-8", errors="replace" and universal newlines (\\r\\n and \\r become \\n)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace").read()


def python_says(data: bytes, word: str = "JOBNS", granularity: int = 1) -> DirectiveError | None:
    try:
        parse_script(read_as_jobns(data), word, granularity)
    except DirectiveError as e:
        return e
    return None


def in_subset(err: DirectiveError) -> bool:
    return not err.problem.startswith(OUT_OF_SUBSET)


def lua_line(message: str) -> int:
    found = re.match(r"script line (\d+): ", message)
    assert found, message
    return int(found.group(1))


def encoded(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


# ---------------------------------------------------------------------------- the corpus

H = "#!/bin/bash\n#SBATCH -N 1\n"  # a usual start
BS2 = "\\\\"  # the two-backslash marker, as typed in a script

# (script, a part of Python's message or None where it accepts): every rule ported.
CORPUS: list[tuple[str | bytes, str | None]] = [
    # the header, the word, near misses
    ("", None),
    (H + "#JOBNS\necho hi\n", None),
    (H + "#JOBNS tmp capacity=10G\n#JOBNS shm capacity=2GiB\n#JOBNS no_rm_tmpdir\necho\n", None),
    (H + "echo hi\n#JOBNS bogus\n", None),  # after the header: warned of, not refused
    (H + "\n   \n# note\n#JOBNS bogus\n", "unknown directive 'bogus'"),
    ("#JOBNS bogus", "unknown directive 'bogus'"),  # no shebang, no final newline
    (H + "#JOBNSX tmp capacity=0\n# JOBNS bogus\n#BB_LUA pool=x\n", None),
    (H + "  #JOBNS tmp capacity=1G\n", "indented directive is not applied"),
    (H + "\t#JOBNS\n", "indented directive is not applied"),
    (H + "\u3000#JOBNS tmp\n", "indented directive is not applied"),  # Unicode whitespace
    (H + "#jobns tmp capacity=1G\n", "directive word is case-sensitive"),
    (H + "  #Jobns\n", "directive word is case-sensitive"),
    (H + "echo\n  #JOBNS tmp\n#jobns bogus\n", None),
    # tokens, trailing comments, a second directive
    (H + "#JOBNS tmp capacity=1G # a comment, 'quotes' and #JOBNS\n", None),
    (H + "#JOBNS tmp capacity=1G #JOBNS shm capacity=1G\n", "a second #JOBNS directive"),
    (H + "#JOBNS tmp capacity=1G #jobns\n", "a second #JOBNS directive"),
    (H + "#JOBNS\ttmp\u00a0capacity=1G\x1c\n", None),  # str.split() whitespace
    (H + "#JOBNS\u2028tmp capacity=1G\n", None),
    # verbs and keys
    (H + "#JOBNS TMP capacity=1G\n", "did you mean 'tmp'?"),
    (H + "#JOBNS jobns:tmp\n", "'jobns:' goes once"),
    (H + "#JOBNS tmp=1G\n", "tmp takes no '=value'"),
    (H + "#JOBNS tmp size=1G\n", "unknown key 'size' for tmp"),
    (H + "#JOBNS tmp Capacity=1G\n", "did you mean 'capacity'?"),
    (H + "#JOBNS no_rm_tmpdir x=1\n", "no_rm_tmpdir takes no options"),
    (H + "#JOBNS tmp =1G\n", "'=1G' has no key before '='"),
    (H + "#JOBNS tmp capacity=1G shm\n", "'shm' starts another directive"),
    (H + "#JOBNS tmp capacity=1G capacity=1G\n", "capacity= is given twice"),
    (H + "#JOBNS tmp capacity\n", "capacity needs a value"),
    (H + "#JOBNS tmp capacity=\n", "capacity needs a value"),
    (H + "#JOBNS tmp\n", "tmp needs capacity="),
    (H + "#JOBNS stage_in\n", "stage_in needs source= and destination="),
    (H + "#JOBNS stage_out source=/a\n", "stage_out needs destination="),
    (H + "#JOBNS tmp capacity='1G'\n", "quoting is not supported"),
    (H + '#JOBNS stage_in source="/a b" destination=/c\n', "quoting is not supported"),
    # spaces around '=' and inside values
    (H + "#JOBNS tmp capacity= 2G\n", "'capacity= 2G' has a space around '='"),
    (H + "#JOBNS tmp capacity =2G\n", "'capacity =2G' has a space around '='"),
    (H + "#JOBNS tmp capacity = 2G\n", "'capacity = 2G' has a space around '='"),
    (H + "#JOBNS tmp capacity=2 GiB\n", "capacity '2 GiB' has a space inside"),
    (H + "#JOBNS tmp capacity=2 gib\n", "write 'capacity=2GiB'"),
    (H + "#JOBNS tmp capacity=2G iB\n", "capacity '2G iB' has a space inside"),
    (H + "#JOBNS tmp capacity=2G x\n", "unexpected word 'x'; write '#JOBNS tmp capacity=SIZE'"),
    (H + "#JOBNS stage_in source=/my dir destination=/x\n", "a path cannot contain spaces"),
    (H + "#JOBNS shared_tmpdir per-node\n", "write 'shared_tmpdir=per-node'"),
    # capacities
    (H + "#JOBNS tmp capacity=1.5GiB\n#JOBNS shm capacity=0.001\n", None),
    (H + "#JOBNS tmp capacity=8191PiB\n", None),
    (H + "#JOBNS tmp capacity=9223372036854775807\n", None),
    (H + "#JOBNS tmp capacity=9223372036854775808\n", "more than the maximum"),
    (H + "#JOBNS tmp capacity=8192PiB\n", "is 9223372036854775808 bytes"),
    (H + "#JOBNS tmp capacity=8191.99999999999999PiB\n", None),  # 2**63 - 11.26, up
    (H + "#JOBNS tmp capacity=8191.99999999999999999PiB\n", "more than the maximum"),
    (H + "#JOBNS tmp capacity=2gib\n", "did you mean 'GiB'?"),
    (H + "#JOBNS tmp capacity=2Gb\n", "did you mean 'GB'?"),
    (H + "#JOBNS tmp capacity=2n\n", "did you mean 'N'?"),
    (H + "#JOBNS tmp capacity=2X\n", "has an unknown suffix 'X'; use K|KiB"),
    (H + "#JOBNS tmp capacity=0\n", "must be greater than zero"),
    (H + "#JOBNS tmp capacity=0.000G\n", "must be greater than zero"),
    (H + "#JOBNS tmp capacity=-1G\n", "is not a number with an optional suffix"),
    (H + "#JOBNS tmp capacity=1e3\n", "is not a number with an optional suffix"),
    (H + "#JOBNS tmp capacity=1.G\n", "is not a number with an optional suffix"),
    (H + "#JOBNS tmp capacity=.5G\n", "is not a number with an optional suffix"),
    (H + "#JOBNS tmp capacity=\uff11G\n", "is not a number"),  # a fullwidth digit
    (H + "#JOBNS tmp capacity=" + "1" * 41 + "\n", "has too many digits"),
    (H + "#JOBNS tmp capacity=" + "0" * 40 + "1\n", "has too many digits"),
    (H + "#JOBNS tmp capacity=2N\n", "is a node count; tmp needs a size"),
    (H + "#JOBNS shm capacity=2.5N\n", "a node count must be a whole number"),
    (H + "#JOBNS shm capacity=2.0N\n", "is a node count"),
    (H + "#JOBNS shm capacity=0N\n", "a node count must be at least 1"),
    (H + "#JOBNS shm capacity=9223372036854775808N\n", "node count too large"),
    (H + "#JOBNS tmp capacity=1G\n#JOBNS tmp capacity=1024M\n", None),
    # shared_tmpdir
    (H + "#JOBNS shared_tmpdir\n#JOBNS shared_tmpdir=yes\n", None),
    (H + "#JOBNS shared_tmpdir=per-node\n#JOBNS shared_tmpdir=no\n", "contradicts an earlier"),
    (H + "#JOBNS shared_tmpdir=maybe\n", "shared_tmpdir='maybe' is not one of"),
    (H + "#JOBNS shared_tmpdir=\n", "shared_tmpdir='' is not one of"),
    (H + "#JOBNS shared_tmpdir=no x\n", "unexpected word 'x'"),
    # stage paths, with the parser's stand-in symbol values
    (H + "#JOBNS stage_in source=/scratch/%u/%x.%j destination=%d/in/%A_%a\n", None),
    (H + f"#JOBNS stage_out source=/out destination=/x/{BS2}%q%\n", None),
    (H + f"#JOBNS stage_out source=/out {BS2} destination=/x/%q\n", None),
    (H + "#JOBNS stage_in source=/a/%q destination=/b\n", "uses unknown symbol '%q'"),
    (H + "#JOBNS stage_in source=/a\\q destination=/b\\\n", None),  # one backslash
    (H + "#JOBNS stage_in source=/a/%\u200b destination=/b\n", "uses unknown symbol '%\\u200b'"),
    (H + "#JOBNS stage_in source=/a/%' destination=/b\n", "quoting is not supported"),
    (H + "#JOBNS stage_in source=/a/% destination=/b\n", "ends with a lone '%'"),
    (H + "#JOBNS stage_in source=/a destination=b/%j\n", "path 'b/1' is relative"),
    (H + "#JOBNS stage_in source=/a/../b destination=/b\n", "contains '..'"),
    (H + "#JOBNS stage_in source=%d/.. destination=/b\n", "path '/workdir/..' contains '..'"),
    (H + "#JOBNS stage_in source=/a/\x01 destination=/b\n", "control character"),
    (H + "#JOBNS stage_in source=/a/\x7f destination=/b\n", "control character"),
    (H + "#JOBNS stage_in source=/" + "é" * 128 + " destination=/b\n", "longer than 255 bytes"),
    (H + "#JOBNS stage_in source=/" + "a/" * 2100 + " destination=/b\n", "longer than 4095"),
    (H + "#JOBNS stage_in source=/" + ".//" * 1400 + "a destination=/b\n", None),  # "/a"
    # hostile bytes, repr(), long lines, line ends
    (H + "#JOBNS tmp capacity=1G \x00\x07\x1b[2J\n", "unexpected word '\\x00\\x07\\x1b[2J'"),
    (H + "#JOBNS tmp capacity=1G \\x41\n", "unexpected word '\\\\x41'"),
    (H + "#JOBNS \u00e9t\u00e9 \u0085 \u00ad\ufeff\U0001f600\U000e0001\ue000\u0378\n", "unknown"),
    (H.encode() + b"#JOBNS tmp capacity=1G \xff\xfe\n", "unexpected word"),
    (H.encode() + b"#JOBNS \xe0\x80\xaf\xed\xa0\x80\xf4\x90\x80\x80\xf0\x9f\x98\n", "unknown"),
    (H.encode() + b"#JOBNS \xc3\xa9t\xc3 \xe2\x82\xac\xe2\x82\n", "unknown"),
    (b"\xff#JOBNS bogus\n", None),  # U+FFFD first: the header is over
    ("\ufeff#!/bin/sh\n#JOBNS bogus\n", None),  # a BOM is text too, as in Python
    (H + "#JOBNS tmp capacity=1G " + "x" * 300 + "\n", "..."),
    (H + "#JOBNS tmp capacity=1G " + "é" * 177 + "\n", "é" * 177 + "': "),  # 200: whole
    (H + "#JOBNS tmp capacity=1G " + "é" * 178 + "\n", "é" * 177 + "...': "),  # 201: cut
    (H + "#JOBNS " + "verb" * 1500 + "\n", "unknown directive 'verbverb"),
    (H + "#JOBNS tmp 'x'" + '"' * 300 + "\n", "quoting"),
    ("#!/bin/sh\r\n#JOBNS tmp capacity=1G\r\necho\r\n", None),  # read as jobns reads it
    ("#!/bin/sh\r\n#JOBNS tmp capacity=1 G\r\n", "script line 2: '#JOBNS tmp capacity=1 G'"),
    ("#!/bin/sh\r#JOBNS tmp capacity=1G\r#JOBNS bogus\r", "script line 3: '#JOBNS bogus'"),
    ("#!/bin/sh\n#JOBNS tmp capacity=1G\r\r#JOBNS bogus\n", "script line 4"),
    ("#!/bin/sh\n#JOBNS tmp\x0bcapacity=1G\x0c\x1d\x1e\x1f\x85\n", None),  # not line ends
]


@pytest.mark.parametrize(
    ("script", "expected"), CORPUS, ids=[f"corpus{i}" for i in range(len(CORPUS))]
)
def test_lua_gives_pythons_verdict_on_the_corpus(
    lua: Lua, script: str | bytes, expected: str | None
) -> None:
    data = encoded(script)
    py = python_says(data)
    if expected is None:
        assert py is None, str(py)
    else:
        assert py is not None and expected in str(py), (expected, str(py))
    assert lua.check(data) == (None if py is None else str(py))


def test_sizes_compared_after_the_nodes_rounding_are_left_to_the_prolog(lua: Lua) -> None:
    script = (H + "#JOBNS shm capacity=1000\n#JOBNS shm capacity=1001\n").encode()
    py = python_says(script)  # granularity 1 byte: 1000 != 1001
    assert py is not None and py.problem.startswith(OUT_OF_SUBSET), str(py)
    assert python_says(script, granularity=4096) is None  # both 4096 bytes
    assert lua.check(script) is None
    # Lua reads on where Python stopped: a later mistake is still refused.
    later = script + b"#JOBNS bogus\n"
    assert python_says(later) is not None and python_says(later, granularity=4096) is not None
    assert lua.check(later) == str(python_says(later, granularity=4096))


def test_only_the_scripts_first_64_kib_is_judged(lua: Lua) -> None:
    comment = "# " + "c" * 97 + "\n"  # 100 bytes
    within = "#!/bin/sh\n" + comment * ((MAX_JUDGED - 100) // 100) + "#JOBNS bogus\n"
    assert len(within) <= MAX_JUDGED
    assert lua.check(within.encode()) == str(python_says(within.encode()))
    beyond = "#!/bin/sh\n" + comment * (MAX_JUDGED // 100 + 1) + "#JOBNS bogus\n"
    assert len(beyond) - 1 > MAX_JUDGED
    assert python_says(beyond.encode()) is not None
    assert lua.check(beyond.encode()) is None
    long_line = "#JOBNS bogus " + "x" * MAX_JUDGED + "\n"  # ends past the limit
    assert python_says(long_line.encode()) is not None
    assert lua.check(long_line.encode()) is None


FOUR_MIB = 4 << 20


@pytest.mark.parametrize(
    ("script", "refused"),
    [
        (b"#JOBNS\n" * (FOUR_MIB // 7), False),
        (b"#JOBNS tmp capacity=1G\n" * (FOUR_MIB // 23), False),
        (b"#\n" * (FOUR_MIB // 2), False),
        (b" \xc2\xa0#\n" * (FOUR_MIB // 5), False),
        (b"#JOBNS tmp " + b"\xe2" * 65_000 + b"\n" + b"#\n" * (FOUR_MIB // 2), True),
        (b"#JOBNS tmp " + "\u0378\u0488".encode() * 10_000 + b"\n" + b"x" * FOUR_MIB, True),
        (
            b"#JOBNS stage_in source=/" + b"a/" * 32_000 + b" destination=/\n" + b"x" * FOUR_MIB,
            True,
        ),
    ],
    ids=["directives", "capacities", "comments", "indents", "undecodable", "escaped", "long-path"],
)
def test_a_hostile_four_mib_script_is_checked_quickly(
    lua: Lua, script: bytes, refused: bool
) -> None:
    """Slurm takes scripts up to 4 MiB, and slurmctld holds its locks while the check runs
    (0.01 to 0.06 s here, with the interpreter's start)."""
    start = time.monotonic()
    verdict = lua.check(script)
    assert time.monotonic() - start < 2.0
    # Refused on line 1, as Python does (which is slow to accept 4 MiB of directives).
    assert verdict == (str(python_says(script)) if refused else None)


SPACES_OF_PYTHON = [chr(c) for c in range(0x110000) if chr(c).isspace() and c not in (10, 13)]


@pytest.mark.parametrize(
    "space", SPACES_OF_PYTHON, ids=[f"U+{ord(c):04X}" for c in SPACES_OF_PYTHON]
)
def test_every_whitespace_of_python_separates_words_and_indents(lua: Lua, space: str) -> None:
    for line in (f"#JOBNS{space}tmp{space}capacity=1G{space}x{space}", f"{space}#JOBNS tmp"):
        data = (H + line + "\n").encode()
        py = python_says(data)
        assert py is not None and lua.check(data) == str(py)


# --------------------------------------------------------------- the directive word


@pytest.mark.parametrize(
    ("word", "script"),
    [
        ("BB_LUA", "#!/bin/sh\n#BB_LUA tmp capacity=2 G\n"),
        ("BB_LUA", "#!/bin/sh\n#JOBNS bogus\n#bb_lua tmp\n"),
        ("BB_LUA", "#!/bin/sh\n#BB_LUA tmp capacity=1G #BB_Lua\n"),
        ("BB_LUA", "#!/bin/sh\n#BB_LUA tmp capacity=1G\n"),
        ("K8S", "#!/bin/sh\n#\u212a8S tmp\n"),  # the Kelvin sign's lower() is 'k'
        ("K8S", "#!/bin/sh\n#K8S tmp capacity=1G #\u212a8s\n"),
        ("x", "#!/bin/sh\n#x\n#X tmp\n"),
    ],
)
def test_the_directive_word_is_a_parameter(lua: Lua, word: str, script: str) -> None:
    py = python_says(script.encode(), word)
    assert lua.check(script.encode(), word) == (None if py is None else str(py))


@pytest.mark.parametrize("word", ["#JOBNS", "", "JOB NS", "W" * 65, "jöbns"])
def test_a_bad_directive_word_is_the_sites_error_not_a_refusal(lua: Lua, word: str) -> None:
    with pytest.raises(JobnsError) as info:
        parse_script("", word)
    assert lua.error(b"#JOBNS tmp\n", word) == str(info.value)


def test_it_loads_with_dofile_too(lua: Lua) -> None:
    data = (H + "#JOBNS tmp capacity=2 GiB\n").encode()
    assert lua.check(data, mode="dofile") == str(python_says(data))


# ------------------------------------------------------------- how jobns reads a script


@pytest.mark.parametrize(
    "data",
    [
        b"#!/bin/sh\r\n#JOBNS tmp capacity=1G\r\n#JOBNS bogus\r\n",
        b"#!/bin/sh\r#JOBNS tmp capacity=1G\r\r#JOBNS tmp \xe2\x82 x\n",
        b"#JOBNS tmp capacity=1G \xff\xc3\xa9\xed\xa0\x80\n",
        b"\xef\xbb\xbf#JOBNS bogus\n",
    ],
)
def test_read_as_jobns_is_how_the_prolog_reads_a_script(tmp_path: Path, data: bytes) -> None:
    """What this test feeds parse_script is what the prolog's own reader gives it."""
    path = tmp_path / "job.sh"
    path.write_bytes(data)
    try:
        gather_directives(Request(script=str(path)), {}, None)
        prolog: str | None = None
    except DirectiveError as e:
        prolog = str(e)
    ours = python_says(data)
    assert prolog == (None if ours is None else str(ours))


@pytest.mark.parametrize(
    "data",
    [
        b"#!/bin/sh\n#JOBNS tmp capacity=2 GiB\necho never\n",
        b"#!/bin/sh\n#SBATCH -J bad\n#JOBNS tmpp capacity=1G\n",
        b"#!/bin/sh\n#JOBNS stage_in source=/a/%q destination=/b \xff\n",
    ],
)
def test_jobns_check_says_it_after_its_own_prefix(
    lua: Lua, tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user sees from `jobns check --script` (and the rig's sbatch test compares)."""
    config = tmp_path / "jobns.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\nshared_base = "{tmp_path}"\n')
    script = tmp_path / "job.sh"
    script.write_bytes(data)
    code = dispatch(["check", "--config", str(config), "--script", str(script)])
    message = lua.check(data)
    assert message is not None
    assert (code, capsys.readouterr().err) == (
        125,
        f"jobns: check: jobns setup would refuse the job: {message}\n",
    )


# ---------------------------------------------------------------- decode() and repr()


def nonprintable_ranges() -> Iterator[tuple[int, int]]:
    """The code points from U+0080 up for which this Python's str.isprintable() is False."""
    start = None
    for cp in range(0x80, 0x110000):
        if not chr(cp).isprintable():
            start = cp if start is None else start
        elif start is not None:
            yield start, cp - 1
            start = None
    if start is not None:
        yield start, 0x10FFFF


def nonprintable_text() -> str:
    """NONPRINTABLE_TEXT for the Lua file, from this Python's Unicode database."""
    items = [f"{a:X}" if a == b else f"{a:X}-{b:X}" for a, b in nonprintable_ranges()]
    lines, line = [], ""
    for item in items:
        if line and len(line) + 1 + len(item) > 96:
            lines.append(line)
            line = item
        else:
            line = f"{line} {item}" if line else item
    return "\n".join([*lines, line]) + "\n"


def test_the_lua_printable_table_is_this_pythons() -> None:
    source = MODULE.read_text()
    table = source.split("NONPRINTABLE_TEXT = [[\n", 1)[1].split("]]", 1)[0]
    assert table == nonprintable_text(), (
        f"Python's Unicode is {unicodedata.unidata_version}: regenerate NONPRINTABLE_TEXT with "
        "python -c 'from tests.unit.test_lua_directives import nonprintable_text as t; "
        'print(t(), end="")\''
    )


def test_repr_on_every_printability_boundary(lua: Lua) -> None:
    points = set(range(0x100))
    for first, last in nonprintable_ranges():
        points |= {first - 1, first, last, last + 1}
    text = "".join(chr(p) for p in sorted(points) if p <= 0x10FFFF and not 0xD800 <= p < 0xE000)
    assert lua.run("repr", text.encode()).decode() == repr(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=12) | st.text(alphabet="'\"\\\t\n\r\x00\x7f\x85 a", max_size=8))
def test_repr_is_pythons(lua: Lua, text: str) -> None:
    assert lua.run("repr", text.encode()).decode() == repr(text)


UTF8_PIECES = [b"a", b"\x80", b"\x8f", b"\x90", b"\x9f", b"\xa0", b"\xbf", b"\xc0", b"\xc1"]
UTF8_PIECES += [b"\xc2", b"\xdf", b"\xe0", b"\xe1", b"\xed", b"\xee", b"\xef", b"\xf0", b"\xf1"]
UTF8_PIECES += [b"\xf4", b"\xf5", b"\xff", b"\r", b"\n"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=24) | st.lists(st.sampled_from(UTF8_PIECES)).map(b"".join))
def test_decode_is_pythons_utf8_with_replace(lua: Lua, data: bytes) -> None:
    assert lua.run("decode", data) == data.decode("utf-8", "replace").encode()


# ------------------------------------------------------------------ the property test
# Header scripts from a grammar: plausible directive lines (a verb and its keys, good values
# mostly) with mutations (spellings, spaces, words, junk bytes), near misses and comments.

WORDS = ["JOBNS", "BB_LUA", "Kw"]  # 'Kw': its 'K' has a non-ASCII lower() twin (U+212A)
SPACES = [" "] * 12 + ["\t", "  ", "\u00a0", "\u3000", "\x0b", "\x1c", "\u2028", "\x85"]
NUMBERS = ["1", "2", "10", "1.5", "3.25", "100", "0.001"] * 3
NUMBERS += ["0", "00", "0.0", "2.", ".5", "-1", "1e3", "8191", "8192", "9" * 19, "1" * 41, "\uff12"]
GOOD_SUFFIXES = ["", "K", "KiB", "M", "MiB", "G", "GiB", "T", "TiB", "P", "PiB", "KB", "MB"]
GOOD_SUFFIXES += ["GB", "TB", "PB"]
SUFFIXES = GOOD_SUFFIXES * 3 + ["N", "n", "gib", "Gb", "kb", "x", "GIB", "iB"]
GOOD_PATHS = ["/scratch/%u/%j", "%d/out", "/data/in.txt", "/x/%x_%A_%a", "/a/%%b"]
PATH_PIECES = ["/", "scratch", "%j", "%x", "%", "%q", "..", ".", BS2, "\\", "a" * 256, "\x01"]
PATH_PIECES += ["\x7f", "é", "\ufffd", "\u200b", "x", "%\x02", "%é", "/" * 2]
STRAY = ["GiB", "gib", "2", "per-node", "yes", "no", "tmp", "shm", "=", "=2G", "#", "#c", "x"]
STRAY += ["'q'", '"q"', BS2, "capacity", "source", "=x", "Capacity=1G", "SOURCE=/a", "key=1"]
JUNK = [b"\xff", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82\xac"]

capacities = st.builds(lambda n, s: n + s, st.sampled_from(NUMBERS), st.sampled_from(SUFFIXES))
paths = st.sampled_from(GOOD_PATHS) | st.builds(
    lambda start, pieces: start + "".join(pieces),
    st.sampled_from(["/"] * 4 + ["", "%d/", "%j/"]),
    st.lists(st.sampled_from(PATH_PIECES), max_size=5),
)
layouts = st.sampled_from(["yes", "per-node", "no"] * 3 + ["", "maybe", "Yes"])
any_token = st.sampled_from(STRAY) | st.text(max_size=4).filter(
    lambda t: not any(c.isspace() for c in t)
)


def prefixes(word: str) -> st.SearchStrategy[str]:
    exact = "#" + word
    near = [exact.lower(), exact.upper(), exact.replace("K", "\u212a"), " " + exact]
    near += ["\t" + exact, "\u00a0" + exact, exact + "X", "# " + word, "#" + word.swapcase()]
    return st.sampled_from([exact] * 40 + near)


good_capacities = st.builds(
    lambda n, s: n + s, st.sampled_from(NUMBERS[:7]), st.sampled_from([*GOOD_SUFFIXES, "N"])
)


@st.composite
def plausible(draw: st.DrawFn, clean: bool) -> list[str]:
    """A verb with its keys: good values mostly; only good ones if clean."""
    verb = draw(st.sampled_from(VERBS))
    if clean:
        return {
            "shm": [verb, "capacity=" + draw(good_capacities)],
            "tmp": [verb, "capacity=" + draw(good_capacities)],
            "shared_tmpdir": [draw(st.sampled_from([verb, verb + "=yes"] * 3 + [verb + "=no"]))],
            "no_rm_tmpdir": [verb],
        }.get(verb, [verb, "source=" + draw(paths), "destination=/x/%j"])
    if verb in ("shm", "tmp"):
        size = draw(capacities)
        spelt = draw(st.sampled_from(["joined"] * 8 + ["= ", " =", " = ", "2 parts"]))
        if spelt == "joined":
            return [verb, "capacity=" + size] * draw(st.sampled_from([1] * 9 + [2]))
        if spelt == "2 parts":
            return [verb, "capacity=" + size[:1], size[1:]]
        return [verb, *("capacity" + spelt + size).split(" ")]
    if verb == "shared_tmpdir":
        return draw(
            st.sampled_from([[verb], [verb, "per-node"]])
            | layouts.map(lambda value: [verb + "=" + value])
        )
    if verb == "no_rm_tmpdir":
        return [verb]
    pairs = [("source=", draw(paths)), ("destination=", draw(paths))]
    kept = draw(st.sampled_from([pairs] * 6 + [pairs[:1], pairs[1:], pairs[::-1], pairs * 2]))
    return [verb] + [key + value for key, value in kept]


@st.composite
def directive_lines(draw: st.DrawFn, word: str, clean: bool = False) -> bytes:
    if clean:
        return b" ".join(w.encode() for w in ["#" + word, *draw(plausible(clean=True))])
    kind = draw(st.integers(0, 9))
    if kind < 7:
        words = draw(plausible(clean=False))
    elif kind < 9:
        words = [draw(st.sampled_from([*VERBS, "SHM", "bogus", "jobns:x", "tmp=", "stage-in"]))]
    else:
        words = []
    for _ in range(draw(st.integers(0, 3)) if kind >= 7 else int(draw(st.integers(0, 5)) == 0)):
        words.insert(draw(st.integers(1, max(1, len(words)))), draw(any_token))
    parts = [draw(prefixes(word)).encode()]
    for token in words:
        parts += [draw(st.sampled_from(SPACES)).encode(), token.encode()]
        if draw(st.integers(0, 15)) == 0:
            parts.append(draw(st.sampled_from(JUNK)))
    if draw(st.integers(0, 6)) == 0:
        trailing = [" # a comment", " #" + word, " #" + word.lower(), " #c 'x'"]
        parts.append(draw(st.sampled_from(trailing)).encode())
    return b"".join(parts)


@st.composite
def scripts(draw: st.DrawFn, word: str) -> bytes:
    other = st.sampled_from(["", "#SBATCH -N 1", "# comment", "   ", "\t# x"]).map(str.encode)
    lines = [b"#!/bin/bash"] if draw(st.booleans()) else []
    # Mostly good lines first, so that rules across lines (a second shared_tmpdir, a
    # second capacity) are reached too.
    lines += draw(
        st.lists(directive_lines(word, clean=True) | other, max_size=draw(st.integers(0, 4)))
    )
    lines += draw(st.lists(directive_lines(word) | other, min_size=1, max_size=4))
    if draw(st.booleans()):
        lines += [b"echo hi", draw(directive_lines(word))]
    ends = st.sampled_from([b"\n"] * 8 + [b"\r\n", b"\r"])
    return b"".join(line + draw(ends) for line in lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lua_refuses_exactly_what_python_refuses_within_the_subset(
    lua: Lua, data: st.DataObject
) -> None:
    word = data.draw(st.sampled_from(WORDS))
    granularity = data.draw(st.sampled_from([1, 1, 1, 4096, 2**62]))
    script = data.draw(scripts(word))
    py = python_says(script, word, granularity)
    ours = lua.check(script, word)
    if py is None:
        assert ours is None
    elif in_subset(py):
        assert ours == str(py)
    else:  # Python stopped at a rule Lua leaves to the prolog: Lua reads on
        assert ours is None or (py.lineno is not None and lua_line(ours) > py.lineno)


# ===================================================================== the job comment


def comment_as_prolog(data: bytes) -> str:
    """The comment as the prolog reads it from SLURM_JOB_COMMENT (os.environ: UTF-8 with
    surrogateescape; test_the_prolog_reads_the_comment_so holds this to Python itself)."""
    return data.decode("utf-8", "surrogateescape")


def python_comment_says(
    data: bytes, word: str = "JOBNS", granularity: int = 1
) -> DirectiveError | None:
    """What gather_directives does with the job comment: its shortcut, comment_directives,
    then parse_directives(..., source="--comment")."""
    comment = comment_as_prolog(data)
    lowered = comment.lower()
    if not ("jobns" in lowered or f"#{word.lower()}" in lowered):
        return None
    try:
        found = comment_directives(comment, word) if comment else None
        if found is not None:
            parse_directives(found, word, granularity, source="--comment")
    except DirectiveError as e:
        return e
    return None


def lua_item(message: str) -> int:
    found = re.match(r"--comment item (\d+): ", message)
    assert found, message
    return int(found.group(1))


# (comment, a part of Python's message or None where it accepts): every rule ported.
COMMENT_CORPUS: list[tuple[str | bytes, str | None]] = [
    # ordinary comments, and good directives
    ("", None),
    ("testing jobns today", None),
    ("jobns-test", None),
    ("jobns.sh", None),
    ("myjobns: x", None),
    ("jobnsjobns: bogus", None),
    ("run 42, see #jobns in the wiki", None),  # '#jobns' only counts at the start
    ("#JOBNSX tmp", None),
    ("jobns:", None),
    ("jobns: shm capacity=2GiB; shared_tmpdir", None),
    ("project X; jobns: tmp capacity=10G\nshm capacity=1G;no_rm_tmpdir;", None),
    ("x,jobns: no_rm_tmpdir", None),
    ("jobns: shm capacity=1GiB jobns: tmp capacity=2GiB", None),  # a job_submit.lua rule
    ("jobns:jobns: shm capacity=1G;jobns:tmp capacity=1G", None),
    ("jobns: #JOBNS shm capacity=1G; #JOBNS; ;;", None),
    ("jobns: shm capacity=1G # a note, 'quoted'", None),
    ("jobns: stage_in source=/scratch/%u/in destination=%d/in", None),
    ("\x1cjobns:\u2028shm capacity=1G\u00a0\x1f", None),  # Unicode whitespace
    ("jobns: tmp capacity=1G\r ", None),  # not at the item's end: only whitespace
    # bad items
    ("jobns: shm capacity=2 GiB", "--comment item 1: 'shm capacity=2 GiB': capacity '2 GiB'"),
    ("jobns: shm capacity=1G; bogus", "--comment item 2: 'bogus': unknown directive"),
    ("jobns: tmp capacity=1G shm capacity=1G", "starts another directive; separate directives"),
    ("jobns: tmp capacity=1G #JOBNS shm", "a second #JOBNS directive inside this one is not"),
    ("jobns: tmp capacity=1G #jobns", "separate directives with ';'"),
    ("jobns: # just a note", "not a #JOBNS directive; write it without a leading '#'"),
    ("jobns: #JOBNSX tmp", "not a #JOBNS directive"),
    ("jobns: tmp capacity=1G\r\nshm capacity=1G", "item 1: 'tmp capacity=1G': DOS line break"),
    ("jobns: tmp capacity=1G\r", "DOS line break (\\r\\n); remove the '\\r'"),
    ("jobns: shm capacity=1G;tmp capacity=1G\r;", "item 2: 'tmp capacity=1G': DOS line"),
    ("jobns: shared_tmpdir=per-node; shared_tmpdir=no", "contradicts an earlier"),
    ("jobns: stage_in source=/a;b destination=/c", "stage_in needs destination="),
    ("jobns: shm capacity=1G jobns: Tmp capacity=1G", "item 2: 'Tmp capacity=1G'"),
    ("jobns: Jobns:tmp", "'jobns:' goes once, at the start of a job comment"),
    ("jobns: x,jobns:tmp", "unknown directive 'x,jobns:tmp'"),
    ("jobns: stage_in source=/a/%q destination=/b", "uses unknown symbol '%q'"),
    ("jobns: tmp capacity=1G;;\n;shm capacity=2N", "item 5: 'shm capacity=2N': capacity '2N'"),
    ("jobns: tmp capacity= 2G", "'capacity= 2G' has a space around '='"),
    ("jobns: tmp capacity='1G'", "quoting is not supported"),
    ("jobns: shm capacity=1G shm capacity=1G", "'shm' starts another directive"),
    ("jobns: shared_tmpdir per-node", "write 'shared_tmpdir=per-node'"),
    ("jobns: jobns:shm", "item 2: 'shm': shm needs capacity="),
    # near misses: the word jobns at the start, jobns + ':' spelt otherwise, #JOBNS
    ("JOBNS: shm capacity=1GiB", "write --comment 'jobns: shm capacity=1GiB'"),
    ("Jobns: tmp capacity=1G", "this looks meant for jobns"),
    ("jobns : tmp capacity=1G", "write --comment 'jobns: tmp capacity=1G'"),
    ("jobns\t:shm", "this looks meant for jobns"),
    ("jobns shm capacity=1G", "write --comment 'jobns: shm capacity=1G'"),
    ("  jobns=shm", "write --comment 'jobns: shm'"),
    ("jobns;", "write --comment 'jobns: shm capacity=2GiB'"),
    ("jobns", "write --comment 'jobns: shm capacity=2GiB'"),
    ("\u3000JoBnS\u3000tmp capacity=1G ", "'JoBnS\\u3000tmp capacity=1G'"),
    ("my job, JOBNS: shm capacity=1G", "write --comment 'my job, jobns: shm capacity=1G'"),
    ("JOBNS: x jobns: shm capacity=1G", "write --comment 'jobns: x jobns: shm capacity=1G'"),
    ("jobns jobns: tmp capacity=1G", "this looks meant for jobns"),
    ("#JOBNS shm capacity=1G", "not as #JOBNS lines; write --comment 'jobns: shm capacity"),
    ("#jobns shm capacity=1G; #Jobns tmp capacity=1G", "'jobns: shm capacity=1G; ; tmp"),
    ("note: #JOBNS tmp capacity=1G #jobns shm", "'note: jobns: tmp capacity=1G ; shm'"),
    ("#JOBNS", "write --comment 'jobns: shm capacity=2GiB'"),
    ("#JOBNS;shm x #JOBNS jobns: tmp", "write --comment 'jobns: ;shm x ; jobns: tmp'"),
    # hostile bytes, repr(), long items
    (b"jobns: shm capacity=1G \xff\xfe", "unexpected word '\\udcff\\udcfe'"),
    (b"jobns: tmp capacity=1G \x1b[2J\x07", "unexpected word '\\x1b[2J\\x07'"),
    (b"\xff\xc3 jobns: bogus \xe2\x82", "unknown directive 'bogus'"),
    (b"JOBNS:\xe2\x82\xac \xed\xa0\x80 x", "'jobns: \u20ac \\udced\\udca0\\udc80 x'"),
    (b"jobns: stage_in source=/a/%\xff destination=/b", "uses unknown symbol '%\\udcff'"),
    (b"jobns: stage_in source=/" + b"\xff" * 255 + b" destination=/b", None),  # 255 bytes
    (b"jobns: stage_in source=/" + b"\xff" * 256 + b" destination=/b", "longer than 255"),
    (b"jobns: stage_in source=/" + "é".encode() * 128 + b" destination=/b", "longer than 255"),
    ("jobns: tmp capacity=1G " + "é" * 184, "é" * 184 + "': unexpected"),  # 200: whole
    ("jobns: tmp capacity=1G " + "é" * 185, "é" * 184 + "...': "),  # 201: cut
    ("JOBNS: " + "x" * 300, "x" * 193 + "...': this looks"),
    ("jobns: " + "verb" * 1500, "unknown directive 'verbverb"),
]


@pytest.mark.parametrize(
    ("comment", "expected"),
    COMMENT_CORPUS,
    ids=[f"comment{i}" for i in range(len(COMMENT_CORPUS))],
)
def test_lua_gives_pythons_verdict_on_the_comment_corpus(
    lua: Lua, comment: str | bytes, expected: str | None
) -> None:
    data = encoded(comment)
    py = python_comment_says(data)
    if expected is None:
        assert py is None, str(py)
    else:
        assert py is not None and expected in str(py), (expected, str(py))
    assert lua.comment(data) == (None if py is None else str(py))


def test_python_comment_says_is_what_the_prolog_does() -> None:
    """python_comment_says (with any word) is gather_directives on SLURM_JOB_COMMENT."""
    for comment, _ in COMMENT_CORPUS:
        text = comment_as_prolog(encoded(comment))
        try:
            gather_directives(Request(), {"SLURM_JOB_COMMENT": text}, None)
            prolog: str | None = None
        except DirectiveError as e:
            prolog = str(e)
        ours = python_comment_says(encoded(comment))
        assert prolog == (None if ours is None else str(ours)), comment


def test_the_prolog_reads_the_comment_so(tmp_path: Path) -> None:
    """os.environ in a Python started with an environment like the prolog's (no locale)."""
    data = b"jobns: \xff\xc3 \xe2\x82\xac \xed\xa0\x80 \xf0\x9f\x98"
    show = "import os, sys; sys.stdout.write(ascii(os.environ['SLURM_JOB_COMMENT']))"
    r = subprocess.run(
        [sys.executable, "-c", show],
        env={b"SLURM_JOB_COMMENT": data},  # no LANG or LC_*: C locale, as slurmd may give
        capture_output=True,
        check=True,
    )
    assert r.stdout.decode() == ascii(comment_as_prolog(data))


def test_a_comment_error_is_the_users_not_the_sites() -> None:
    assert isinstance(python_comment_says(b"JOBNS: tmp"), CommentError)


def test_comment_sizes_compared_after_the_nodes_rounding_are_left_to_the_prolog(
    lua: Lua,
) -> None:
    comment = b"jobns: shm capacity=1000; shm capacity=1001"
    py = python_comment_says(comment)  # granularity 1 byte: 1000 != 1001
    assert py is not None and py.problem.startswith(OUT_OF_SUBSET), str(py)
    assert python_comment_says(comment, granularity=4096) is None
    assert lua.comment(comment) is None
    later = comment + b"; bogus"  # Lua reads on where Python stopped
    assert lua.comment(later) == str(python_comment_says(later, granularity=4096))


def test_only_a_comment_within_64_kib_is_judged(lua: Lua) -> None:
    within = b"jobns: bogus;" + b" " * (MAX_JUDGED - 13)
    assert len(within) == MAX_JUDGED
    assert lua.comment(within) == str(python_comment_says(within))
    beyond = within + b" "
    assert python_comment_says(beyond) is not None
    assert lua.comment(beyond) is None


HOSTILE_COMMENTS = {
    "words": b"jobns: " + b"jobns " * (MAX_JUDGED // 6 - 2),
    "items": b"jobns: " + b"shm capacity=1G;" * (MAX_JUDGED // 16 - 1),
    "prefixes": b"jobns:" * (MAX_JUDGED // 6),
    "spaces": b" " * (MAX_JUDGED - 6) + b"JOBNS ",
    "blanks": b"JOBNS" + b" \t" * (MAX_JUDGED // 2 - 3),
    "hashtags": b"x " + b"#jobns " * (MAX_JUDGED // 7 - 1),
    "pasted": b"x " + b"#JOBNS\t" * (MAX_JUDGED // 7 - 1),
    "tabs": b"x jobns" + b"\t" * (MAX_JUDGED - 8) + b":",
    "ideographic": b"\xe3\x80\x80" * (MAX_JUDGED // 3 - 2) + b"jobns",
    "undecodable": b"jobns: " + b"\xff" * (MAX_JUDGED - 8) + b";",
    "path": b"jobns: stage_in source=/" + b"a/" * (MAX_JUDGED // 2 - 40) + b" destination=/b",
    "four-mib": b"jobns: bogus " + b"\xff" * (4 << 20),  # not judged at all
}


@pytest.mark.parametrize("comment", HOSTILE_COMMENTS.values(), ids=list(HOSTILE_COMMENTS))
def test_a_hostile_comment_is_checked_quickly(lua: Lua, comment: bytes) -> None:
    start = time.monotonic()
    verdict = lua.comment(comment)
    assert time.monotonic() - start < 2.0
    if len(comment) <= MAX_JUDGED:
        py = python_comment_says(comment)
        assert verdict == (None if py is None else str(py))
    else:
        assert verdict is None


@pytest.mark.parametrize(
    "space", SPACES_OF_PYTHON, ids=[f"U+{ord(c):04X}" for c in SPACES_OF_PYTHON]
)
def test_every_whitespace_of_python_counts_in_a_comment(lua: Lua, space: str) -> None:
    """Python's \\s (str.isspace()): after the word jobns, before a later 'jobns:', after
    #JOBNS, and stripped around the comment and its items."""
    for comment in (
        f"{space}jobns{space}tmp{space}",
        f"{space}jobns:{space}tmp capacity=1G{space}jobns:bogus{space};{space}",
        f"x{space}#JOBNS{space}tmp",
    ):
        data = comment.encode()
        py = python_comment_says(data)
        assert py is not None and lua.comment(data) == str(py)


@pytest.mark.parametrize(
    ("word", "comment"),
    [
        ("BB_LUA", "#BB_LUA tmp capacity=1G"),
        ("BB_LUA", "jobns: #BB_LUA tmp capacity=1G; #JOBNS shm"),
        ("BB_LUA", "jobns: tmp capacity=1G #bb_lua"),
        ("BB_LUA", "#bb_lua tmp #BB_LUA shm"),
        ("BB_LUA", "#JOBNS shm capacity=1G"),  # an ordinary comment for this word
        ("K8S", "#\u212a8S tmp"),  # the Kelvin sign: not 'K' here
        ("K8S", "jobns: tmp capacity=1G #\u212a8s"),
        ("x", "#X;tmp"),
    ],
)
def test_the_directive_word_is_a_parameter_of_the_comment_too(
    lua: Lua, word: str, comment: str
) -> None:
    py = python_comment_says(comment.encode(), word)
    assert lua.comment(comment.encode(), word) == (None if py is None else str(py))


@pytest.mark.parametrize("word", ["#JOBNS", "", "W" * 65])
def test_a_bad_directive_word_is_the_sites_error_for_a_comment_too(lua: Lua, word: str) -> None:
    with pytest.raises(JobnsError) as info:
        comment_directives("jobns: tmp", word)
    assert lua.error(b"testing", word, mode="comment") == str(info.value)


@pytest.mark.parametrize(
    "comment",
    [
        "jobns: shm capacity=2 GiB",
        "JOBNS: shm capacity=1GiB",
        "#JOBNS tmp capacity=1G",
        "jobns: tmp capacity=1G; stage_in source=/a/%q destination=/b",
        "jobns: tmp \udcff",
    ],
)
def test_jobns_check_says_it_after_its_own_prefix_for_a_comment(
    lua: Lua, tmp_path: Path, comment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user sees from `jobns check --comment`."""
    config = tmp_path / "jobns.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\nshared_base = "{tmp_path}"\n')
    code = dispatch(["check", "--config", str(config), "--comment", comment])
    message = lua.comment(comment.encode("utf-8", "surrogateescape"))
    assert message is not None
    assert (code, capsys.readouterr().err) == (
        125,
        f"jobns: check: jobns setup would refuse the job: {message}\n",
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=24) | st.lists(st.sampled_from(UTF8_PIECES)).map(b"".join))
def test_decode_escaped_is_pythons_utf8_with_surrogateescape(lua: Lua, data: bytes) -> None:
    expected = comment_as_prolog(data).encode("utf-8", "surrogatepass")
    assert lua.run("decode_escaped", data) == expected


# A comment from a grammar: text, a 'jobns:' or a near miss of it, items (plausible
# directives with the script test's mutations) apart by ';', newlines or a later 'jobns:'.


def comment_prefixes(word: str) -> st.SearchStrategy[str]:
    exact = "#" + word
    near = ["JOBNS:", "Jobns:", "jobns :", "jobns\t:", "jobns", "jobns=", "jobns;", "jobns "]
    near += [exact, exact.lower(), exact + " ", exact + "X", "myjobns:", "jobns-x", "#jobns", ""]
    return st.sampled_from(["jobns:"] * 24 + ["jobns: "] * 8 + near)


@st.composite
def comment_items(draw: st.DrawFn, word: str) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind < 5:
        return draw(directive_lines(word, clean=True))[len(word) + 2 :]  # without '#WORD '
    if kind < 7:
        return draw(directive_lines(word))[len(word) + 1 :]  # its prefix's spelling aside
    if kind < 9:
        return draw(directive_lines(word))
    return draw(st.sampled_from(["", " ", "# note", "#" + word, "x", "\r", "\u3000"])).encode()


@st.composite
def comments(draw: st.DrawFn, word: str) -> bytes:
    lead = draw(st.sampled_from(["", "", "", "project x ", "run 3; ", "x,", "  ", "\u00a0"]))
    parts = [lead.encode(), draw(comment_prefixes(word)).encode()]
    separators = ["; "] * 4 + [";", "\n", " ; ", " jobns: ", ";;", "\njobns:", "\r\n", "\r;"]
    for i, item in enumerate(draw(st.lists(comment_items(word), min_size=1, max_size=4))):
        if i:
            parts.append(draw(st.sampled_from(separators)).encode())
        parts.append(item)
    if draw(st.integers(0, 4)) == 0:
        parts.append(draw(st.sampled_from([" # note", "\r", " ", "\xff", "JOBNS:", "#"])).encode())
    return b"".join(parts)


# A soup of the pieces the comment rules look at, for their corners.
SOUP = ["jobns", "JOBNS", "Jobns", "jobns:", ":", " ", "\t", ";", "\n", "\r", "#", "x", "_"]
SOUP += ["=", "\u3000", "\x85", "shm", "capacity=1G", "tmp", "shared_tmpdir", "=no", "%", "/"]


def soup(word: str) -> st.SearchStrategy[bytes]:
    prefixes = ["#" + word, "#" + word.lower(), "#" + word.replace("K", "\u212a")]
    pieces = [p.encode() for p in SOUP + prefixes] + [b"\xff", b"\xe2\x82"]
    return st.lists(st.sampled_from(pieces), max_size=14).map(b"".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lua_refuses_exactly_the_comments_python_refuses_within_the_subset(
    lua: Lua, data: st.DataObject
) -> None:
    word = data.draw(st.sampled_from(WORDS))
    comment = data.draw(comments(word) if data.draw(st.integers(0, 3)) else soup(word))
    py = python_comment_says(comment, word)
    ours = lua.comment(comment, word)
    if py is None:
        assert ours is None
    elif in_subset(py):
        assert ours == str(py)
    else:  # Python stopped at a rule Lua leaves to the prolog: Lua reads on
        assert ours is None or (py.lineno is not None and lua_item(ours) > py.lineno)
