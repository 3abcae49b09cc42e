"""``#JOBNS`` job directives: parsing, capacities, symbol substitution, path confinement.

PURE: nothing here touches the file system, the environment (except
:meth:`Symbols.from_slurm_env` falling back to the current directory) or needs root, so
every rule below is unit-tested without privileges. The model is Slurm's burst buffer
directives (Slurm's burst_buffer.lua, ``#BB_LUA``), adapted to what jobns provides.

Grammar
-------
A batch script carries directives in its *header*: the lines after an optional shebang
up to (not including) the first line that is neither blank nor a comment. A directive
line starts in column 1 with ``#`` + the directive word (default ``JOBNS``, configurable
like burst_buffer.conf ``Directive=``) followed by whitespace or the end of the line.
Directives may be interleaved with ``#SBATCH`` lines and other comments. ``# JOBNS``
(with a space) is an ordinary comment, the usual way to switch a directive off.

The body is whitespace-separated tokens, a verb and then ``key=value`` options. A token
starting with ``#`` ends the directive (trailing comment), except ``#JOBNS`` (any case):
a second directive on one line is an error. Values cannot be quoted and so
cannot contain whitespace or quote characters. Verbs and keys are case-sensitive::

    #JOBNS                                   (no-op; marks the job as using jobns directives)
    #JOBNS shm capacity=2GiB                 size of the job's /dev/shm
    #JOBNS tmp capacity=10G                  size of the job's /tmp (and /var/tmp)
    #JOBNS shared_tmpdir                     layout 'shared' (also shared_tmpdir=yes)
    #JOBNS shared_tmpdir=per-node            layout 'per-node'; shared_tmpdir=no -> 'local'
    #JOBNS no_rm_tmpdir                      keep the job's directories after the job
    #JOBNS stage_in source=PATH destination=PATH
    #JOBNS stage_out source=PATH destination=PATH

Decisions where the specification was silent:

* Whatever the user wrote either means exactly what she wrote or rejects the job
  (:class:`DirectiveError`, one line naming the source, the line and the fix): a job
  that runs with something other than what she asked for, reported only in the
  prolog's log, which she never reads, is the worst outcome. So an unknown verb, an
  unknown key, a word that is not ``key=value`` (``capacity=2 GiB``: the ``GiB``), a
  space around ``=``, a second directive on one line (``... #JOBNS tmp ...``), a bad
  capacity, a missing ``source=``, a repeated key, a verb given twice with different
  values and a bad symbol all reject the job. (Slurm's burst-buffer plugin ignores
  unknown options; sbatch refuses them, and so does jobns: a newer directive on an
  older node must not silently do nothing.)
* ``#JOBNS`` lines after the header are not applied (as Slurm) but only warned about
  (``Directives.warnings``): the body of a script may legitimately hold such lines for
  another job (a here-document that writes a batch script). In the header, where only
  comments live, an indented directive or one whose word differs only in case rejects
  the job; after it they are warned about too.
* A trailing ``# comment`` ends a directive and is ignored: it is harmless.
* A directive line ending in ``\\r`` (DOS line breaks) is rejected: sbatch rejects such
  scripts too, and a ``\\r`` glued to a value would otherwise give a baffling error.
* ``--directives`` strings (like ``--bb``) and the job comment are split on newlines and
  ``;``, so there a path cannot contain ``;``. In a script ``;`` is an ordinary character.

Job comment
-----------
See :func:`comment_directives`. ``sbatch --comment 'jobns: shm capacity=2GiB'``: the
directives follow ``jobns:``, exactly so (lower case, the colon right after), at the
start of the comment or anywhere after a character that is not a letter, digit or
``_``; a later ``jobns:`` at the start of a token begins more directives (as a
``job_submit.lua`` rule that appends one). A comment without one is ordinary and ignored,
unless it was plainly meant for jobns: it starts with the word ``jobns`` in any case
(``jobns shm ...``, ``JOBNS: ...``), holds ``jobns`` + ``:`` in another spelling
(``Jobns:``, ``jobns :``), starts with ``#JOBNS`` in any case or holds it, spelt so,
anywhere (a script line pasted into the comment; ``#`` + the directive word): that rejects
the job with the spelling to use. Only the start counts for the bare word ``jobns``, which
must be followed there by a space, ``:``, ``=``, ``;`` or the end: ``testing jobns
today``, ``jobns-test``, ``jobns.sh``, ``myjobns: x`` and ``#jobns`` inside a sentence
are ordinary comments.

Capacities
----------
See :func:`parse_capacity`. Suffixes are exactly Slurm's burst-buffer spellings and are
case-sensitive (``2gib`` is an error that suggests ``GiB``, never a guess: ``kb`` could as
well mean kilobits). Decimals are allowed and rounded *up* to whole bytes.

Symbols
-------
See :func:`substitute`. ``\\\\`` (two backslash characters) stops symbol substitution for
the rest of the directive line. In Slurm (``_handle_replacement`` in
burst_buffer_common.c) the marker and *everything after it in the whole script* are
copied verbatim; the documentation says "the line". jobns does what the documentation
says: the rest of the line is kept verbatim, and values later on the same line are not
substituted either. Unlike Slurm, the two-backslash marker itself is dropped: Slurm hands
the text to a Lua script, jobns uses it as a path, where a literal ``\\\\`` is never meant.
Slurm silently drops unknown ``%X`` sequences (and reads past the end of the string for a
trailing ``%``); jobns rejects both.

Confinement
-----------
See :func:`confine`. Every substituted path is normalised lexically and must lie within
configured roots; ``..`` is refused outright, and substituted values must be single path
components (``%d`` an absolute path), so a job name such as ``../../etc`` cannot move a
path anywhere.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from jobns.launcher.system.errors import JobnsError, UserError

DEFAULT_WORD = "JOBNS"

# What starts the directives in a Slurm job comment (sbatch --comment 'jobns: ...').
COMMENT_PREFIX = "jobns:"

# Two backslash characters: burst_buffer.lua's "stop further processing of this line" marker.
STOP = "\\\\"

# Slurm's NO_VAL (0xfffffffe): the array task id Slurm substitutes for %a in a job that is
# not part of an array (sbatch --output=%a gives the same), kept so paths match Slurm's.
NO_ARRAY_TASK_ID = "4294967294"

# Largest accepted size: it must fit a signed 64-bit integer, which is what tmpfs size=,
# quotas and most C consumers of these numbers hold.
MAX_BYTES = 2**63 - 1

# Lengths from Linux: NAME_MAX 255 bytes per component, PATH_MAX 4096 including the NUL.
NAME_MAX = 255
PATH_MAX = 4095

_KIB = 1024
_SIZE_UNITS: dict[str, int] = {
    "K": _KIB, "KiB": _KIB,
    "M": _KIB**2, "MiB": _KIB**2,
    "G": _KIB**3, "GiB": _KIB**3,
    "T": _KIB**4, "TiB": _KIB**4,
    "P": _KIB**5, "PiB": _KIB**5,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
}  # fmt: skip
NODE_SUFFIX = "N"
_SUFFIX_BY_FOLDED = {s.lower(): s for s in (*_SIZE_UNITS, NODE_SUFFIX)}
# Digits, optionally one '.' and more digits, then letters: no sign, exponent or '_',
# all of which Python's number parsers would otherwise quietly accept.
_CAPACITY_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)")
_MAX_NUMBER_CHARS = 40  # bounds the arithmetic an attacker can make us do

_WORD_RE = re.compile(r"[A-Za-z0-9_]{1,64}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

LAYOUT_VALUES: dict[str | None, str] = {
    None: "shared",
    "yes": "shared",
    "per-node": "per-node",
    "no": "local",
}
VERBS = ("shm", "tmp", "shared_tmpdir", "no_rm_tmpdir", "stage_in", "stage_out")


class DirectiveError(JobnsError):
    """A directive, capacity or path that rejects the job.

    ``lineno`` is the 1-based line of the script (or item of a ``--directives`` string or
    job comment) and ``line`` its text; both are None for errors not tied to a line (e.g.
    from :func:`parse_capacity` or :func:`confine` called directly). ``origin`` names the
    source as the user wrote it: ``script``, ``--directives`` or ``--comment``.
    ``problem`` is the message without the location.
    """

    def __init__(
        self,
        problem: str,
        lineno: int | None = None,
        line: str | None = None,
        origin: str = "script",
    ) -> None:
        self.problem = problem
        self.lineno = lineno
        self.line = line
        self.origin = origin
        super().__init__(_locate(problem, lineno, line, origin))

    def at(self, lineno: int | None, line: str | None, origin: str) -> DirectiveError:
        """The same problem, located on a line."""
        return DirectiveError(self.problem, lineno, line, origin)


class CommentError(DirectiveError, UserError):
    """A job comment plainly meant for jobns that does not say ``jobns:``.

    Also a UserError: such a comment has no ``jobns:``, so a caller that tells a user's
    problem from the site's by looking for that prefix must still refuse only her job.
    """


def _locate(problem: str, lineno: int | None, line: str | None, origin: str) -> str:
    if line is None:
        return problem
    if lineno is None:
        where = origin
    else:
        where = f"script line {lineno}" if origin == "script" else f"{origin} item {lineno}"
    # repr() so control characters in a hostile script cannot reach a terminal or a log;
    # the problem is cut too: it may quote a word of the line (a 2 MiB verb), and the
    # message is one line of a log, of Slurm's job reason, of a pipe.
    return f"{where}: {_shown(line)!r}: {_cut_middle(problem)}"


MAX_PROBLEM = 400  # characters of a problem's text in a message


def _cut_middle(problem: str) -> str:
    """A long problem keeps its start and its end (what to do), not the middle of the
    word it quotes."""
    if len(problem) <= MAX_PROBLEM:
        return problem
    half = MAX_PROBLEM // 2
    return problem[:half] + "..." + problem[-half:]


def _shown(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


# --------------------------------------------------------------------------- capacities


@dataclass(frozen=True)
class NodeCount:
    """A capacity given with the ``N`` suffix: a number of nodes, not a size."""

    count: int


def parse_capacity(text: str) -> int | NodeCount:
    """A capacity as in Slurm's burst-buffer requests: bytes (an int) or a :class:`NodeCount`.

    ``NUMBER[SUFFIX]``: ``K|KiB M|MiB G|GiB T|TiB P|PiB`` are powers of 1024, ``KB MB GB TB
    PB`` powers of 1000, ``N`` nodes; no suffix means bytes. Suffixes are case-sensitive.
    NUMBER is digits with an optional decimal fraction (``1.5GiB``); a size is rounded up
    to whole bytes, a node count must be whole. Zero, signs, exponents and results above
    :data:`MAX_BYTES` are errors.
    """
    match = _CAPACITY_RE.fullmatch(text)
    if match is None:
        raise DirectiveError(
            f"capacity {text!r} is not a number with an optional suffix; "
            "give e.g. capacity=10GiB or capacity=500MB"
        )
    number, suffix = match.groups()
    if len(number) > _MAX_NUMBER_CHARS:
        raise DirectiveError(
            f"capacity {text[:20]!r}... has too many digits; use a larger suffix such as GiB or TiB"
        )
    amount = Fraction(number)
    if suffix == NODE_SUFFIX:
        return _node_count(text, amount)
    return _bytes(text, amount, _size_unit(text, suffix))


def _size_unit(text: str, suffix: str) -> int:
    if not suffix:
        return 1
    unit = _SIZE_UNITS.get(suffix)
    if unit is not None:
        return unit
    folded = _SUFFIX_BY_FOLDED.get(suffix.lower())
    hint = (
        f"suffixes are case-sensitive: did you mean {folded!r}?"
        if folded
        else "use K|KiB M|MiB G|GiB T|TiB P|PiB (1024), KB MB GB TB PB (1000), N (nodes), "
        "or no suffix for bytes"
    )
    raise DirectiveError(f"capacity {text!r} has an unknown suffix {suffix!r}; {hint}")


def _node_count(text: str, amount: Fraction) -> NodeCount:
    if amount.denominator != 1:
        raise DirectiveError(
            f"capacity {text!r}: a node count must be a whole number, e.g. capacity=2N"
        )
    if amount <= 0:
        raise DirectiveError(f"capacity {text!r}: a node count must be at least 1")
    if amount > MAX_BYTES:
        raise DirectiveError(f"capacity {text!r}: node count too large; give at most {MAX_BYTES}N")
    return NodeCount(int(amount))


def _bytes(text: str, amount: Fraction, unit: int) -> int:
    if amount <= 0:
        raise DirectiveError(
            f"capacity {text!r} must be greater than zero; give a size such as capacity=10GiB"
        )
    size = math.ceil(amount * unit)
    if size > MAX_BYTES:
        raise DirectiveError(
            f"capacity {text!r} is {size} bytes, more than the maximum "
            f"{MAX_BYTES} (2**63-1); ask for less"
        )
    return size


def round_up(size: int, granularity: int) -> int:
    """size rounded up to the next multiple of granularity (a burst-buffer pool's granularity).

    A request below the granularity becomes one granule; a multiple is unchanged.
    """
    if granularity < 1:
        raise JobnsError(
            f"granularity {granularity} must be a whole number of bytes >= 1; "
            "fix the jobns configuration"
        )
    if size < 1:
        raise DirectiveError(f"size {size} must be greater than zero")
    rounded = -(-size // granularity) * granularity
    if rounded > MAX_BYTES:
        raise DirectiveError(
            f"size {size} rounded up to granularity {granularity} is "
            f"{rounded} bytes, more than the maximum {MAX_BYTES}"
        )
    return rounded


# ------------------------------------------------------------------------------ symbols


@dataclass(frozen=True)
class Symbols:
    """The values ``%j %A %a %d %u %x`` stand for. None means unknown: substituting a
    symbol whose value is unknown is an error naming the missing variable, but a path
    that does not use it is fine."""

    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    workdir: str | None = None
    user: str | None = None
    job_name: str | None = None

    @classmethod
    def from_slurm_env(cls, environ: Mapping[str, str], cwd: str | None = None) -> Symbols:
        """Symbols from the variables Slurm gives a prolog, task or batch script.

        ``%d`` is the job's working directory: SLURM_JOB_WORK_DIR (prolog/epilog), else
        SLURM_SUBMIT_DIR, else ``cwd`` (default: the current directory), the order that
        gets closest to Slurm's own ``job_ptr->details->work_dir``.
        """
        workdir = environ.get("SLURM_JOB_WORK_DIR") or environ.get("SLURM_SUBMIT_DIR")
        if not workdir:
            workdir = cwd if cwd is not None else os.getcwd()
        return cls(
            job_id=_numeric_env(environ, "SLURM_JOB_ID"),
            array_job_id=_numeric_env(environ, "SLURM_ARRAY_JOB_ID"),
            array_task_id=_numeric_env(environ, "SLURM_ARRAY_TASK_ID"),
            workdir=workdir,
            user=environ.get("SLURM_JOB_USER") or None,
            job_name=environ.get("SLURM_JOB_NAME"),
        )


def _numeric_env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if not value:
        return None
    if not (value.isascii() and value.isdigit()):
        raise DirectiveError(f"{name}={value!r} is not a number; is this a Slurm job?")
    return value


def _array_job_id(s: Symbols) -> str | None:
    # As sbatch's output file names (expand_stdio_fields): the job id outside an array.
    # Slurm's burst buffer code gives 0 there, which would make every non-array job of
    # every user share one path.
    return s.array_job_id or s.job_id


def _array_task_id(s: Symbols) -> str | None:
    return s.array_task_id if s.array_task_id is not None else NO_ARRAY_TASK_ID


# symbol letter -> (getter, what it is, how to get it)
_SYMBOLS: dict[str, tuple[Callable[[Symbols], str | None], str, str]] = {
    "j": (lambda s: s.job_id, "job id", "set SLURM_JOB_ID"),
    "A": (_array_job_id, "array master job id", "set SLURM_JOB_ID or SLURM_ARRAY_JOB_ID"),
    "a": (_array_task_id, "array task id", "set SLURM_ARRAY_TASK_ID"),
    "u": (lambda s: s.user, "user name", "set SLURM_JOB_USER"),
    "x": (lambda s: s.job_name, "job name", "set the job name with --job-name"),
    "d": (lambda s: s.workdir, "working directory", "set SLURM_SUBMIT_DIR or --chdir"),
}


def substitute(path: str, symbols: Symbols) -> str:
    """path with Slurm's filename symbols replaced, in one left-to-right pass.

    ``%%`` -> ``%``, ``%A`` array master job id (the job id outside an array), ``%a`` array
    task id (``4294967294``, Slurm's NO_VAL, outside an array), ``%d`` working directory,
    ``%j`` job id, ``%u`` user name, ``%x`` job name. Replacements are never re-scanned,
    so ``%%j`` gives a literal ``%j`` and a job named ``%u`` stays ``%u``. A ``\\\\`` (two
    backslashes) ends substitution: it is dropped and the rest is copied verbatim. Any
    other ``%X`` and a ``%`` at the end are errors, as are symbol values that are not a
    single harmless path component (``%d``: an absolute path without ``..``).
    """
    out: list[str] = []
    i = 0
    while i < len(path):
        if path.startswith(STOP, i):
            out.append(path[i + len(STOP) :])
            break
        if path[i] != "%":
            out.append(path[i])
            i += 1
            continue
        out.append(_expand(path, i, symbols))
        i += 2
    return "".join(out)


def _expand(path: str, i: int, symbols: Symbols) -> str:
    if i + 1 >= len(path):
        raise DirectiveError(f"path {path!r} ends with a lone '%'; write '%%' for a literal %")
    letter = path[i + 1]
    if letter == "%":
        return "%"
    entry = _SYMBOLS.get(letter)
    if entry is None:
        # The letter is the user's and may be a control character: never shown raw.
        shown = f"'%{letter}'" if letter.isprintable() else repr("%" + letter)
        raise DirectiveError(
            f"path {path!r} uses unknown symbol {shown}; known symbols "
            "are %% %A %a %d %j %u %x, write '%%' for a literal %"
        )
    getter, what, fix = entry
    value = getter(symbols)
    if value is None:
        raise DirectiveError(
            f"path {path!r} uses %{letter} but the {what} is not known; "
            f"{fix} or do not use %{letter}"
        )
    if letter == "d":
        return _checked_workdir(value)
    return _checked_component(value, letter, what)


def _checked_component(value: str, letter: str, what: str) -> str:
    # A symbol stands for one path component: a '/' or '..' in a job name must not be
    # able to move the path (a job name is whatever the submitter typed).
    problem = _component_problem(value)
    if problem:
        raise DirectiveError(
            f"the {what} {value!r} cannot be substituted for %{letter}: "
            f"{problem}; change it or do not use %{letter}"
        )
    return value


def _component_problem(value: str) -> str | None:
    if value in ("", ".", ".."):
        return "it is empty, '.' or '..'"
    if "/" in value:
        return "it contains '/'"
    if _CONTROL_RE.search(value):
        return "it contains control characters"
    if _unencodable(value):
        return "it is not valid text (a lone UTF-16 surrogate)"
    if len(_encode(value)) > NAME_MAX:
        return f"it is longer than {NAME_MAX} bytes"
    return None


def _checked_workdir(value: str) -> str:
    try:
        return normalise(value)
    except DirectiveError as err:
        raise DirectiveError(
            f"the working directory cannot be substituted for %d: {err.problem}"
        ) from None


def _encode(text: str) -> bytes:
    # surrogateescape: a str that came from undecodable bytes (os.fsdecode) still counts.
    return text.encode("utf-8", "surrogateescape")


def _unencodable(text: str) -> bool:
    """True if text has a surrogate that no file name can hold (only the ones
    os.fsdecode makes from undecodable bytes, U+DC80..U+DCFF, stand for bytes)."""
    try:
        _encode(text)
    except UnicodeEncodeError:
        return True
    return False


# -------------------------------------------------------------------------- confinement


def normalise(path: str) -> str:
    """path made canonical lexically: absolute, single slashes, no ``.``, no trailing '/'.

    Refuses rather than resolves ``..``: with symlinks on the way, the lexical parent is
    not the real one, so no lexical rule for ``..`` is safe. Refuses control characters
    (NUL above all: the kernel would cut the path there) and over-long paths.
    """
    if _CONTROL_RE.search(path):
        raise DirectiveError(
            f"path {path!r} contains a NUL or control character; remove "
            "it (check the job name, user name and working directory)"
        )
    if _unencodable(path):
        raise DirectiveError(
            f"path {path!r} is not valid text (a lone UTF-16 surrogate); "
            "remove it (check the job name, user name and working directory)"
        )
    if not path.startswith("/"):
        raise DirectiveError(
            f"path {path!r} is relative; give an absolute path (starting with / or %d)"
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise DirectiveError(f"path {path!r} contains '..'; give a path without '..'")
    for part in parts:
        if len(_encode(part)) > NAME_MAX:
            raise DirectiveError(
                f"path {path!r} has a component longer than {NAME_MAX} bytes; shorten it"
            )
    result = "/" + "/".join(parts)
    if len(_encode(result)) > PATH_MAX:
        raise DirectiveError(f"path {path[:60]!r}... is longer than {PATH_MAX} bytes; shorten it")
    return result


def confine(path: str, allowed_roots: Iterable[str]) -> str:
    """The normalised path if it is one of allowed_roots or lies below one; else an error.

    Purely lexical (see :func:`normalise`): it cannot see symlinks *inside* a root, so
    whoever opens the result must still walk it without following symlinks (fs.py).
    """
    roots = [normalise(root) for root in allowed_roots]
    if not roots:
        raise DirectiveError(
            f"path {path!r} is not allowed: no directories are configured "
            "for staging; ask the administrator"
        )
    normal = normalise(path)
    for root in roots:
        if root == "/" or normal == root or normal.startswith(root + "/"):
            return normal
    raise DirectiveError(
        f"path {path!r} is outside the allowed directories "
        f"({', '.join(roots)}); use a path below one of them"
    )


def resolve_path(raw: str, symbols: Symbols, allowed_roots: Iterable[str]) -> str:
    """confine(substitute(raw, symbols), allowed_roots)."""
    return confine(substitute(raw, symbols), allowed_roots)


# ---------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Stage:
    """One stage_in/stage_out request. ``source`` and ``destination`` are unsubstituted,
    ready for :func:`substitute`: a value that followed a ``\\\\`` on its line carries a
    leading ``\\\\`` so that substitution leaves it verbatim, as the line rule says."""

    source: str
    destination: str
    lineno: int
    line: str
    origin: str = "script"

    def resolve(
        self, symbols: Symbols, source_roots: Iterable[str], destination_roots: Iterable[str]
    ) -> tuple[str, str]:
        """(source, destination) substituted and confined; errors name this line."""
        try:
            return (
                resolve_path(self.source, symbols, source_roots),
                resolve_path(self.destination, symbols, destination_roots),
            )
        except DirectiveError as err:
            raise err.at(self.lineno, self.line, self.origin) from None


@dataclass
class Directives:
    """What a script's (or a --directives string's) directives ask for.

    Capacities are bytes after granularity rounding; ``layout`` is 'shared', 'per-node',
    'local' (``shared_tmpdir=no``) or None (not given). ``present`` is True if there was
    any directive line, even a bare ``#JOBNS``.
    """

    present: bool = False
    shm_capacity: int | None = None
    tmp_capacity: int | None = None
    layout: str | None = None
    no_rm_tmpdir: bool = False
    stage_in: list[Stage] = field(default_factory=list)
    stage_out: list[Stage] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------ parsing


def check_word(word: str) -> str:
    """word if it can be a directive word (burst_buffer.conf ``Directive=`` style)."""
    if word.startswith("#"):
        raise JobnsError(f"directive word {word!r}: give it without the leading '#'")
    if not _WORD_RE.fullmatch(word):
        raise JobnsError(f"directive word {word!r} must be 1-64 letters, digits or '_'")
    return word


def parse_script(text: str, word: str = DEFAULT_WORD, granularity: int = 1) -> Directives:
    """The directives in a batch script's header (see the module docstring)."""
    prefix = "#" + check_word(word)
    result = Directives()
    in_header = True
    for lineno, line in enumerate(text.split("\n"), start=1):
        in_header = in_header and _is_header_line(line)
        body = _directive_body(line, prefix)
        if body is None:
            _near_miss(result, lineno, line, prefix, in_header)
        elif not in_header:
            result.warnings.append(
                _locate(
                    "directive after the first command is ignored; move it to the top",
                    lineno,
                    line,
                    "script",
                )
            )
        else:
            _check_line_end(line, lineno, line, "script")
            _apply_line(result, body, lineno, line, "script", granularity, prefix)
    return result


def parse_directives(
    text: str, word: str = DEFAULT_WORD, granularity: int = 1, source: str = "--directives"
) -> Directives:
    """Directives from a ``--directives`` string (like Slurm's ``--bb``) or a job comment.

    Items are separated by newlines or ``;``; each may start with ``#WORD`` or not. Blank
    items are skipped. Item numbers in errors count from 1 over all items, blank or not.
    ``source`` names where the user wrote text in errors and warnings: ``--directives``,
    or ``--comment`` for the text :func:`comment_directives` returns.
    """
    prefix = "#" + check_word(word)
    result = Directives()
    for lineno, item in enumerate(re.split(r"[\n;]", text), start=1):
        shown = item.strip()
        if not shown:
            continue
        _check_line_end(item, lineno, shown, source)
        body = _directive_body(shown, prefix)
        if body is None and shown.startswith("#"):
            raise DirectiveError(
                f"not a {prefix} directive; write it without a leading '#' or as '{prefix} ...'",
                lineno,
                shown,
                source,
            )
        _apply_line(
            result, shown if body is None else body, lineno, shown, source, granularity, prefix
        )
    return result


def comment_directives(comment: str, word: str = DEFAULT_WORD) -> str | None:
    """The directive text of a Slurm job comment, for ``parse_directives(text, source=
    "--comment")``; None for an ordinary comment. See "Job comment" in the module docstring.

    A :class:`CommentError` (a UserError) for a comment plainly meant for jobns that does
    not say ``jobns:``. Text after each further ``jobns:`` that starts a token is joined
    with ``;``: a comment ``jobns: shm capacity=1GiB jobns: tmp capacity=2GiB`` (a
    ``job_submit.lua`` rule appended the second) holds two directives.
    """
    prefix = "#" + check_word(word)
    first = _FIRST_PREFIX_RE.search(comment)
    before = comment if first is None else comment[: first.start()]
    _refuse_near_misses(comment, before, prefix)
    if first is None:
        return None
    return ";".join(_NEXT_PREFIX_RE.split(comment[first.end() :]))


# The comment prefix: exactly 'jobns:', not glued to a word before it ('myjobns:' is not).
_FIRST_PREFIX_RE = re.compile(r"(?<![A-Za-z0-9_])jobns:")
# After the first, directive text is split into tokens: a further prefix starts a token.
_NEXT_PREFIX_RE = re.compile(r"(?:^|(?<=[\s;]))jobns:")


def _any_case(word: str) -> str:
    # ASCII case only: re.IGNORECASE would also let e.g. U+017F (long s) match 's'.
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


# A comment that starts with the word 'jobns' (any case) is meant for jobns.
_START_WORD_RE = re.compile(r"\s*(" + _any_case("jobns") + r"(?:[ \t]*[:=;]|(?=\s|$)))")
# 'jobns' + ':' spelt otherwise: 'JOBNS:', 'Jobns :'.
_NEAR_PREFIX_RE = re.compile(r"(?<![A-Za-z0-9_])" + _any_case("jobns") + r"[ \t]*:")
_EXAMPLE = "jobns: shm capacity=2GiB"


def _refuse_near_misses(comment: str, before: str, prefix: str) -> None:
    """A CommentError if the part of the comment before any 'jobns:' was meant for jobns."""
    start = _START_WORD_RE.match(before)
    spans = [start.span(1)] if start else []
    spans += [m.span() for m in _NEAR_PREFIX_RE.finditer(before)]
    if spans:
        begin, end = min(spans)
        rest = comment[end:].strip()
        fixed = f"{comment[:begin].lstrip()}jobns: {rest}" if rest else _EXAMPLE
        raise CommentError(
            "this looks meant for jobns, but directives follow 'jobns:' exactly (lower "
            f"case, the colon right after); write --comment {_shown(fixed)!r}",
            line=comment.strip(),
            origin="--comment",
        )
    # A pasted script line: '#JOBNS' as a word, in any case at the start (where a hashtag
    # is no sentence yet), spelt exactly as the directive word anywhere else.
    exact = r"(?<![A-Za-z0-9_])" + re.escape(prefix) + r"(?=$|[\s;])[ \t]*"
    folded = r"(?<![A-Za-z0-9_])" + _any_case(prefix) + r"(?=$|[\s;])[ \t]*"
    found = re.match(r"\s*" + folded, before) or re.search(exact, before)
    if found:
        # The fix: the first such word becomes 'jobns:', any later one a ';'.
        head, tail = before[: found.start()].lstrip(), before[found.end() :]
        tail = re.sub(folded, "; ", tail) + comment[len(before) :]
        fixed = f"{head}jobns: {tail.strip()}" if tail.strip() else _EXAMPLE
        raise CommentError(
            f"a job comment takes directives after 'jobns:', not as {prefix} lines; "
            f"write --comment {_shown(fixed)!r}",
            line=comment.strip(),
            origin="--comment",
        )


def script_header(text: str) -> str:
    """The header of a batch script (its lines up to the first command), where its
    directives are: what the burst buffer hands the prolog, so that parse_script finds the
    same directives on the same line numbers."""
    lines = text.split("\n")
    end = 0
    while end < len(lines) and _is_header_line(lines[end]):
        end += 1
    return "\n".join(lines[:end])


def _is_header_line(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _directive_body(line: str, prefix: str) -> str | None:
    """The text after ``#WORD`` if line is a directive line, else None."""
    if not line.startswith(prefix):
        return None
    rest = line[len(prefix) :]
    if rest and not rest[0].isspace():
        return None  # '#JOBNSX' is some other directive word
    return rest


def _check_line_end(raw: str, lineno: int, line: str, origin: str) -> None:
    if raw.endswith("\r"):
        fix = "convert the script with dos2unix" if origin == "script" else "remove the '\\r'"
        raise DirectiveError(f"DOS line break (\\r\\n); {fix}", lineno, line, origin)


def _near_miss(result: Directives, lineno: int, line: str, prefix: str, in_header: bool) -> None:
    """An indented directive or one whose word differs only in case: it rejects the job
    in the header (where nothing but comments lives, it can only be meant as one) and is
    warned about after it (as any directive there)."""
    stripped = line.lstrip()
    head = stripped[: len(prefix)]
    after = stripped[len(prefix) : len(prefix) + 1]
    if head.lower() != prefix.lower() or (after and not after.isspace()):
        return
    if len(stripped) != len(line) and head == prefix:
        problem = "indented directive is {}; start it in column 1"
    elif head != prefix:
        problem = f"directive word is case-sensitive; this line is {{}}, write {prefix}"
    else:
        return
    if in_header:
        raise DirectiveError(problem.format("not applied"), lineno, line, "script")
    problem = problem.format("ignored") + " (and move it above the first command)"
    result.warnings.append(_locate(problem, lineno, line, "script"))


@dataclass(frozen=True)
class _Option:
    key: str
    value: str | None  # None: a bare word without '='
    verbatim: bool  # a STOP marker appeared earlier on the line


def _tokens(body: str, prefix: str, origin: str) -> list[str]:
    words = body.split()
    for i, token in enumerate(words):
        if token.lower() == prefix.lower():
            # Not a comment: a second directive, which would silently do nothing.
            raise DirectiveError(
                f"a second {prefix} directive inside this one is not applied; {_apart(origin)}"
            )
        if token.startswith("#"):
            return words[:i]  # trailing comment
    return words


def _apart(origin: str) -> str:
    if origin == "script":
        return "put each directive on a line of its own"
    return "separate directives with ';'"


def _options(words: list[str]) -> Iterator[_Option]:
    stopped = False
    for token in words:
        if '"' in token or "'" in token:
            raise DirectiveError(
                "quoting is not supported: values cannot contain quotes or whitespace"
            )
        key, eq, value = token.partition("=")
        yield _Option(key, value if eq else None, stopped)
        stopped = stopped or STOP in token


def _apply_line(
    result: Directives,
    body: str,
    lineno: int,
    line: str,
    origin: str,
    granularity: int,
    prefix: str,
) -> None:
    try:
        result.present = True
        words = _tokens(body, prefix, origin)
        _check_spaced_equals(words)
        options = list(_options(words))
        if options:
            _apply(result, options[0], options[1:], lineno, line, origin, granularity)
    except DirectiveError as err:
        raise err.at(lineno, line, origin) from None


def _apply(
    result: Directives,
    verb: _Option,
    options: list[_Option],
    lineno: int,
    line: str,
    origin: str,
    granularity: int,
) -> None:
    if verb.key not in VERBS:
        raise DirectiveError(_unknown_verb(verb.key))
    if verb.value is not None and verb.key != "shared_tmpdir":
        raise DirectiveError(f"{verb.key} takes no '=value'; see '#JOBNS {_USAGE[verb.key]}'")
    known = _KEYS[verb.key]
    _check_words(verb, options, known, origin)
    values = _collect(options, known, verb.key)
    if verb.key in ("shm", "tmp"):
        _set_capacity(result, verb.key, values, granularity)
    elif verb.key == "shared_tmpdir":
        _set_layout(result, verb.value)
    elif verb.key == "no_rm_tmpdir":
        result.no_rm_tmpdir = True
    else:
        stage = _stage(values, verb.key, lineno, line, origin)
        (result.stage_in if verb.key == "stage_in" else result.stage_out).append(stage)


_KEYS: dict[str, tuple[str, ...]] = {
    "shm": ("capacity",),
    "tmp": ("capacity",),
    "shared_tmpdir": (),
    "no_rm_tmpdir": (),
    "stage_in": ("source", "destination"),
    "stage_out": ("source", "destination"),
}
_USAGE = {
    "shm": "shm capacity=SIZE",
    "tmp": "tmp capacity=SIZE",
    "shared_tmpdir": "shared_tmpdir[=yes|per-node|no]",
    "no_rm_tmpdir": "no_rm_tmpdir",
    "stage_in": "stage_in source=PATH destination=PATH",
    "stage_out": "stage_out source=PATH destination=PATH",
}
# Words that take '=VALUE': a space around their '=' is refused with the joined spelling.
_VALUED = frozenset({"shared_tmpdir", *(key for keys in _KEYS.values() for key in keys)})


def _unknown_verb(verb: str) -> str:
    folded = [v for v in VERBS if v == verb.lower()]
    if folded:
        hint = f" (directives are case-sensitive: did you mean {folded[0]!r}?)"
    elif verb.lower().startswith(COMMENT_PREFIX):
        hint = f" ({COMMENT_PREFIX!r} goes once, at the start of a job comment)"
    else:
        hint = ""
    return f"unknown directive {verb!r}{hint}; known: {', '.join(VERBS)}"


def _check_spaced_equals(words: list[str]) -> None:
    """Refuse 'capacity= 2GiB', 'capacity =2GiB' and 'capacity = 2GiB': each would
    otherwise read as a key without a value plus a stray word."""
    for i, token in enumerate(words):
        key, eq, value = token.partition("=")
        if key not in _VALUED:
            continue
        following = words[i + 1 : i + 3]
        if eq and not value and following and "=" not in following[0]:
            parts = [token, following[0]]
        elif not eq and following and following[0].startswith("="):
            spaced = following[0] == "=" and len(following) > 1 and "=" not in following[1]
            parts = [token, *following] if spaced else [token, following[0]]
        else:
            continue
        raise DirectiveError(
            f"{' '.join(parts)!r} has a space around '='; write {''.join(parts)!r}"
        )


def _check_words(
    verb: _Option, options: list[_Option], known: tuple[str, ...], origin: str
) -> None:
    """Refuse every word after the verb that is not one of its keys: each would make the
    job run otherwise than its user wrote (the 'GiB' of 'capacity=2 GiB' gave 2 bytes)."""
    usage = f"write '#JOBNS {_USAGE[verb.key]}'"
    previous: _Option | None = None
    for option in options:
        if option.key in known or (option.value is None and option.key == STOP):
            pass  # a lone marker only stops substitution, as it does glued to a value
        elif option.value is None:
            raise DirectiveError(_stray_word(verb, previous, option.key, usage, origin))
        elif not option.key:
            raise DirectiveError(f"{'=' + option.value!r} has no key before '='; {usage}")
        else:
            folded = [key for key in known if key == option.key.lower()]
            hint = f" (keys are case-sensitive: did you mean {folded[0]!r}?)" if folded else ""
            what = usage if known else f"{verb.key} takes no options"
            raise DirectiveError(f"unknown key {option.key!r} for {verb.key}{hint}; {what}")
        previous = option


def _stray_word(verb: _Option, previous: _Option | None, word: str, usage: str, origin: str) -> str:
    if word in VERBS:
        return f"{word!r} starts another directive; {_apart(origin)}"
    if previous is not None and previous.value and previous.key == "capacity":
        joined = _joined_capacity(previous.value + word)
        if joined is not None:
            return (
                f"capacity {previous.value + ' ' + word!r} has a space inside; "
                f"write {'capacity=' + joined!r}"
            )
    if previous is not None and previous.value and previous.key in ("source", "destination"):
        return (
            f"unexpected word {word!r} after {previous.key}=: a path cannot contain spaces; {usage}"
        )
    if verb.key == "shared_tmpdir" and verb.value is None and word in LAYOUT_VALUES:
        return f"unexpected word {word!r}; write {'shared_tmpdir=' + word!r}"
    return f"unexpected word {word!r}; {usage}"


def _joined_capacity(text: str) -> str | None:
    """text with its suffix spelt right, if it is a capacity once its spaces are gone."""
    match = _CAPACITY_RE.fullmatch(text)
    if match is None:
        return None
    number, suffix = match.groups()
    if not suffix:
        return number
    canonical = _SUFFIX_BY_FOLDED.get(suffix.lower())
    return number + canonical if canonical else None


def _collect(options: list[_Option], known: tuple[str, ...], verb: str) -> dict[str, _Option]:
    """The known options by key; all of them required, none twice, each with a value."""
    values: dict[str, _Option] = {}
    for option in options:
        if option.key not in known:
            continue
        if option.key in values:
            raise DirectiveError(f"{option.key}= is given twice; give it once")
        if not option.value:
            raise DirectiveError(f"{option.key} needs a value; write '#JOBNS {_USAGE[verb]}'")
        values[option.key] = option
    missing = [key for key in known if key not in values]
    if missing:
        raise DirectiveError(
            f"{verb} needs {'= and '.join(missing)}=; write '#JOBNS {_USAGE[verb]}'"
        )
    return values


def _set_capacity(
    result: Directives, verb: str, values: dict[str, _Option], granularity: int
) -> None:
    text = values["capacity"].value or ""
    capacity = parse_capacity(text)
    if isinstance(capacity, NodeCount):
        raise DirectiveError(
            f"capacity {text!r} is a node count; {verb} needs a size, e.g. capacity=2GiB"
        )
    size = round_up(capacity, granularity)
    previous = result.shm_capacity if verb == "shm" else result.tmp_capacity
    if previous is not None and previous != size:
        raise DirectiveError(f"{verb} capacity is given twice with different values; keep one line")
    if verb == "shm":
        result.shm_capacity = size
    else:
        result.tmp_capacity = size


def _set_layout(result: Directives, value: str | None) -> None:
    layout = LAYOUT_VALUES.get(value)
    if layout is None:
        raise DirectiveError(
            f"shared_tmpdir={value!r} is not one of yes, per-node, no; "
            f"write '#JOBNS {_USAGE['shared_tmpdir']}'"
        )
    if result.layout is not None and result.layout != layout:
        raise DirectiveError(
            f"shared_tmpdir contradicts an earlier shared_tmpdir ({result.layout!r}); keep one line"
        )
    result.layout = layout


# Stand-ins used only to check a stage path's shape when the job's values are not known.
_PLACEHOLDERS = Symbols(
    job_id="1", array_job_id="1", array_task_id="1", workdir="/workdir", user="user", job_name="job"
)


def _stage(values: dict[str, _Option], verb: str, lineno: int, line: str, origin: str) -> Stage:
    source, destination = (_stage_path(values[key], key) for key in ("source", "destination"))
    return Stage(source, destination, lineno, line, origin)


def _stage_path(option: _Option, key: str) -> str:
    raw = option.value or ""
    if option.verbatim:
        raw = STOP + raw
    # Reject at submission what would fail at stage time whatever the job's values are:
    # bad symbols, relative paths, '..' and control characters in the literal text.
    try:
        normalise(substitute(raw, _PLACEHOLDERS))
    except DirectiveError as err:
        raise DirectiveError(f"{key}=: {err.problem}") from None
    return raw
