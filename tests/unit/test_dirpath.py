"""[[dirs]] paths with the job's symbols (%j, %u, %%): expansion, the config's checks
and the plan (no root)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.dirpath import (
    components,
    expand,
    fixed_part,
    has_symbols,
    may_overlap,
    problem,
)
from jobns.launcher.model.job import Job, User
from jobns.launcher.model.plan import build
from jobns.launcher.model.record import new_record, plan_of
from jobns.launcher.system.errors import JobnsError, UserError

ALICE = User("alice", 1001, 1001, (1001,), "/home/alice")


def entry(path: str, base: str = "/local/jobns") -> str:
    return f'[[dirs]]\npath = "{path}"\nbase = "{base}"\n'


@pytest.mark.parametrize(
    ("template", "job_id", "user", "expanded"),
    [
        ("/scratch/%u", "7", "alice", "/scratch/alice"),
        ("/scratch/%u/job_%j", "7", "alice", "/scratch/alice/job_7"),
        ("/scratch/%j.%u", "7_2", "a.b-c", "/scratch/7_2.a.b-c"),
        ("/scratch/100%%/%j", "7", "alice", "/scratch/100%/7"),
        ("/scratch/%%j", "7", "alice", "/scratch/%j"),  # never re-scanned
        ("/scratch/local", "7", "alice", "/scratch/local"),
    ],
)
def test_expand(template: str, job_id: str, user: str, expanded: str) -> None:
    assert problem(template) is None
    assert expand(template, job_id, user) == expanded


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "../etc", "a b", "x\n", "%u", "é"])
def test_a_value_that_is_not_one_safe_component_refuses_the_job(value: str) -> None:
    for template, args in (("/scratch/%u", ("7", value)), ("/scratch/%j", (value, "alice"))):
        with pytest.raises(UserError, match="not a safe path component"):
            expand(template, *args)


@given(st.text(max_size=40), st.text(max_size=40))
def test_no_value_moves_the_path_out_of_its_component(job_id: str, user: str) -> None:
    try:
        out = expand("/scratch/x%j/%u", job_id, user)
    except UserError:
        return
    parts = out.split("/")
    assert parts[:2] == ["", "scratch"] and len(parts) == 4
    assert parts[2] == f"x{job_id}" and parts[3] == user
    assert not {".", "..", ""} & set(parts[2:])


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("/scratch/%x", "unknown symbol '%x'"),
        ("/scratch/%A", "unknown symbol '%A'"),
        ("/scratch/%", "lone '%'"),
        ("/scratch/a%", "lone '%'"),
    ],
)
def test_unknown_symbols(template: str, needle: str) -> None:
    msg = problem(template)
    assert msg is not None and needle in msg


BAD = [
    (entry("/scratch/%x"), "unknown symbol '%x'; the symbols are %j (job id), %u"),
    (entry("/scratch/%"), "lone '%'"),
    (entry("/%u"), "already private to every job"),  # a user named tmp
    (entry("/var/%j"), "already private to every job"),  # job id tmp
    (entry("/dev/%u"), "/dev/shm is already private"),
    (entry("/proc/%u"), "/proc belongs to the kernel"),
    (entry("/%j/x"), "already private to every job"),
    (entry("/run/%u"), "overlaps state_dir"),
    (entry("/scratch/%u") + entry("/scratch/alice", "/local/other"), "is, holds or lies under"),
    (entry("/scratch/%u/x") + entry("/scratch/%j", "/local/other"), "is, holds or lies under"),
    (entry("/scratch/%u", "/local/%u"), "base takes no symbols"),
    (entry("/scratch/x", "/local/100%%"), "base takes no symbols"),
]


@pytest.mark.parametrize(("text", "needle"), BAD)
def test_the_config_refuses_what_some_expansion_could_make_wrong(text: str, needle: str) -> None:
    with pytest.raises(JobnsError) as e:
        parse(text, "/etc/jobns/jobns.toml")
    msg = str(e.value)
    assert needle in msg, msg
    assert msg.startswith("read config /etc/jobns/jobns.toml: [[dirs]] path = ")
    assert "\n" not in msg


def test_good_templates_load_and_are_kept_as_written() -> None:
    text = entry("/scratch/%u") + entry("/data/%j/x", "/local/other")
    cfg = Config(parse(text, "/t.toml"), "/t.toml")
    assert [d.path for d in cfg.dirs] == ["/scratch/%u", "/data/%j/x"]


def test_overlap_and_fixed_part() -> None:
    assert may_overlap("/scratch/%u", "/scratch/alice")
    assert may_overlap("/scratch/%u", "/scratch")
    assert not may_overlap("/scratch/%u", "/data/alice")
    assert not may_overlap("/scratch/%u", "/scratchy")
    assert fixed_part("/scratch/%u/job_%j") == "/scratch"
    assert fixed_part("/scratch/100%%/%u") == "/scratch/100%"
    assert fixed_part("/scratch/local") == "/scratch/local"


def test_the_plan_binds_the_expanded_path_and_the_record_keeps_it() -> None:
    cfg = Config(parse(entry("/scratch/%u/job_%j"), "/t.toml"), "/t.toml")
    job = Job("77", ALICE, "n01")
    plan = build(cfg, job)
    (tree,) = [t for t in plan.trees if t.extra is not None]
    assert tree.extra is not None and tree.extra.target == "/scratch/alice/job_77"
    assert tree.extra.templated and tree.path == "/local/jobns/job-77"
    assert [b.target for b in plan.binds][-1] == "/scratch/alice/job_77"
    # Everything after setup works from the record: the expanded path, not the template.
    again = plan_of(cfg, new_record(job, plan, 1.0, cfg), job)
    assert [b.target for b in again.binds][-1] == "/scratch/alice/job_77"


def test_an_escaped_percent_before_a_letter_is_no_symbol() -> None:
    """'%%j' is the literal text '%j': every reader of a template sees the same pieces."""
    assert not has_symbols("/scratch/100%%job")
    assert components("/scratch/100%%job") == ["", "scratch", "100%job"]
    assert fixed_part("/scratch/100%%job") == "/scratch/100%%job"
    assert has_symbols("/scratch/%%%j")
