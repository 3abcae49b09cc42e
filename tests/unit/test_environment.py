"""launcher.model.environment: the variables docs/users.md "Environment" promises a job's tasks, for
every layout, with and without an [arc] section, whatever PMIx's or Slurm's variables say
(no root)."""

from __future__ import annotations

import pytest

from jobns.launcher.model import plan
from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.environment import job_environment, pmix_dirs
from jobns.launcher.model.inputs import Options, Request, config_from_run_env, job_from
from jobns.launcher.model.job import LAYOUTS, Job, User, current_user
from jobns.launcher.system.errors import JobnsError

PMIX_AND_TMPDIR = {
    "TMPDIR",
    "JOBNS_JOB_ID",
    "PMIX_SYSTEM_TMPDIR",
    "PMIX_SERVER_TMPDIR",
}
SHARED_FLAG = {"local": None, "shared": "", "per-node": "per-node"}


def cfg(text: str = "") -> Config:
    return Config(parse(text, "/etc/jobns/test.toml"), "/etc/jobns/test.toml")


def user() -> User:
    return User("alice", 1234, 1234, (1234,), "/home/alice")


def job(layout: str = "local", job_id: str = "42") -> Job:
    return Job(job_id, user(), "node1", layout, False)


def job_in(environ: dict[str, str], layout: str = "local") -> Job:
    """Job 42 as a command takes it from its flags and the caller's environment."""
    opts: Options = {"job_id": "42", "use_shared_tmpdir": SHARED_FLAG[layout]}
    return job_from(Request.from_options(opts), environ)


def expected(job_id: str) -> dict[str, str]:
    """docs/users.md "Environment", row by row."""
    return {
        "TMPDIR": "/tmp",
        "JOBNS_JOB_ID": job_id,
        "PMIX_SYSTEM_TMPDIR": "/tmp",
        "PMIX_SERVER_TMPDIR": "/tmp/pmix",
    }


# ------------------------------------------------------------------------- PMIx


PMIX_ENVIRONS = [
    {},
    {"PMIX_NAMESPACE": "ompi.7", "PMIX_RANK": "3"},
    {"SLURM_STEP_ID": "2", "SLURM_PROCID": "5"},
    {"PMIX_NAMESPACE": "ns", "PMIX_RANK": "4", "SLURM_STEP_ID": "2", "SLURM_PROCID": "9"},
]


@pytest.mark.parametrize("environ", PMIX_ENVIRONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_job_environment_is_what_readme_promises(environ: dict[str, str], layout: str) -> None:
    """The same for every step and rank: PMIX_TMPDIR, PMIX_NSDIR, PMIX_PROCDIR and
    PMIX_TDIR_RMCLEAN are a PMIx server's attributes (PMIx_Get), never set here."""
    env = job_environment(cfg(), job_in(environ, layout))
    assert env == expected("42")


@pytest.mark.parametrize("environ", PMIX_ENVIRONS)
def test_pmix_dirs_is_the_server_tmpdir_alone(environ: dict[str, str]) -> None:
    env = job_environment(cfg(), job_in(environ))
    assert pmix_dirs(env) == ["/tmp/pmix"]


def test_pmix_dirs_reads_the_environment_it_is_given() -> None:
    """run.py merges the caller's environment first: pmix_dirs takes the merged values,
    and only PMIX_SERVER_TMPDIR (a caller's PMIX_NSDIR or PMIX_PROCDIR is nothing to it)."""
    env = {
        "PMIX_SERVER_TMPDIR": "/tmp/pmix",
        "PMIX_NSDIR": "/tmp/pmix/a",
        "PMIX_PROCDIR": "/tmp/pmix/a/1",
        "OTHER": "x",
    }
    assert pmix_dirs(env) == ["/tmp/pmix"]


@pytest.mark.parametrize(
    "environ",
    [
        {"PMIX_NAMESPACE": "../../etc"},
        {"PMIX_NAMESPACE": "a/b"},
        {"PMIX_NAMESPACE": ".."},
        {"SLURM_STEP_ID": "1/../.."},
        {"PMIX_RANK": "-1"},
        {"PMIX_RANK": "1 2"},
        {"SLURM_PROCID": "x"},
        {"SLURM_PROCID": "²"},
    ],
)
def test_pmix_and_slurm_step_variables_refuse_no_job(environ: dict[str, str]) -> None:
    """Nothing jobns sets or makes depends on the caller's PMIx namespace and rank (or
    Slurm's step and task ids), so no value of theirs refuses a job."""
    assert job_environment(cfg(), job_in(environ)) == expected("42")


# ------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_same_paths_inside_the_job(layout: str) -> None:
    """Paths are as seen inside the job, where /tmp is already the job's own."""
    environ = {"SLURM_STEP_ID": "1", "SLURM_PROCID": "2"}
    opts: Options = {"job_id": "77", "use_shared_tmpdir": SHARED_FLAG[layout]}
    j = job_from(Request.from_options(opts), environ)
    assert j.layout == layout and j.user.uid == current_user().uid
    env = job_environment(cfg(), j)
    assert env == expected("77")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_plan_carries_the_environment_and_the_task_dirs(layout: str) -> None:
    config = cfg('shared_base = "/lustre/scratch"\n[arc]\nscratchdir = "/scratch"\n')
    j = job(layout)
    p = plan.build(config, j)
    assert p.env == job_environment(config, j)
    assert p.task_dirs == ["/tmp/pmix"]
    assert p.env["TMPDIR"] == "/tmp" and p.env["RUNTIME_LOCAL_SCRATCH_DIR"] == "/scratch"


# ------------------------------------------------------------------------- [arc]


def runtime(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("RUNTIME_")}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_arc_section_means_no_runtime_variables(layout: str) -> None:
    for config in (Config({}, None), cfg(), cfg('kill_wait = 5\nshared_base = "/lustre"\n')):
        env = job_environment(config, job(layout))
        assert runtime(env) == {}
        assert set(env) == PMIX_AND_TMPDIR


@pytest.mark.parametrize(
    ("arc", "want"),
    [
        # An empty [arc]: arc.conf's defaults (a shared file system, no scratch directory).
        ("", {"RUNTIME_NODE_SEES_FRONTEND": "yes", "RUNTIME_LOCAL_SCRATCH_DIR": ""}),
        (
            'scratchdir = "/scratch"',
            {"RUNTIME_NODE_SEES_FRONTEND": "yes", "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch"},
        ),
        (
            'shared_filesystem = true\nscratchdir = "/scratch"',
            {"RUNTIME_NODE_SEES_FRONTEND": "yes", "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch"},
        ),
        (
            'shared_filesystem = false\nscratchdir = "/scratch"',
            {"RUNTIME_NODE_SEES_FRONTEND": "", "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch"},
        ),
        (
            'shared_filesystem = false\nscratchdir = "/scratch"\nmovetool = "/usr/bin/mv -f"\n'
            'shared_scratch = "/frontend/scratch"',
            {
                "RUNTIME_NODE_SEES_FRONTEND": "",
                "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch",
                "RUNTIME_LOCAL_SCRATCH_MOVE_TOOL": "/usr/bin/mv -f",
                "RUNTIME_FRONTEND_SEES_NODE": "/frontend/scratch",
            },
        ),
        # movetool and shared_scratch: only when set (an empty string is not set)
        (
            'scratchdir = "/scratch"\nmovetool = ""\nshared_scratch = ""',
            {"RUNTIME_NODE_SEES_FRONTEND": "yes", "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch"},
        ),
        (
            'movetool = "cp"',
            {
                "RUNTIME_NODE_SEES_FRONTEND": "yes",
                "RUNTIME_LOCAL_SCRATCH_DIR": "",
                "RUNTIME_LOCAL_SCRATCH_MOVE_TOOL": "cp",
            },
        ),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_arc_section_sets_the_runtime_variables(
    arc: str, want: dict[str, str], layout: str
) -> None:
    env = job_environment(cfg(f"[arc]\n{arc}\n"), job(layout))
    assert runtime(env) == want
    # The PMIx and TMPDIR values do not depend on [arc].
    assert {k: v for k, v in env.items() if k in PMIX_AND_TMPDIR} == expected("42")


def test_arc_without_a_shared_filesystem_needs_a_scratchdir() -> None:
    with pytest.raises(JobnsError, match="scratchdir"):
        cfg("[arc]\nshared_filesystem = false\n")


@pytest.mark.parametrize(("shared_filesystem", "sees_frontend"), [("1", "yes"), ("", "")])
def test_a_joined_job_gets_the_runtime_variables_setup_recorded(
    shared_filesystem: str, sees_frontend: str
) -> None:
    """A task joining a set-up job rebuilds [arc] from the job's record (record.py writes
    shared_filesystem as "1" or "")."""
    values = {
        "arc.shared_filesystem": shared_filesystem,
        "arc.scratchdir": "/scratch/42",
        "arc.movetool": "",
        "arc.shared_scratch": "/fe",
    }
    env = job_environment(config_from_run_env(values), job())
    assert runtime(env) == {
        "RUNTIME_NODE_SEES_FRONTEND": sees_frontend,
        "RUNTIME_LOCAL_SCRATCH_DIR": "/scratch/42",
        "RUNTIME_FRONTEND_SEES_NODE": "/fe",
    }
    assert runtime(job_environment(config_from_run_env({}), job())) == {}


@pytest.mark.parametrize(
    "job_id",
    [
        "1",
        "job_1.2-3",
        "a" * 122,
        "a" * 123,
        "a" * 128,
    ],
)
def test_every_valid_job_id_reaches_the_environment_verbatim(job_id: str) -> None:
    env = job_environment(cfg(), job(job_id=job_id))
    assert env["JOBNS_JOB_ID"] == job_id
    assert env["PMIX_SERVER_TMPDIR"] == "/tmp/pmix"
