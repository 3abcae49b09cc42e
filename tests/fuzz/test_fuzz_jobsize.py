"""Fuzz what `[capacity] tmp_from_slurm` reads from Slurm (no root; issue 20): the answer
of squeue (launcher.model.jobsize.parse_squeue, tmp_bytes) and, through a stand-in squeue
program, slurm_tmp as setup calls it. Inputs: squeue rows with hostile ids and sizes,
scontrol's one-line format and squeue/scontrol JSON with hostile job names, comments and
numbers (what an older parser read, and what a future release might print), and noise.

The contract: a size in bytes between 1 and what Slurm can hold (MAX_TMP), or None
("no request": then at most one clean warning line), or a UserError; nothing else, never
an exception. A well-formed answer is read exactly, whatever rows of other jobs say."""

from __future__ import annotations

import contextlib
import io
import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.model import jobsize
from jobns.launcher.system import sysprog
from jobns.launcher.system.errors import JobnsError, UserError
from tests.fuzz.conftest import FuzzBox
from tests.fuzz.support import (
    NUMBERS,
    capacity_text,
    check_message,
    fuzz,
    hostile_text,
    json_values,
    tried,
)

NUMERIC_IDS = st.one_of(
    st.sampled_from(["7", "6", "0", "4294967295"]), st.integers(0, 2**32 - 1).map(str)
)
IDS = st.one_of(
    st.sampled_from(["7", "6_2", "123456", "4294967295", "0"]),
    st.integers(0, 2**32 - 1).map(str),
    st.builds(lambda a, b: f"{a}_{b}", st.integers(0, 10**6), st.integers(0, 10**4)),
)
FORGED = st.one_of(
    st.sampled_from(["inf", "nan", "-inf", "1e30", "900G", "9P", "-1", "0x10", "1_0", ""]),
    capacity_text(),
    NUMBERS,
)


def slurm_size() -> st.SearchStrategy[tuple[str, int | None]]:
    """What Slurm may print for MIN_TMP_DISK (a uint32 of MiB, converted up from M),
    with its value in bytes (None: no request): 0, N, NM, N.NNU (squeue without
    --noconvert rounds to two decimals)."""

    def build(mib: int, unit: str, decimals: int) -> tuple[str, int]:
        scale = jobsize.UNITS[unit or "M"]
        value = Fraction(mib * jobsize.UNITS["M"], scale)
        shown = f"{float(value):.{decimals}f}" if decimals else str(int(value))
        whole, _, frac = shown.partition(".")
        return f"{shown}{unit}", int(whole) * scale + int(frac.ljust(2, "0")) * scale // 100

    return (
        st.builds(
            build,
            st.integers(0, jobsize.MAX_TMP_MIB),
            st.sampled_from(["", "M", "G", "T", "P"]),
            st.sampled_from([0, 0, 1, 2]),
        )
        .filter(lambda t: t[1] <= jobsize.MAX_TMP)  # "%.2f" may round past the top
        .map(lambda t: (t[0], t[1] or None))
    )


def scontrol_line(job: str, name: str, comment: str, tmp: str) -> str:
    return (
        f"JobId={job} JobName={name} UserId=bob(1002) JobState=PENDING "
        f"MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode={tmp} Features=(null) "
        f"WorkDir=/home/{name} Comment={comment} StdOut=/home/{name}/slurm-{job}.out"
    )


def json_answer(job: str, name: str, comment: str, tmp: object, extra: object) -> str:
    return json.dumps(
        {
            "jobs": [
                {
                    "job_id": job,
                    "name": name,
                    "comment": comment,
                    "minimum_tmp_disk_per_node": tmp,
                    "extra": extra,
                }
            ]
        }
    )


def row(job: str, array_id: str, size: str) -> str:
    return f"{job} {array_id} {size}"


def answer_text() -> st.SearchStrategy[str]:
    """Anything squeue (or a misconfigured one, or scontrol) could print."""
    line = st.one_of(
        st.builds(row, IDS, st.one_of(IDS, hostile_text(10)), st.one_of(FORGED, hostile_text(8))),
        st.builds(row, IDS, IDS, slurm_size().map(lambda t: t[0])),
        st.builds(scontrol_line, IDS, hostile_text(20), hostile_text(20), FORGED),
        st.builds(
            json_answer,
            IDS,
            hostile_text(20),
            hostile_text(20),
            st.one_of(FORGED, st.integers(-(2**70), 2**70), json_values),
            json_values,
        ),
        hostile_text(40),
    )
    sep = st.sampled_from(["\n", "\r\n", "\r", " ", "", "\x00", "\u2028"])
    return st.builds(
        lambda lines, s, end: s.join(lines) + end, st.lists(line, max_size=6), sep, sep
    )


def check(got: object) -> None:
    """The parser's contract (see the module docstring)."""
    if isinstance(got, JobnsError):
        assert isinstance(got, UserError), f"{type(got).__name__} is not UserError: {got}"
        return
    assert isinstance(got, tuple) and len(got) == 2, got
    size, problem = got
    assert isinstance(problem, str)
    if size is None:
        if problem:
            check_message(problem)
    else:
        assert type(size) is int and 1 <= size <= jobsize.MAX_TMP, size
        assert problem == "", problem


def parsed(f: object, *args: object) -> object:
    """f(*args), or the JobnsError it raised; any other exception fails the property."""
    assert callable(f)
    try:
        return f(*args)
    except JobnsError as e:
        check_message(str(e))
        return e


@fuzz()
@given(text=answer_text(), job=IDS)
def test_parse_squeue_any_answer(text: str, job: str) -> None:
    tried("jobsize.parse_squeue")
    check(parsed(jobsize.parse_squeue, text, job))


@fuzz()
@given(value=st.one_of(FORGED, hostile_text(12), slurm_size().map(lambda t: t[0])))
def test_tmp_bytes_any_value(value: str) -> None:
    tried("jobsize.tmp_bytes")
    check(parsed(jobsize.tmp_bytes, value))


@fuzz()
@given(
    job=IDS,
    size=slurm_size(),
    others=st.lists(st.tuples(NUMERIC_IDS, IDS, slurm_size()), max_size=5),
    where=st.integers(0, 5),
)
def test_parse_squeue_reads_the_jobs_own_row_exactly(
    job: str,
    size: tuple[str, int | None],
    others: list[tuple[str, str, tuple[str, int | None]]],
    where: int,
) -> None:
    """Rows of other jobs (an array's tasks) never change the job's own size."""
    tried("jobsize.parse_squeue exact")
    numeric = job.split("_")[0] if "_" in job else job
    rows = [row(a, i, s[0]) for a, i, s in others if job not in (a, i)]
    rows.insert(min(where, len(rows)), row(numeric, job, size[0]))
    assert jobsize.parse_squeue("\n".join(rows) + "\n", job) == (size[1], "")


@pytest.fixture(scope="module")
def fake_squeue(box: FuzzBox) -> tuple[Path, Path]:
    """A squeue that prints the answer file, and that file. Root runs its programs only
    from root-owned system directories (launcher.system.sysprog): the property puts this one
    in their place by hand (and checks what setup would run)."""
    answer = box.files / "squeue-answer"
    program = box.root / "fake-squeue"
    program.write_text(f"#!/bin/sh\nexec cat {answer}\n")
    program.chmod(0o755)
    return program, answer


@fuzz(0.1)
@given(answer=st.one_of(answer_text(), st.binary(max_size=80).map(lambda b: b.decode("latin-1"))))
def test_slurm_tmp_through_a_squeue_program(fake_squeue: tuple[Path, Path], answer: str) -> None:
    """setup's call as a whole: bytes squeue prints (any encoding), read by jobns."""
    tried("jobsize.slurm_tmp (subprocess)")
    program, answer_file = fake_squeue
    answer_file.write_bytes(answer.encode("utf-8", "surrogatepass"))
    ran: list[list[str]] = []

    def argv(cmd: list[str], first: str = "") -> list[str]:
        ran.append(cmd)
        return [str(program), *cmd[1:]]

    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(sysprog, "argv", argv)
        got = parsed(jobsize.slurm_tmp, "7")
    assert [c[0] for c in ran] == ["squeue"] and "--jobs=7" in ran[0]
    check((got, "") if got is None or isinstance(got, int) else got)
    warnings = err.getvalue()
    if warnings:
        assert got is None and warnings.count("\n") == 1, warnings
        assert warnings.startswith("jobns: warning: ")
        check_message(warnings[:-1])
