"""Fuzz what a container controls (no root): the OCI state on the hook's stdin, the bundle's
config.json (annotations, process.env, process.user, user namespace maps, root.path,
mounts) and the job derived from them. The hook runs as root at every container start:
any input is a container that starts with its job's directories or is refused with one
line, never a traceback."""

from __future__ import annotations

import json
import os

from hypothesis import given
from hypothesis import strategies as st

from jobns.hook import bundle as bundle_mod
from jobns.hook import identity, oci_config
from jobns.hook import state as oci
from jobns.hook.bundle import Bundle
from jobns.launcher.model.config import Config
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.job import LAYOUTS, Job, safe_component
from jobns.launcher.model.plan import build
from jobns.launcher.model.request import Request
from jobns.launcher.system.errors import JobnsError
from tests.fuzz.conftest import FuzzBox
from tests.fuzz.support import (
    annotation_maps,
    fuzz,
    hostile_text,
    job_id_text,
    json_bytes,
    json_values,
    mostly,
    oci_config_doc,
    outcome,
    state_doc,
    tried,
    user_spec,
)


def check_job(job: Job, named: object) -> None:
    assert safe_component(job.job_id, "job id", "") == job.job_id
    assert job.layout in LAYOUTS and isinstance(job.no_rm, bool)
    assert isinstance(named, (bool, str))
    assert type(job.user.uid) is int and 0 <= job.user.uid < 2**32
    assert type(job.user.gid) is int and 0 <= job.user.gid < 2**32


def site_config(box: FuzzBox) -> Config:
    return Config(
        {
            "local_base": str(box.local),
            "shm_base": str(box.shm),
            "shared_base": str(box.shared),
            "state_dir": str(box.state),
        },
        "fuzz",
    )


def follow_bundle(
    box: FuzzBox,
    b: Bundle,
    state_annotations: dict[str, str],
    cid: str | None,
    flags: dict[str, str | bool | None],
) -> None:
    """What createRuntime and oci-config do with a loaded bundle, short of the system."""
    ids_ = outcome(b.process_ids)
    if isinstance(ids_, tuple):
        assert all(type(i) is int and 0 <= i < 2**32 for i in ids_)
    req = Request.from_options(flags)
    got = outcome(identity.job_of, {**b.annotations, **state_annotations}, b, cid, req)
    if isinstance(got, JobnsError):
        return
    job, named = got
    check_job(job, named)
    plan = outcome(build, site_config(box), job)
    if isinstance(plan, JobnsError):
        return
    hooks = oci_config.hook_entries("/opt/jobns/venv/bin/jobns", str(box.config))
    new = outcome(
        oci_config.rewrite,
        b.doc,
        oci_config.binds_of(plan),
        job_environment(site_config(box), job),
        oci_config.annotations_of(job, named),
        hooks,
    )
    if isinstance(new, dict):
        # What write_doc does with it; and what the runtime then reads back.
        data = json.dumps(new, indent=2).encode() + b"\n"
        assert isinstance(json.loads(data), dict)


@fuzz(2)
@given(doc=state_doc(["/var/lib/b", "/run/containers/b"]), how=st.integers(0, 2))
def test_oci_state_parse(doc: object, how: int) -> None:
    tried("hook.state.parse")
    st_ = outcome(oci.parse, json_bytes(doc, how))
    if isinstance(st_, JobnsError):
        return
    assert isinstance(st_.id, str) and st_.id
    assert st_.status in ("creating", "created", "running", "stopped", "paused")
    assert type(st_.pid) is int and 0 <= st_.pid <= 4194304
    assert isinstance(st_.bundle, str) and st_.bundle
    os.fsencode(st_.bundle)  # a path the hook can open, or a clean error: never a crash
    assert "\0" not in st_.bundle
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in st_.annotations.items())


@fuzz()
@given(
    data=st.one_of(
        st.binary(max_size=80),
        hostile_text(60).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.sampled_from(
            [
                b"",
                b" ",
                b"{}",
                b"[]",
                b"null",
                b"1e400",
                b"[" * 5000,
                b'{"a":' * 3000,
                b'{"ociVersion":"1","id":"x","status":"creating","bundle":"/b","pid":1e400}',
                b'{"ociVersion":"1","id":"x","status":"creating","bundle":"/b","pid":NaN}',
                b"\xef\xbb\xbf{}",
                b'{"bundle":"/b","bundle":"/c"}',
            ]
        ),
    )
)
def test_oci_state_raw_bytes(data: bytes) -> None:
    tried("hook.state.raw_bytes")
    outcome(oci.parse, data)


@fuzz()
@given(
    arg=st.one_of(
        st.none(),
        st.sampled_from([*oci.STAGES, *oci.NOT_HERE, "", "CREATERUNTIME"]),
        hostile_text(10),
    ),
    status=st.one_of(
        st.sampled_from(["creating", "created", "running", "stopped", "paused"]), hostile_text(8)
    ),
)
def test_stage_for(arg: str | None, status: str) -> None:
    tried("hook.state.stage_for")
    got = outcome(oci.stage_for, arg, status)
    assert got in (oci.CREATE, oci.POSTSTOP) or isinstance(got, JobnsError)


@fuzz(2)
@given(data=st.data(), how=st.integers(0, 2))
def test_hook_front(box: FuzzBox, data: st.DataObject, how: int) -> None:
    """hook main up to the first system call on the container: parse the state, pick the
    stage, check the id, load the bundle it names, work out the job."""
    bundles = [
        str(box.bundle),
        str(box.bundle) + "/",
        str(box.root / "missing"),
        str(box.bundle / "config.json"),
        "bundle",
    ]
    doc = data.draw(state_doc(bundles))
    tried("hook.front")
    st_ = outcome(oci.parse, json_bytes(doc, how))
    if isinstance(st_, JobnsError):
        return
    outcome(oci.stage_for, None, st_.status)
    cid = outcome(safe_component, st_.id, "container id", "fix it")
    if isinstance(cid, JobnsError):
        return
    b = outcome(bundle_mod.load, st_.bundle)
    if not isinstance(b, Bundle):
        return
    # createRuntime asks the container's init (st.pid, live) who it runs as; here any
    # pid, since reading /proc/PID/uid_map of whatever process has it harms nothing.
    ids_ = outcome(b.process_ids, st_.pid)
    if isinstance(ids_, tuple):
        got = outcome(identity.job_of, {**b.annotations, **st_.annotations}, b, cid, ids=ids_)
        if isinstance(got, tuple) and hasattr(identity, "check_named"):
            outcome(identity.check_named, f"container {cid}", ids_[0], got[0].user, got[1])
    follow_bundle(box, b, st_.annotations, cid, {})


@fuzz(2)
@given(
    doc=st.one_of(oci_config_doc(), oci_config_doc(), json_values),
    how=st.integers(0, 2),
    cid=st.one_of(st.none(), job_id_text()),
    state_annotations=mostly(st.just({}), annotation_maps),
    flags=st.fixed_dictionaries(
        {},
        optional={
            "job_id": st.one_of(st.none(), job_id_text()),
            "user": st.one_of(st.none(), user_spec()),
            "use_shared_tmpdir": st.one_of(st.none(), st.sampled_from(["", "per-node", "x"])),
            "no_rm_tmpdir": st.one_of(st.none(), st.booleans()),
        },
    ),
)
def test_bundle_config(
    box: FuzzBox,
    doc: object,
    how: int,
    cid: str | None,
    state_annotations: dict[str, str],
    flags: dict[str, str | bool | None],
) -> None:
    """config.json as the bundle's author wrote it, through load, the job and the rewrite
    jobns oci-config makes."""
    tried("hook.bundle")
    path = box.files / "bundle"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_bytes(json_bytes(doc, how))
    b = outcome(bundle_mod.load, str(path))
    if isinstance(b, Bundle):
        assert b.rootfs.startswith("/")
        follow_bundle(box, b, state_annotations, cid, flags)
