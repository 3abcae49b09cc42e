"""Bundles and job identity for the hook (no root): config.json, root.path, users, annotations."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from jobns.hook import bundle as bundle_mod
from jobns.hook.bundle import Bundle, rootfs_path
from jobns.hook.identity import NO_RM, SHARED, USER, job_id_of, job_of
from jobns.launcher.model.request import Request
from jobns.launcher.system.errors import JobnsError


def make(doc: dict[str, Any], path: str = "/b") -> Bundle:
    return Bundle(path, {"root": {"path": "rootfs"}, **doc})


@pytest.mark.parametrize(
    ("bundle", "root", "expected"),
    [
        ("/var/b", "rootfs", "/var/b/rootfs"),
        ("/var/b", "/srv/img/rootfs", "/srv/img/rootfs"),
        ("/var/b/", "./x/../rootfs", "/var/b/rootfs"),
    ],
)
def test_rootfs_relative_to_bundle_unless_absolute(bundle: str, root: str, expected: str) -> None:
    assert rootfs_path(bundle, root) == expected


def test_env_last_wins_and_odd_entries_ignored() -> None:
    b = make({"process": {"env": ["A=1", "B", "A=2", "C=x=y"]}})
    assert b.env == {"A": "2", "C": "x=y"}


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"root": {}}, "root.path is missing"),
        ({"process": {"env": "A=1"}}, "process.env must be a list"),
        ({"annotations": {"a": 1}}, "annotations: must be an object of strings"),
    ],
)
def test_bad_fields_name_themselves(doc: dict[str, Any], needle: str) -> None:
    with pytest.raises(JobnsError, match=needle):
        make(doc)


def test_process_user_maps_through_user_namespace() -> None:
    linux = {
        "namespaces": [{"type": "mount"}, {"type": "user"}],
        "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
        "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 10}],
    }
    b = make({"process": {"user": {"uid": 1000, "gid": 5}}, "linux": linux})
    assert b.process_ids() == (101000, 200005)
    b = make({"process": {"user": {"uid": 1000, "gid": 50}}, "linux": linux})
    with pytest.raises(JobnsError, match=r"gidMappings: container id 50 .* not mapped"):
        b.process_ids()
    # Without a user namespace the mappings mean nothing.
    b = make(
        {
            "process": {"user": {"uid": 1000, "gid": 5}},
            "linux": {**linux, "namespaces": [{"type": "mount"}]},
        }
    )
    assert b.process_ids() == (1000, 5)


def test_read_doc_refuses_symlink_and_garbage(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    os.symlink("real.json", tmp_path / "config.json")
    with pytest.raises(JobnsError, match="symbolic link"):
        bundle_mod.read_doc(str(tmp_path))
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(JobnsError, match="not a JSON object"):
        bundle_mod.read_doc(str(tmp_path))
    with pytest.raises(JobnsError, match=r"open bundle .*/nope: No such file"):
        bundle_mod.read_doc(str(tmp_path / "nope"))


def test_write_doc_is_atomic_and_keeps_mode(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"a": 1}')
    cfg.chmod(0o640)
    bundle_mod.write_doc(str(tmp_path), {"a": 2, "b": ["x"]})
    assert json.loads(cfg.read_text()) == {"a": 2, "b": ["x"]}
    assert cfg.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


# --- identity ----------------------------------------------------------------------------


def test_job_id_precedence() -> None:
    ann = {"org.jobns.job-id": "A"}
    env = {"SLURM_JOB_ID": "S"}
    assert job_id_of(ann, env, "cid", "F") == "F"
    assert job_id_of(ann, env, "cid") == "A"
    assert job_id_of({}, env, "cid") == "S"
    assert job_id_of({}, {}, "cid") == "cid"
    with pytest.raises(JobnsError, match="no job id"):
        job_id_of({}, {}, None)


@pytest.mark.parametrize(
    ("ann", "needle"),
    [
        ({"org.jobns.job-id": "../etc"}, "annotation org.jobns.job-id '../etc' is not a safe"),
        ({"org.jobns.job-id": ""}, "annotation org.jobns.job-id is empty"),
        ({SHARED: "everywhere"}, "org.jobns.shared-tmpdir='everywhere': expected"),
        ({NO_RM: "yes"}, "org.jobns.no-rm-tmpdir='yes': expected 'true' or 'false'"),
        ({USER: "no-such-user-jobns"}, "from annotation org.jobns.user: no such user"),
    ],
)
def test_bad_annotations_are_refused(ann: dict[str, str], needle: str) -> None:
    with pytest.raises(JobnsError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        job_of(ann, make({}), "c1")


def test_annotations_select_layout_options_and_user() -> None:
    job, named = job_of(
        {"org.jobns.job-id": "9", SHARED: "per-node", NO_RM: "true", USER: "root"}, make({}), "c1"
    )
    assert (job.job_id, job.layout, job.no_rm, job.user.uid, named) == (
        "9",
        "per-node",
        True,
        0,
        f"annotation {USER}",
    )
    job, _ = job_of({SHARED: ""}, make({}), "c1")
    assert job.layout == "shared" and not job.no_rm and job.job_id == "c1"


def test_user_from_slurm_env_else_process_user() -> None:
    job, named = job_of(
        {}, make({"process": {"env": ["SLURM_JOB_UID=0", "SLURM_JOB_ID=44"]}}), "c1"
    )
    assert (job.job_id, job.user.uid, named) == ("44", 0, "SLURM_JOB_UID in process.env")
    job, named = job_of({}, make({"process": {"user": {"uid": 4242, "gid": 4343}}}), "c1")
    # A uid unknown to the host's passwd is still a valid owner.
    assert (job.user.uid, job.user.gid, named) == (4242, 4343, "")


def test_flags_win_over_annotations() -> None:
    flags: dict[str, str | bool | None] = {
        "job_id": "F",
        "user": "0",
        "use_shared_tmpdir": "per-node",
        "no_rm_tmpdir": True,
    }
    req = Request.from_options(flags)
    job, named = job_of({"org.jobns.job-id": "A", SHARED: "shared"}, make({}), None, req)
    assert (job.job_id, job.layout, job.no_rm, named) == ("F", "per-node", True, "--user")
