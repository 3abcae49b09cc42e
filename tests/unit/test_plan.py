"""PURE planning: the three layouts of docs/design.md "Directory layouts", the environment, and
refusals (no root)."""

from __future__ import annotations

import pytest

from jobns.launcher.model.config import Config
from jobns.launcher.model.job import Job, User
from jobns.launcher.model.plan import SCRATCH_MODE, TOP_MODE, build
from jobns.launcher.system.errors import JobnsError

ALICE = User("alice", 1001, 1001, (1001,), "/home/alice")


def config(**raw: object) -> Config:
    base: dict[str, object] = {"shared_base": "/lustre/slurm"}
    base.update(raw)
    return Config(base, "/etc/jobns/jobns.toml")


def job(layout: str = "local", no_rm: bool = False) -> Job:
    return Job("8451", ALICE, "n01", layout, no_rm)


def sources(plan_layout: str, no_rm: bool = False) -> list[tuple[str, str]]:
    plan = build(config(), job(plan_layout, no_rm))
    return [
        (plan.trees[b.tree].path + (f"/{b.child}" if b.child else ""), b.target) for b in plan.binds
    ]


def test_local_layout_is_seed_000_table_1() -> None:
    assert sources("local") == [
        ("/tmp/job-8451/tmp", "/tmp"),
        ("/tmp/job-8451/var_tmp", "/var/tmp"),
        ("/dev/shm/job-8451", "/dev/shm"),
    ]


def test_shared_layout_is_seed_000_table_2() -> None:
    assert sources("shared") == [
        ("/lustre/slurm/job-8451/tmp", "/tmp"),
        ("/lustre/slurm/job-8451/var_tmp", "/var/tmp"),
        ("/dev/shm/job-8451", "/dev/shm"),
    ]


def test_per_node_layout_is_seed_000_table_3() -> None:
    assert sources("per-node") == [
        ("/lustre/slurm/job-8451/n01/tmp", "/tmp"),
        ("/lustre/slurm/job-8451/n01/var_tmp", "/var/tmp"),
        ("/dev/shm/job-8451", "/dev/shm"),
    ]


@pytest.mark.parametrize("layout", ["shared", "per-node"])
def test_no_rm_keeps_only_the_shared_tree(layout: str) -> None:
    plan = build(config(), job(layout, no_rm=True))
    assert [(t.role, t.remove) for t in plan.trees] == [("shared", False), ("shm", True)]


def test_local_layout_ignores_no_rm() -> None:
    plan = build(config(), job("local", no_rm=True))
    assert [t.remove for t in plan.trees] == [True, True]


def test_tree_shapes_and_modes_are_described() -> None:
    plan = build(config(local_base="/scratch"), job())
    text = plan.describe()
    assert "mkdir  /scratch/job-8451  mode 0700" in text
    assert "mkdir  /scratch/job-8451/tmp  mode 1777" in text
    assert "bind   /scratch/job-8451/var_tmp -> /var/tmp" in text
    assert "uid 1001 gid 1001" in text
    assert (TOP_MODE, SCRATCH_MODE) == (0o700, 0o1777)
    assert plan.owner == (1001, 1001)


def test_shared_layout_needs_a_shared_base() -> None:
    with pytest.raises(JobnsError, match="shared_base"):
        build(Config({}, None), job("shared"))


def test_environment_and_pmix_dirs() -> None:
    j = Job("8451", ALICE, "n01")
    plan = build(config(arc={"shared_filesystem": False, "scratchdir": "/mnt/scratch"}), j)
    assert plan.env["TMPDIR"] == "/tmp"
    assert plan.env["PMIX_SYSTEM_TMPDIR"] == "/tmp"
    assert plan.env["PMIX_SERVER_TMPDIR"] == "/tmp/pmix"
    # PMIx libraries take these from their server (PMIx_Get), never from the environment.
    assert not {"PMIX_TMPDIR", "PMIX_NSDIR", "PMIX_PROCDIR", "PMIX_TDIR_RMCLEAN"} & set(plan.env)
    assert plan.env["RUNTIME_NODE_SEES_FRONTEND"] == ""
    assert plan.env["RUNTIME_LOCAL_SCRATCH_DIR"] == "/mnt/scratch"
    assert "RUNTIME_LOCAL_SCRATCH_MOVE_TOOL" not in plan.env
    assert plan.task_dirs == ["/tmp/pmix"]


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(JobnsError):
        Job("1", ALICE, "n01", "sideways")
