"""PURE planning of [[dirs]] (extra private directories) and their record (no root)."""

from __future__ import annotations

import json

from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.job import Job, User
from jobns.launcher.model.plan import build
from jobns.launcher.model.record import Record, host_dirs, new_record, plan_of
from jobns.launcher.mountns.dirs import without
from tests.schemas import SCHEMAS

ALICE = User("alice", 1001, 1001, (1001,), "/home/alice")
DIRS = (
    '[[dirs]]\npath = "/scratch/local"\nbase = "/local/jobns"\nbacking = "tmpfs"\n'
    'size = "8MiB"\noptions = ["noexec"]\n'
    '[[dirs]]\npath = "/data"\nbase = "/var/lib/jobns/data"\nbacking = "disk"\nsize = 1048576\n'
    'options = ["ro"]\n'
    '[[dirs]]\npath = "/local"\nbase = "/var/lib/jobns/plain"\n'
)


def cfg(text: str = DIRS, shared: bool = True) -> Config:
    head = 'shared_base = "/lustre/slurm"\n' if shared else ""
    return Config(parse(head + text, "/t.toml"), "/t.toml")


def job(layout: str = "local") -> Job:
    return Job("77", ALICE, "n01", layout, False)


def binds(plan: object) -> list[tuple[str, str, tuple[str, ...]]]:
    from jobns.launcher.model.plan import Plan

    assert isinstance(plan, Plan)
    return [
        (plan.trees[b.tree].path + (f"/{b.child}" if b.child else ""), b.target, b.options)
        for b in plan.binds
    ]


def test_each_entry_is_one_node_local_tree_and_one_bind_in_every_layout() -> None:
    for layout in ("local", "shared", "per-node"):
        plan = build(cfg(), job(layout))
        extra = [t for t in plan.trees if t.extra is not None]
        assert [(t.role, t.path, t.children, t.remove, t.parents) for t in extra] == [
            ("dir", "/local/jobns/job-77", (), True, ()),
            ("dir", "/var/lib/jobns/data/job-77", (), True, ()),
            ("dir", "/var/lib/jobns/plain/job-77", (), True, ()),
        ], layout
        # After /tmp, /var/tmp and /dev/shm, in the config's order, with their options.
        assert binds(plan)[3:] == [
            ("/local/jobns/job-77", "/scratch/local", ("noexec",)),
            ("/var/lib/jobns/data/job-77", "/data", ("ro",)),
            ("/var/lib/jobns/plain/job-77", "/local", ()),
        ]
        assert [b.options for b in plan.binds[:3]] == [(), (), ()]
        assert [(t.extra.backing, t.extra.size) for t in extra if t.extra] == [
            ("tmpfs", 8 * 1024**2),
            ("disk", 1048576),
            ("directory", None),
        ]


def test_no_dirs_no_change() -> None:
    plan = build(cfg(""), job())
    assert len(plan.trees) == 2 and len(plan.binds) == 3
    assert all(t.extra is None for t in plan.trees)


def test_dry_run_shows_backing_size_and_options() -> None:
    from jobns.launcher.backing import kinds

    plan = build(cfg(), job())
    text = plan.describe() + "\n" + "\n".join(kinds.describe(cfg(), plan, None))
    assert (
        "# extra private directory /scratch/local: backing tmpfs, options nosuid,nodev,noexec"
        in text
    )
    assert "mount  tmpfs size=8388608 (8.0 MiB) on /local/jobns/job-77, mode 0700" in text
    assert "image  /var/lib/jobns/data/jobns-dir-JOB.img: sparse file of 1048576 bytes" in text
    assert "mount  it through a loop device (autoclear) on /var/lib/jobns/data/job-77" in text
    assert "# extra private directory /local: backing directory, options nosuid,nodev\n" in text
    assert "bind   /local/jobns/job-77 -> /scratch/local  (nosuid,nodev,noexec;" in text
    assert "bind   /var/lib/jobns/data/job-77 -> /data  (nosuid,nodev,ro;" in text
    assert "bind   /tmp/job-77/tmp -> /tmp  (nosuid,nodev;" in text


def test_the_record_keeps_target_options_backing_and_size() -> None:
    plan = build(cfg(), job())
    r = new_record(job(), plan, 30.0, cfg())
    doc = json.loads(json.dumps(r.to_dict()))
    extra = [t for t in doc["trees"] if t["role"] == "dir"]
    assert [(t["target"], t["options"], t["backing"], t["capacity"]) for t in extra] == [
        ("/scratch/local", ["noexec"], "tmpfs", 8 * 1024**2),
        ("/data", ["ro"], "disk", 1048576),
        ("/local", [], "directory", None),
    ]
    back = Record.from_dict(doc)  # checked against jobns/schemas/job-state.schema.json
    assert back.to_dict() == r.to_dict()
    assert host_dirs(back)["/scratch/local"] == "/local/jobns/job-77"
    assert host_dirs(back)["/tmp"] == "/tmp/job-77/tmp"


def test_binds_after_setup_come_from_the_record_not_todays_config() -> None:
    r = Record.from_dict(
        json.loads(json.dumps(new_record(job(), build(cfg(), job()), 30.0, cfg()).to_dict()))
    )
    # The site has since dropped one entry and changed another's path and options.
    changed = cfg(
        '[[dirs]]\npath = "/elsewhere"\nbase = "/local/jobns"\noptions = ["ro"]\n'
        '[[dirs]]\npath = "/new"\nbase = "/var/lib/jobns/new"\n'
    )
    plan = plan_of(changed, r, job())
    assert binds(plan)[3:] == [
        ("/local/jobns/job-77", "/scratch/local", ("noexec",)),
        ("/var/lib/jobns/data/job-77", "/data", ("ro",)),
        ("/var/lib/jobns/plain/job-77", "/local", ()),
    ]
    assert len(plan.trees) == 5
    # ... and a config with new entries adds nothing to a job set up without them.
    bare = Record.from_dict(
        json.loads(json.dumps(new_record(job(), build(cfg(""), job()), 30.0, cfg("")).to_dict()))
    )
    assert len(plan_of(changed, bare, job()).binds) == 3


def test_old_records_without_extra_trees_still_load() -> None:
    r = new_record(job(), build(cfg(""), job()), 30.0, cfg(""))
    doc = json.loads(json.dumps(r.to_dict()))
    for t in doc["trees"]:
        assert not {"target", "options"} & set(t)
        assert t.pop("backing") == "directory"  # as a record of the previous version
    assert "dir" in SCHEMAS["job-state.schema.json"]["$defs"]["tree"]["properties"]["role"]["enum"]  # type: ignore[index]
    back = Record.from_dict(doc)
    assert [t.tree.extra for t in back.trees] == [None, None]
    assert len(plan_of(cfg(), back, job()).binds) == 3


def test_without_drops_trees_and_renumbers_binds() -> None:
    plan = build(cfg(), job())
    less = without(plan, {2, 4})
    assert binds(less) == [
        *binds(plan)[:3],
        ("/var/lib/jobns/data/job-77", "/data", ("ro",)),
    ]
    assert without(plan, set()) is plan


def test_oci_and_cdi_mount_entries_carry_the_options() -> None:
    from jobns.hook.oci_config import binds_of, options_of, rewrite
    from jobns.launcher.mountns import cdi

    plan = build(cfg(), job())
    doc: dict[str, object] = {
        "process": {"env": []},
        "mounts": [{"destination": "/data", "type": "tmpfs"}],
    }
    new = rewrite(doc, binds_of(plan), {}, {}, None, options_of(plan))
    mounts = {m["destination"]: m for m in new["mounts"]}  # type: ignore[attr-defined]
    assert mounts["/scratch/local"]["options"] == ["rbind", "nosuid", "nodev", "noexec"]
    assert mounts["/data"] == {
        "destination": "/data",
        "type": "bind",
        "source": "/var/lib/jobns/data/job-77",
        "options": ["rbind", "nosuid", "nodev", "ro"],
    }  # the bundle's own /data mount is replaced
    assert mounts["/local"]["options"] == ["rbind", "nosuid", "nodev"]
    assert mounts["/tmp"]["options"] == ["rbind", "nosuid", "nodev"]
    c = cdi.CdiConfig(Config({"cdi": {"dir": "/etc/cdi"}}, None))
    spec = cdi.build(c, "77", binds_of(plan), {}, None, options_of(plan))
    edits = spec["devices"][0]["containerEdits"]  # type: ignore[index]
    by_path = {m["containerPath"]: m["options"] for m in edits["mounts"]}
    assert by_path["/scratch/local"] == ["rbind", "nosuid", "nodev", "noexec"]
    assert by_path["/data"] == ["rbind", "nosuid", "nodev", "ro"]
    assert by_path["/dev/shm"] == ["rbind", "nosuid", "nodev"]
