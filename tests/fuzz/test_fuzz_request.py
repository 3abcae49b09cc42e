"""Fuzz a job's request as the prolog sees it (no root): who the job is (flags and Slurm
variables, launcher.model.job) and what it asks for (the Slurm job comment, --directives and
--script, through directives, capacities and staging to the recorded plan). This is
`jobns setup` short of touching the system: a bad request must refuse the job with one
line, never crash the prolog (which would drain the node)."""

from __future__ import annotations

import contextlib
import io
import os

from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.lifecycle.lifecycle import gather_directives
from jobns.launcher.model import capacity
from jobns.launcher.model.config import Config
from jobns.launcher.model.directives import Directives, comment_directives
from jobns.launcher.model.inputs import Options, Request, kill_wait_from, net_from
from jobns.launcher.model.job import (
    LAYOUTS,
    Job,
    User,
    job_id_from,
    layout_from,
    lookup_user,
    safe_component,
    user_from,
)
from jobns.launcher.model.plan import Plan, build
from jobns.launcher.staging import model as staging
from jobns.launcher.system import jsonfast
from jobns.launcher.system.errors import JobnsError
from tests.fuzz.conftest import FuzzBox
from tests.fuzz.support import (
    SESSION_ROOT,
    STAGE_ROOT,
    comment_text,
    directives_text,
    fuzz,
    good_directive_body,
    hostile_text,
    job_id_text,
    optional,
    outcome,
    path_text,
    script_text,
    slurm_env,
    tried,
    user_spec,
)

JOB_USER = User("alice", 1000, 1000, (1000,), "/home/alice")


_CONFIGS: dict[str, list[Config]] = {}


def configs(box: FuzzBox) -> list[Config]:
    """No config, the box's plain and rich ones, and an odd one (another word, a
    granularity of 3 bytes, staging allowed anywhere)."""
    if str(box.root) in _CONFIGS:
        return _CONFIGS[str(box.root)]
    from jobns.launcher.model import config as config_mod

    out = [Config({}, None)]
    for path in box.configs:
        with open(path) as f:
            out.append(Config(config_mod.parse(f.read(), path), path))
    out.append(
        Config(
            {
                "directives": {"word": "BB"},
                "capacity": {"granularity": 3, "shm_default": "1K"},
                "staging": {"stage_roots": ["/"]},
            },
            "odd.toml",
        )
    )
    _CONFIGS[str(box.root)] = out
    return out


@fuzz()
@given(value=st.one_of(job_id_text(), hostile_text(140)))
def test_safe_component(value: str) -> None:
    tried("job.safe_component")
    got = outcome(safe_component, value, "job id", "fix it")
    if isinstance(got, str):
        assert got == value and got not in (".", "..") and "/" not in got
        assert got.isascii() and got.isprintable() and 0 < len(got) <= 128


@fuzz()
@given(spec=user_spec())
def test_lookup_user(spec: str) -> None:
    tried("job.lookup_user")
    got = outcome(lookup_user, spec)
    if isinstance(got, User):
        assert 0 <= got.uid < 2**32 and got.gid in got.groups


@fuzz()
@given(
    flag=optional(user_spec()),
    env=slurm_env(["SLURM_JOB_USER", "SLURM_JOB_UID"]),
    job_flag=optional(job_id_text()),
    job_env=slurm_env(["SLURM_JOB_ID"]),
    shared=optional(st.one_of(st.sampled_from(["", "shared", "per-node", "no"]), hostile_text(8))),
)
def test_job_from_flags_and_slurm(
    flag: str | None,
    env: dict[str, str],
    job_flag: str | None,
    job_env: dict[str, str],
    shared: str | None,
) -> None:
    tried("job.from_flags_and_env")
    got = outcome(user_from, flag, env)
    if isinstance(got, User) and os.geteuid() != 0:
        assert got.uid == os.getuid()  # only root may name another user
    job_id = outcome(job_id_from, job_flag, job_env)
    if isinstance(job_id, str):
        safe_component(job_id, "job id", "")
    layout = outcome(layout_from, shared)
    assert isinstance(layout, JobnsError) or layout in LAYOUTS


@fuzz()
@given(
    kill_wait=optional(
        st.one_of(
            st.sampled_from(
                [
                    "0",
                    "1",
                    "2.5",
                    "86400",
                    "86400.0001",
                    "-0",
                    "-1",
                    "nan",
                    "inf",
                    "-inf",
                    "1e3",
                    "0x10",
                    " 3 ",
                    "1_0",
                    "",
                    "\u0663",
                    "\uff13",
                    "1e400",
                    "9" * 400,
                ]
            ),
            hostile_text(10),
        )
    ),
    net=optional(st.one_of(st.sampled_from(["host", "none", "", "HOST"]), hostile_text(6))),
)
def test_numeric_and_choice_flags(kill_wait: str | None, net: str | None) -> None:
    tried("inputs.kill_wait_net")
    got = outcome(kill_wait_from, Request.from_options({"kill_wait": kill_wait}), Config({}, None))
    if isinstance(got, float):
        assert 0 <= got <= 86400
    outcome(net_from, Request.from_options({"net": net}))


def request(box: FuzzBox, config: Config, opts: Options, environ: dict[str, str]) -> None:
    """jobns setup's pure part (launcher.commands.setup.main up to lifecycle.setup), checked."""
    req = Request.from_options(opts)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        directives = outcome(gather_directives, req, environ, config)
    for line in err.getvalue().splitlines():
        assert line.startswith("jobns: warning: ") and line.isprintable(), line
    if isinstance(directives, JobnsError):
        return
    has_any = bool(
        opts.get("script")
        or opts.get("directives")
        or comment_directives(environ.get("SLURM_JOB_COMMENT", ""), config.directive_word)
        is not None
    )
    assert (directives is None) == (not has_any)
    assert directives is None or isinstance(directives, Directives)
    req = req.with_directives(directives)
    layout = outcome(layout_from, req.shared)
    if isinstance(layout, JobnsError):
        return
    job = Job("42", JOB_USER, "node1", layout, req.no_rm_tmpdir)
    plan = outcome(build, config, job)
    if not isinstance(plan, Plan):
        return
    caps = outcome(capacity.plan, config, directives, job.layout)
    if isinstance(caps, JobnsError):
        return
    for role in capacity.ROLES:
        size = caps.get(role)
        assert size is None or (type(size) is int and 1 <= size < 2**63)
    caps.describe()
    symbols = outcome(staging.symbols_for, job, environ)
    if isinstance(symbols, JobnsError):
        return
    session = req.session_dir
    got = outcome(staging.build, config, job, plan, directives, session, symbols)
    if isinstance(got, JobnsError):
        return
    stg, notes = got
    for note in notes:
        assert note.isprintable(), note
    if stg is not None:
        check_staging(config, stg, plan)
        stg.describe()
        jsonfast.dumps(stg.record())  # what the job record keeps


def check_staging(config: Config, stg: staging.Staging, plan: Plan) -> None:
    """Every copy stays where the site allows: host side below stage_roots or the session
    directory, job side inside the job's own trees or its scratch directory."""
    host_roots = [*config.staging.stage_roots, *([stg.session_dir] if stg.session_dir else [])]
    job_roots = [t.path for t in plan.trees] + ([stg.scratch_dir] if stg.scratch_dir else [])

    def below(path: str, roots: list[str]) -> bool:
        return any(r == "/" or path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    for c in stg.stage_in:
        assert below(c.source, host_roots) and below(c.destination, job_roots), c.record()
    for c in stg.stage_out:
        assert below(c.source, job_roots) and below(c.destination, host_roots), c.record()


@fuzz(2)
@given(
    data=st.data(),
    comment=optional(comment_text()),
    directives=optional(directives_text()),
    script=optional(script_text()),
    env=st.builds(
        lambda a, b: {**a, **b},
        slurm_env(
            [
                "SLURM_JOB_NAME",
                "SLURM_SUBMIT_DIR",
                "SLURM_JOB_WORK_DIR",
                "SLURM_ARRAY_JOB_ID",
                "SLURM_ARRAY_TASK_ID",
            ]
        ),
        st.fixed_dictionaries(
            {},
            optional={
                "SLURM_SUBMIT_DIR": st.sampled_from([f"{SESSION_ROOT}/abc", STAGE_ROOT]),
                "SLURM_JOB_NAME": st.sampled_from(["job", "a.b"]),
                "SLURM_ARRAY_TASK_ID": st.sampled_from(["3", "0"]),
            },
        ),
    ),
    session=optional(st.one_of(path_text(), st.just(f"{SESSION_ROOT}/abc"))),
    shared=optional(st.sampled_from(["", "per-node"])),
    no_rm=st.booleans(),
)
def test_setup_request(
    box: FuzzBox,
    data: st.DataObject,
    comment: str | None,
    directives: str | None,
    script: str | None,
    env: dict[str, str],
    session: str | None,
    shared: str | None,
    no_rm: bool,
) -> None:
    """The job comment (SLURM_JOB_COMMENT), --directives and --script, with the Slurm
    variables their symbols read, through to the staging plan."""
    config = data.draw(st.sampled_from(configs(box)))
    tried("setup.request")
    environ = {k: box.place(v) for k, v in env.items()}
    if comment is not None:
        environ["SLURM_JOB_COMMENT"] = box.place(comment)
    opts: Options = {
        "directives": box.place(directives),
        "session_dir": box.place(session),
        "use_shared_tmpdir": shared,
        "no_rm_tmpdir": no_rm or None,
    }
    if script is not None:
        opts["script"] = box.write("script.sh", box.place(script))
    request(box, config, opts, environ)


@fuzz()
@given(comment=comment_text(), name=optional(hostile_text(12)))
def test_job_comment_alone(box: FuzzBox, comment: str, name: str | None) -> None:
    """Only the comment: the one directive source a Slurm user controls in a prolog."""
    tried("setup.job_comment")
    environ = {"SLURM_JOB_COMMENT": comment}
    if name is not None:
        environ["SLURM_JOB_NAME"] = name
    environ = {k: box.place(v) for k, v in environ.items()}
    request(box, configs(box)[2], {}, environ)  # the rich config: staging and capacities


@fuzz(2)
@given(
    items=st.lists(good_directive_body(), min_size=1, max_size=4),
    where=st.sampled_from(["comment", "directives", "script"]),
    submit=st.sampled_from([f"{SESSION_ROOT}/abc", f"{SESSION_ROOT}/a b", STAGE_ROOT, "/", "rel"]),
    name=st.one_of(st.sampled_from(["job", "a.b", "..", "x/y"]), hostile_text(6)),
    task=optional(st.sampled_from(["0", "7", "x"])),
)
def test_setup_request_plausible(
    box: FuzzBox, items: list[str], where: str, submit: str, name: str, task: str | None
) -> None:
    """Well-formed directives only (with hostile symbol values): most requests get through
    to a staging plan, whose every copy must stay inside the allowed roots."""
    tried("setup.request_plausible")
    environ = {"SLURM_SUBMIT_DIR": submit, "SLURM_JOB_NAME": name}
    if task is not None:
        environ["SLURM_ARRAY_TASK_ID"] = task
    environ = {k: str(box.place(v)) for k, v in environ.items()}
    opts: Options = {}
    if where == "comment":
        environ["SLURM_JOB_COMMENT"] = str(box.place("jobns: " + "; ".join(items)))
    elif where == "directives":
        opts["directives"] = box.place("; ".join(items))
    else:
        lines = "".join(f"#JOBNS {i}\n" for i in items)
        opts["script"] = box.write("plausible.sh", str(box.place(f"#!/bin/sh\n{lines}true\n")))
    request(box, configs(box)[2], opts, environ)
