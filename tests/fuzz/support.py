"""Shared machinery of the fuzz campaign: profiles, counters, checks and input strategies.

Profiles (hypothesis settings, applied per property with :func:`fuzz`):

* default (CI, ``ci/run``): ``JOBNS_FUZZ_EXAMPLES`` examples per property (200 unless
  set), derandomized, no example database -- the same inputs on every run, quick.
* ``JOBNS_FUZZ_PROFILE=long`` (``ci/fuzz``): random inputs (``--hypothesis-seed``
  varies them), failures remembered in a database under /var/tmp (never in the repo).

Every property counts the inputs it tried with :func:`tried`; the conftest prints one
line per target at the end of the session and writes the counts to
``$JOBNS_FUZZ_REPORT`` (JSON) for ``ci/fuzz`` to add up.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, reject, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from jobns.launcher.model.directives import VERBS
from jobns.launcher.system.errors import JobnsError

EXAMPLES = int(os.environ.get("JOBNS_FUZZ_EXAMPLES") or "200")
LONG = os.environ.get("JOBNS_FUZZ_PROFILE") == "long"
DB_DIR = os.environ.get("JOBNS_FUZZ_DB") or "/var/tmp/jobns-fuzz-db"

_BASE = settings(
    max_examples=EXAMPLES,
    deadline=None,  # subprocesses and the first import of a module vary a lot
    derandomize=not LONG,
    database=DirectoryBasedExampleDatabase(DB_DIR) if LONG else None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
    print_blob=True,
)


def fuzz(weight: float = 1.0) -> settings:
    """Settings for one property: ``weight`` scales the examples (subprocess targets
    are slower, so they try fewer inputs per run)."""
    return settings(_BASE, max_examples=max(10, int(EXAMPLES * weight)))


# ------------------------------------------------------------------------------ counting

TRIED: Counter[str] = Counter()


def tried(target: str) -> None:
    """One more input tried against target (summed per target by the conftest)."""
    TRIED[target] += 1


# -------------------------------------------------------------------------------- checks

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
T = TypeVar("T")


def check_message(msg: str) -> None:
    """A JobnsError's message is printed as one ``jobns: ...`` line: not empty, no line
    break and no control character (a hostile value must not forge a second line or
    reach a terminal raw)."""
    assert msg.strip(), "empty error message"
    assert len(msg.splitlines()) == 1 and not _CONTROL.search(msg), (
        f"error message is not one clean line: {msg!r}"
    )


def outcome(f: Callable[..., T], *args: object, **kw: object) -> T | JobnsError:
    """f's result, or the JobnsError it raised (its message checked); anything else it
    raises propagates and fails the property: that is a bug (unless a known one)."""
    try:
        return f(*args, **kw)
    except JobnsError as e:
        try:
            check_message(str(e))
        except AssertionError:
            skip_if_known(e)
            raise
        return e
    except Exception as e:
        skip_if_known(e)
        raise


class KnownBug:
    """A bug this campaign found in a file outside its remit, reported to its owners.

    The properties skip an input that hits it (hypothesis.reject, counted as ``known bug
    KEY`` in the tally, so it is not hidden) to go on finding others; test_known_bugs.py
    pins each with an xfail(strict) reproducer, which fails the day the bug is fixed:
    then delete the entry here.
    """

    def __init__(
        self, key: str, file: str, exc: type[BaseException], note: str, stderr: str | None = None
    ) -> None:
        self.key = key
        self.file = file  # where the exception is raised, e.g. "jobns/hook/oci_config.py"
        self.exc = exc
        self.note = note
        self.stderr = re.compile(stderr) if stderr else None  # the CLI's symptom

    def matches(self, e: BaseException) -> bool:
        tb = e.__traceback__
        last = None
        while tb is not None:
            last = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        return isinstance(e, self.exc) and last is not None and last.endswith(self.file)


KNOWN_BUGS: list[KnownBug] = []  # every bug found so far is fixed (test_regressions.py)


def skip_if_known(e: BaseException) -> None:
    for bug in KNOWN_BUGS:
        if bug.matches(e):
            TRIED[f"known bug {bug.key}"] += 1
            reject()


def skip_if_known_cli(stderr: str) -> None:
    for bug in KNOWN_BUGS:
        if bug.stderr is not None and bug.stderr.search(stderr):
            TRIED[f"known bug {bug.key}"] += 1
            reject()


def check_cli(rc: int, stderr: str, allowed: frozenset[int] | set[int]) -> None:
    """The command line's contract: a documented exit status; on stderr only ``jobns:``
    lines, never a traceback or an internal error; when it fails, at most one line that
    is not a warning (the reason)."""
    assert "Traceback" not in stderr, stderr
    assert "internal error" not in stderr, stderr
    assert rc in allowed, f"exit status {rc} not in {sorted(allowed)}; stderr: {stderr!r}"
    lines = stderr.split("\n")
    assert lines[-1] == "", f"stderr does not end with a newline: {stderr!r}"
    lines = lines[:-1]
    for line in lines:
        assert line.startswith("jobns: "), f"stderr line without 'jobns: ': {line!r}"
        assert not _CONTROL.search(line), f"control character in stderr line: {line!r}"
    if rc != 0:
        reasons = [ln for ln in lines if not ln.startswith("jobns: warning: ")]
        assert len(reasons) <= 1, f"more than one error line: {stderr!r}"


JOBNS_CODES = frozenset({0, 125})
RUN_CODES = frozenset({0, 125, 126, 127, *range(129, 129 + 64)})


def to_bytes(text: str) -> bytes:
    """text as the bytes of an argv or environment entry (no NUL: exec cannot pass one);
    lone surrogates become invalid UTF-8, which is what a hostile user can pass too."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")
    return data.replace(b"\0", b"")


# ---------------------------------------------------------------------------- strategies

SPECIALS = [
    "\x00",
    "\n",
    "\r",
    "\t",
    " ",
    "/",
    ".",
    "..",
    "%",
    "\\",
    "\\\\",
    "=",
    ";",
    "#",
    "'",
    '"',
    "-",
    "--",
    "\u00b2",
    "\u0661",
    "\u00e9",
    "\x1b",
    "\x85",
    "\u2028",
    "\udcff",
    "\ud800",
    "\ufeff",
    "\u00a0",
    "\x0b",
    "~",
    "*",
    ":",
    ",",
    "$",
    "`",
    "jobns:",
    "#JOBNS",
    "..",
    "/..",
    "%j",
    "%x",
    "%d",
]


def hostile_text(max_size: int = 30) -> st.SearchStrategy[str]:
    """What a user can type: any text, and runs of the characters parsers trip over."""
    pieces = st.one_of(st.sampled_from(SPECIALS), st.text(max_size=4))
    return st.one_of(st.text(max_size=max_size), st.lists(pieces, max_size=8).map("".join))


def optional(s: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    return st.one_of(st.none(), s)


NUMBERS = st.one_of(
    st.integers(0, 2**64).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "007",
            "-1",
            "+1",
            "1.0",
            "1e3",
            "\u00b2",
            "\u0663",
            " 1",
            "1 ",
            "0x10",
            "4294967294",
            "4294967295",
            "18446744073709551616",
            "",
        ]
    ),
)

CAP_SUFFIXES = [
    "",
    "K",
    "KiB",
    "M",
    "MiB",
    "G",
    "GiB",
    "T",
    "TiB",
    "P",
    "PiB",
    "KB",
    "MB",
    "GB",
    "TB",
    "PB",
    "N",
    "k",
    "kib",
    "KIB",
    "kb",
    "n",
    "Ki",
    "B",
    "iB",
    "E",
    "EiB",
    "EB",
    "g",
    "gb",
    "Gb",
    "\u212a",
    "K\u0130B",
]


def capacity_text() -> st.SearchStrategy[str]:
    digits = st.one_of(
        st.integers(0, 10**25).map(str), st.from_regex(r"[0-9]{1,45}", fullmatch=True)
    )
    number = st.one_of(
        digits,
        st.builds(lambda a, b: f"{a}.{b}", digits, digits),
        st.sampled_from(
            [
                "",
                ".5",
                "1.",
                "1e3",
                "-1",
                "+1",
                "1_0",
                "\u0663",
                "\uff11",
                "nan",
                "inf",
                "0.0000000001",
            ]
        ),
    )
    suffix = st.one_of(
        st.sampled_from(CAP_SUFFIXES), st.text(alphabet="KMGTPENiBkmgtpenib", max_size=4)
    )
    return st.one_of(st.builds(str.__add__, number, suffix), hostile_text(12))


PATH_PIECES = [
    "/",
    "%j",
    "%A",
    "%a",
    "%d",
    "%u",
    "%x",
    "%%",
    "%",
    "%q",
    "%\n",
    "\\\\",
    "\\",
    "..",
    ".",
    "tmp",
    "/tmp",
    "/tmp/",
    "/var/tmp/",
    "/dev/shm/",
    "/stage/",
    "/session/",
    "a",
    "x" * 300,
    "//",
    "/./",
    "\x00",
    "\r",
    ";",
    "#",
]


def path_text() -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(PATH_PIECES), hostile_text(6))
    return st.lists(piece, max_size=8).map("".join)


SEPARATORS = [" ", "\t", "  ", "\x0b", "\x0c", "\u00a0", "\u3000", "\x1c", "\u2028", "\x85"]

VERB_WORDS = [
    *VERBS,
    "SHM",
    "Tmp",
    "shared_tmpdir=per-node",
    "shared_tmpdir=no",
    "shared_tmpdir=yes",
    "shared_tmpdir=maybe",
    "shared_tmpdir=",
    "no_rm_tmpdir=1",
    "stage_in=x",
    "frob",
    "#x",
    '"shm"',
]


def option_token() -> st.SearchStrategy[str]:
    return st.one_of(
        capacity_text().map(lambda c: f"capacity={c}"),
        path_text().map(lambda p: f"source={p}"),
        path_text().map(lambda p: f"destination={p}"),
        st.sampled_from(
            [
                "capacity",
                "capacity=",
                "source=",
                "x=1",
                "#",
                "# c",
                "\\\\",
                "capacity='1G'",
                'source="/a"',
                "=",
                "capacity=1G=2",
            ]
        ),
        hostile_text(10),
    )


GOOD_CAPACITIES = st.one_of(
    st.sampled_from(["1", "1K", "4KiB", "1M", "500MB", "1.5GiB", "2G", "1TB", "3N", "8EiB", "1P"]),
    st.integers(1, 2**40).map(str),
)
STAGE_ROOT = "/x/stage"  # placeholders: a test puts its sandbox's roots in their place
SESSION_ROOT = "/x/sessions"


def good_directive_body() -> st.SearchStrategy[str]:
    """A well-formed directive, so that whole requests reach capacities and staging; its
    paths use every symbol, and STAGE_ROOT on the host side."""
    rel = st.lists(
        mostly(
            st.sampled_from(
                [
                    "%j",
                    "%u",
                    "%x",
                    "%a",
                    "%A",
                    "in",
                    "out",
                    "a.txt",
                    "%%",
                    "\\\\%j",
                    "sub/dir",
                    "..",
                    ".",
                    "%j.%a",
                    "in",
                    "out",
                    "data",
                ]
            ),
            hostile_text(4),
        ),
        min_size=1,
        max_size=3,
    ).map("/".join)
    job_side = st.builds(
        lambda t, r: f"{t}/{r}",
        st.sampled_from(["/tmp", "/var/tmp", "/dev/shm", "/tmp", "/var/tmp", "%d", "/etc"]),
        rel,
    )
    host_side = st.builds(
        lambda t, r: f"{t}/{r}",
        st.sampled_from([STAGE_ROOT, STAGE_ROOT, STAGE_ROOT, "%d", "/etc"]),
        rel,
    )
    return st.one_of(
        st.builds(lambda a, b: f"stage_in source={a} destination={b}", host_side, job_side),
        st.builds(lambda a, b: f"stage_out source={a} destination={b}", job_side, host_side),
        st.builds(
            lambda v, c: f"{v} capacity={c}", st.sampled_from(["shm", "tmp"]), GOOD_CAPACITIES
        ),
        st.sampled_from(
            ["shared_tmpdir", "shared_tmpdir=per-node", "shared_tmpdir=no", "no_rm_tmpdir", ""]
        ),
    )


def directive_body() -> st.SearchStrategy[str]:
    """A verb and options, joined by whitespace of every kind str.split knows."""
    verb = st.one_of(st.sampled_from(VERB_WORDS), hostile_text(8))
    tokens = st.tuples(verb, st.lists(option_token(), max_size=4))
    return st.builds(
        lambda t, seps, tail: _join([t[0], *t[1]], seps) + tail,
        tokens,
        st.lists(st.sampled_from(SEPARATORS), min_size=1, max_size=6),
        st.sampled_from(["", " # comment", " \\\\ x", "\r", " ", "\t#"]),
    )


def _join(tokens: list[str], seps: list[str]) -> str:
    out = ""
    for i, tok in enumerate(tokens):
        out += (seps[i % len(seps)] if i else "") + tok
    return out


PREFIXES = [
    "#JOBNS ",
    "#JOBNS\t",
    "#JOBNS",
    "#jobns ",
    " #JOBNS ",
    "# JOBNS ",
    "#JOBNSX ",
    "#JOBNS  ",
    "#BB ",
    "\ufeff#JOBNS ",
]


def directive_line() -> st.SearchStrategy[str]:
    body = st.one_of(directive_body(), good_directive_body())
    return st.builds(str.__add__, st.sampled_from(PREFIXES), body)


def script_text() -> st.SearchStrategy[str]:
    """A batch script: shebang, a header of directives and comments, then commands."""
    line = st.one_of(
        directive_line(),
        st.sampled_from(
            [
                "",
                "   ",
                "#SBATCH -N 2",
                "# a comment",
                "echo hi",
                "srun true",
                "#!/bin/bash",
                "#JOBNS",
                "#JOBNS\r",
                "#jobns shm capacity=1G",
                "  #JOBNS tmp capacity=1G",
            ]
        ),
        hostile_text(20),
    )
    return st.builds(
        lambda shebang, lines, eol: shebang + eol.join(lines),
        st.sampled_from(["", "#!/bin/bash\n", "#!/bin/sh\r\n"]),
        st.lists(line, max_size=10),
        st.sampled_from(["\n", "\n", "\r\n"]),
    )


def directives_text() -> st.SearchStrategy[str]:
    """A --directives string or a job comment's tail: items split on ';' and newlines."""
    item = st.one_of(
        good_directive_body(),
        good_directive_body(),
        directive_body(),
        directive_line(),
        hostile_text(10),
    )
    return st.builds(
        lambda items, sep: sep.join(items),
        st.lists(item, max_size=5),
        st.sampled_from([";", "\n", "; ", ";;", " ;\n"]),
    )


def comment_text() -> st.SearchStrategy[str]:
    """SLURM_JOB_COMMENT: anything the submitter wrote, often with a 'jobns:' part."""
    return st.one_of(
        directives_text().map(lambda d: "jobns:" + d),
        st.builds(lambda a, d: f"{a}jobns: {d}", hostile_text(10), directives_text()),
        st.builds(lambda d, e: f"jobns:{d}jobns:{e}", directives_text(), directives_text()),
        hostile_text(20),
    )


USER_NAMES = [
    "root",
    "0",
    "jobnsbob",
    "1002",
    "nobody",
    "65534",
    "no-such-user",
    "4294967295",
    "4294967296",
    "-1",
    "\u00b2",
    "\u0661",
    "root\x00",
    "",
    " root",
    "ROOT",
    "1e3",
    "99999999999999999999999999",
]


def user_spec() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(USER_NAMES), hostile_text(12))


JOB_IDS = [
    "1",
    "42",
    "job.1",
    "a-b_c",
    "0",
    "",
    ".",
    "..",
    "a/b",
    "x" * 129,
    "x" * 128,
    "-1",
    "%j",
    "1\n2",
    "\u00b2",
]


def job_id_text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(JOB_IDS), hostile_text(12))


SLURM_KEYS = [
    "SLURM_JOB_ID",
    "SLURM_JOB_USER",
    "SLURM_JOB_UID",
    "SLURM_JOB_NAME",
    "SLURM_SUBMIT_DIR",
    "SLURM_JOB_WORK_DIR",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_COMMENT",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "PMIX_NAMESPACE",
    "PMIX_RANK",
]


def slurm_env(keys: list[str] | None = None) -> st.SearchStrategy[dict[str, str]]:
    """The variables Slurm (and through it the job's submitter) sets."""
    value = st.one_of(NUMBERS, hostile_text(16), path_text(), comment_text(), user_spec())
    return st.dictionaries(st.sampled_from(keys or SLURM_KEYS), value, max_size=6)


# ----------------------------------------------------------------------- JSON and TOML

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text(12),
)
json_values = st.recursive(
    json_scalar,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(hostile_text(8), kids, max_size=4)
    ),
    max_leaves=12,
)

toml_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    hostile_text(12),
    path_text(),
    st.datetimes(),
    st.dates(),
    st.times(),
    st.datetimes(timezones=st.just(datetime.UTC)),
)
toml_values = st.recursive(
    toml_scalar,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(hostile_text(6), kids, max_size=3)
    ),
    max_leaves=8,
)


def toml_string(s: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's, except that TOML has no \/ (JSON
    # never writes it) and rejects surrogates (an invalid document, also worth trying).
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{" + ", ".join(f"{toml_string(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
        )
    raise TypeError(type(v))


def toml_doc(doc: dict[str, object]) -> str:
    """doc as a TOML document: scalars at the top, dict values as [tables]."""
    top = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = [
        f"[{toml_string(k)}]\n"
        + "".join(f"{toml_string(str(kk))} = {toml_value(vv)}\n" for kk, vv in v.items())
        for k, v in doc.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n" + "\n".join(tables)


def mostly(
    usual: st.SearchStrategy[T], rare: st.SearchStrategy[T], one_in: int = 8
) -> st.SearchStrategy[T]:
    """usual, except one draw in one_in (on average) from rare."""
    return st.integers(1, one_in).flatmap(lambda i: rare if i == 1 else usual)


def config_doc(paths: list[str]) -> st.SearchStrategy[dict[str, object]]:
    """A site config: the schema's keys, mostly with well-typed values (so that whole
    documents get through the checks and reach the code behind them), else wrong types
    and hostile strings; paths mostly from ``paths`` (a sandbox)."""
    odd_path = st.one_of(
        st.sampled_from(
            [
                "relative",
                "/a/../b",
                "/a//b",
                "/a/",
                "/a/./b",
                "/a\x00b",
                "/a\nb",
                "/a\x1bb",
                "",
                "/\ud800",
                "/a\tb",
            ]
        ),
        path_text(),
    )
    fine_path = st.sampled_from(
        ["/", "/tmp", "/dev/shm", "/var/tmp", "/a b", "/\udcff", "/x\u00e9", "/" + "x" * 300]
    )
    path = mostly(st.sampled_from(paths), st.one_of(fine_path, odd_path))
    size = st.one_of(
        capacity_text(),
        st.sampled_from(["1", "4GiB", "1MiB", "1000KB", "1.5G"]),
        st.integers(1, 2**40),
        st.integers(-5, 2**70),
    )
    number = st.one_of(
        st.integers(0, 1000),
        st.floats(min_value=0, max_value=1e6),
        st.sampled_from(
            [math.nan, math.inf, -math.inf, -0.0, 5e-324, 86400.0, 86400.5, 604800.0, -1]
        ),
        st.floats(),
    )
    command = st.one_of(
        st.sampled_from(
            [
                "",
                "cp -a",
                "mv",
                "/bin/true",
                "rsync -a --remove-source-files",
                "'unclosed",
                "   ",
                "/bin/echo 'x y'",
                "true",
                "/bin/x\x00y",
            ]
        ),
        hostile_text(12),
    )
    paths_list = st.lists(path, max_size=3)

    def typed(v: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
        return mostly(v, toml_values)  # mostly right, sometimes any TOML value

    def section(fields: dict[str, st.SearchStrategy[object]]) -> st.SearchStrategy[object]:
        known = st.fixed_dictionaries({}, optional={k: typed(v) for k, v in fields.items()})
        extra = st.dictionaries(hostile_text(6), toml_values, min_size=1, max_size=1)
        return mostly(
            known, st.one_of(st.builds(lambda a, b: {**a, **b}, known, extra), toml_values)
        )

    fields: dict[str, st.SearchStrategy[object]] = {
        "local_base": path,
        "shm_base": path,
        "shared_base": path,
        "state_dir": path,
        "kill_wait": number,
        "arc": section(
            {
                "shared_filesystem": st.booleans(),
                "scratchdir": path,
                "movetool": command,
                "shared_scratch": path,
            }
        ),
        "directives": section(
            {
                "word": st.one_of(
                    st.sampled_from(["JOBNS", "BB", "x" * 64, "x" * 65, "#JOBNS", "a b", ""]),
                    hostile_text(8),
                )
            }
        ),
        "capacity": section(
            {k: size for k in ("granularity", "shm_max", "tmp_max", "shm_default", "tmp_default")}
        ),
        "staging": section(
            {
                "session_roots": paths_list,
                "session_dir": path_text(),
                "dynamic_scratch": st.booleans(),
                "stdio": st.one_of(
                    st.lists(st.sampled_from(["stdout", "stderr", "x"]), max_size=3),
                    st.lists(hostile_text(8), max_size=3),
                ),
                "stage_roots": paths_list,
                "timeout": number,
            }
        ),
        "lifecycle": section({"pre_run": command, "post_run": command, "program_timeout": number}),
    }
    known = st.fixed_dictionaries({}, optional={k: typed(v) for k, v in fields.items()})
    return mostly(
        known,
        st.builds(
            lambda a, b: {**a, **b},
            known,
            st.dictionaries(hostile_text(6), toml_values, min_size=1, max_size=1),
        ),
    )


def config_text(paths: list[str]) -> st.SearchStrategy[str]:
    """TOML text: well-formed documents and raw text (broken TOML is site input too)."""
    return st.one_of(
        config_doc(paths).map(toml_doc),
        config_doc(paths).map(toml_doc),
        hostile_text(60),
        st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
    )


# ------------------------------------------------------------------- OCI state, bundles

ANNOTATION_KEYS = (
    "org.jobns.job-id",
    "org.jobns.user",
    "org.jobns.shared-tmpdir",
    "org.jobns.no-rm-tmpdir",
)

ANNOTATION_VALUES = st.one_of(
    job_id_text(),
    user_spec(),
    st.sampled_from(["", "shared", "per-node", "local", "true", "false", "yes", "TRUE"]),
    hostile_text(12),
)
annotation_maps = st.dictionaries(
    st.one_of(st.sampled_from(ANNOTATION_KEYS), hostile_text(8)), ANNOTATION_VALUES, max_size=4
)
ids = st.one_of(
    st.integers(0, 70000),
    st.sampled_from([2**32 - 1, 2**32, -1, 2**63, 1.0, 0.5, True, None, "0"]),
    json_scalar,
)


def env_list() -> st.SearchStrategy[object]:
    entry = st.one_of(
        st.builds(
            lambda kv: f"{kv[0]}={kv[1]}",
            slurm_env().flatmap(
                lambda d: st.sampled_from(list(d.items())) if d else st.just(("A", "1"))
            ),
        ),
        st.sampled_from(
            [
                "PATH=/bin",
                "SLURM_JOB_ID=7",
                "SLURM_JOB_USER=root",
                "NOEQUALS",
                "=x",
                "SLURM_JOB_UID=0",
                "PMIX_RANK=\u00b2",
            ]
        ),
        hostile_text(12),
        json_scalar,
    )
    return mostly(st.lists(entry, max_size=5), json_values)


def mapping() -> st.SearchStrategy[object]:
    return mostly(
        st.fixed_dictionaries({"containerID": ids, "hostID": ids, "size": ids}), json_values
    )


def oci_config_doc() -> st.SearchStrategy[dict[str, object]]:
    """A bundle's config.json: mostly well-formed, with hostile values where jobns looks."""
    root = mostly(
        st.fixed_dictionaries(
            {
                "path": mostly(
                    st.sampled_from(["rootfs", "/srv/rootfs", "./rootfs/../x"]),
                    st.one_of(path_text(), json_scalar),
                )
            }
        ),
        json_values,
    )
    process = mostly(
        st.fixed_dictionaries(
            {},
            optional={
                "env": env_list(),
                "user": mostly(
                    st.fixed_dictionaries({}, optional={"uid": ids, "gid": ids}), json_values
                ),
            },
        ),
        json_values,
    )
    linux = mostly(
        st.fixed_dictionaries(
            {},
            optional={
                "namespaces": mostly(
                    st.lists(
                        st.sampled_from([{"type": "user"}, {"type": "mount"}, {}, "user"]),
                        max_size=3,
                    ),
                    json_values,
                ),
                "uidMappings": mostly(st.lists(mapping(), max_size=3), json_values),
                "gidMappings": mostly(st.lists(mapping(), max_size=3), json_values),
            },
        ),
        json_values,
    )
    mount = mostly(
        st.fixed_dictionaries(
            {
                "destination": st.one_of(
                    st.sampled_from(
                        ["/tmp", "/tmp/", "/tmp/.X11-unix", "/dev/shm", "/proc", "", "tmp"]
                    ),
                    path_text(),
                    json_scalar,
                )
            },
            optional={"type": st.just("bind"), "source": path_text()},
        ),
        json_values,
    )
    return st.fixed_dictionaries(
        {"ociVersion": st.just("1.0.2"), "root": root},
        optional={
            "process": process,
            "linux": linux,
            "annotations": mostly(annotation_maps, json_values),
            "mounts": mostly(st.lists(mount, max_size=4), json_values),
            "hooks": mostly(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "createRuntime": mostly(st.lists(json_values, max_size=2), json_values),
                        "poststop": json_values,
                    },
                ),
                json_values,
            ),
        },
    )


def state_doc(bundles: list[str]) -> st.SearchStrategy[object]:
    """The OCI state a runtime writes: real runtimes' shapes, with hostile values."""
    bundle = st.one_of(st.sampled_from(bundles), path_text(), hostile_text(12), json_scalar)
    known = st.fixed_dictionaries(
        {
            "ociVersion": mostly(st.sampled_from(["1.0.2", "1.0.0-rc1", "1.2.0"]), json_scalar),
            "id": mostly(st.one_of(job_id_text(), st.just("c1")), json_scalar),
            "status": mostly(
                st.sampled_from(["creating", "created", "running", "stopped", "paused"]),
                json_scalar,
            ),
        },
        optional={
            "pid": mostly(
                st.integers(0, 4194304),
                st.one_of(st.sampled_from([-1, 4194305, 1.0, 1.5, 2**64, True]), json_scalar),
            ),
            "bundle": bundle,
            "bundlePath": bundle,
            "annotations": mostly(annotation_maps, json_values),
            "root": json_values,
        },
    )
    return mostly(known, json_values, one_in=10)


def json_bytes(doc: object, how: int) -> bytes:
    """doc as a runtime might write it (escaped or raw UTF-8, compact or indented)."""
    if how == 0:
        return json.dumps(doc).encode()
    text = json.dumps(doc, ensure_ascii=False, indent=1 if how == 2 else None)
    return text.encode("utf-8", "surrogatepass")
