"""Each tree's backing is chosen once, at setup, and kept in the record; everything after
asks the backing module named there (no root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobns.launcher.backing import kinds
from jobns.launcher.model.capacity import Capacities
from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.job import Job, User
from jobns.launcher.model.plan import build
from jobns.launcher.model.record import Record, new_record, recorded_backing
from tests.schemas import SCHEMAS

ALICE = User("alice", 1001, 1001, (1001,), "/home/alice")
JOB = Job("77", ALICE, "n01", "local", False)
DIRS = (
    '[[dirs]]\npath = "/scratch/fast"\nbase = "/local/jobns"\nbacking = "tmpfs"\nsize = "8MiB"\n'
    '[[dirs]]\npath = "/data"\nbase = "/var/lib/jobns/data"\nbacking = "disk"\nsize = 1048576\n'
    '[[dirs]]\npath = "/plain"\nbase = "/var/lib/jobns/plain"\n'
)
MIB = 1 << 20


def backings(capacity_text: str, caps: Capacities | None) -> dict[str, str]:
    config = Config(parse(capacity_text + DIRS, "/t.toml"), "/t.toml")
    record = new_record(JOB, build(config, JOB), 30.0, config, caps)
    back = Record.from_dict(json.loads(json.dumps(record.to_dict())))
    return {t.tree.extra.target if t.tree.extra else t.tree.role: t.backing for t in back.trees}


@pytest.mark.parametrize("tmp_backing", ["tmpfs", "disk"])
def test_the_backing_is_chosen_at_setup_and_survives_the_record(tmp_backing: str) -> None:
    text = f'[capacity]\ntmp_backing = "{tmp_backing}"\n'
    assert backings(text, Capacities(shm=MIB, tmp=64 * MIB)) == {
        "local": tmp_backing,  # /tmp and /var/tmp: the node's tmp_backing
        "shm": "tmpfs",
        "/scratch/fast": "tmpfs",
        "/data": "disk",
        "/plain": "directory",
    }
    # Without capacities the job's own trees are plain directories.
    assert backings(text, None)["local"] == backings(text, None)["shm"] == "directory"


def test_a_record_of_the_previous_version_names_its_backing_from_what_it_holds() -> None:
    assert recorded_backing({"image": "/var/lib/jobns/scratch/x.img", "capacity": 5}) == "disk"
    assert recorded_backing({"capacity": 5}) == "tmpfs"
    assert recorded_backing({"capacity": None}) == "directory"
    assert recorded_backing({"backing": "disk", "capacity": None}) == "disk"


def test_every_backing_the_schemas_name_is_one_module() -> None:
    """Adding a backing is its module plus its name in the schemas' enums."""
    tree = SCHEMAS["job-state.schema.json"]["$defs"]["tree"]  # type: ignore[index]
    dirs = SCHEMAS["config.schema.json"]["properties"]["dirs"]["items"]  # type: ignore[index]
    assert set(kinds.names()) == set(tree["properties"]["backing"]["enum"])
    assert set(dirs["properties"]["backing"]["enum"]) == set(kinds.names())
    here = Path(kinds.__file__).parent
    for name in kinds.names():
        assert (here / f"{name}.py").is_file(), name
        assert kinds.of(name).name == name
    assert [b.sized for b in kinds.every()] == [False, True, True]


def test_an_unknown_backing_is_refused() -> None:
    for name in ("xfs", "../fs", "kinds"):
        with pytest.raises(ValueError, match="no such backing"):
            kinds.of(name)
