"""The hook's input (no root): the OCI state, its schema, the JSON decoder and the stage."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobns.hook.state import CREATE, POSTSTOP, parse, stage_for
from jobns.launcher.system import jsonfast
from jobns.launcher.system.errors import JobnsError
from tests.conftest import REPO

SCHEMA = json.loads((REPO / "jobns/schemas/oci-state.schema.json").read_text())
RUNC = {
    "ociVersion": "1.0.2-dev",
    "id": "t1",
    "status": "creating",
    "pid": 12217,
    "bundle": "/var/lib/b",
    "annotations": {"org.jobns.job-id": "7"},
}
CRUN = {
    "ociVersion": "1.0",
    "id": "p2",
    "pid": 6716,
    "root": "rootfs",
    "bundle": "/var/lib/b",
    "status": "created",
    "annotations": {},
}
OLD = {"ociVersion": "1.0.0-rc1", "id": "o", "status": "stopped", "bundlePath": "/b"}
FLOAT_PID = {**RUNC, "pid": 12217.0}  # an integer to JSON Schema


@pytest.mark.parametrize("doc", [RUNC, CRUN, OLD, FLOAT_PID])
def test_real_runtime_states_parse(doc: dict[str, Any]) -> None:
    s = parse(json.dumps(doc).encode())
    assert s.id == doc["id"] and s.status == doc["status"]
    assert s.bundle == doc.get("bundle", doc.get("bundlePath"))
    assert s.pid == doc.get("pid", 0) and type(s.pid) is int
    assert s.annotations == doc.get("annotations", {})


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "it is empty"),
        (b"{not json", "not JSON"),
        (b"[]", "the document is not a JSON object"),
        (b'{"ociVersion":"1","id":"x","status":"creating"}', "names no bundle"),
        (b'{"ociVersion":"1","id":"x","status":"weird","bundle":"/b"}', "'status' must be one of"),
        (
            b'{"ociVersion":"1","id":"x","status":"creating","bundle":"/b","pid":"1"}',
            "'pid' must be an integer",
        ),
        (
            b'{"ociVersion":"1","id":"x","status":"creating","bundle":"/b","pid":-1}',
            "'pid' must be at least 0",
        ),
        (
            b'{"ociVersion":"1","id":"x","status":"creating","bundle":"/b","annotations":{"a":1}}',
            "'annotations' must be an object of strings",
        ),
        (
            b'{"ociVersion":"1","id":"","status":"creating","bundle":"/b"}',
            "'id' must be a non-empty string",
        ),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_states_are_one_clear_line(data: bytes, needle: str) -> None:
    with pytest.raises(JobnsError) as e:
        parse(data)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert msg.startswith("read the OCI state on stdin: ") and "OCI hook" in msg


@pytest.mark.parametrize(
    ("arg", "status", "stage"),
    [
        ("createRuntime", "creating", CREATE),
        ("prestart", "creating", CREATE),
        ("poststop", "stopped", POSTSTOP),
        (None, "creating", CREATE),
        (None, "created", CREATE),
        (None, "stopped", POSTSTOP),
        ("createRuntime", "created", CREATE),  # crun's status at createRuntime
    ],
)
def test_stage(arg: str | None, status: str, stage: str) -> None:
    assert stage_for(arg, status) == stage


@pytest.mark.parametrize(
    ("arg", "status", "needle"),
    [
        ("poststart", "running", "too late"),
        ("startContainer", "created", "after pivot_root"),
        ("createContainer", "created", "inside the container"),
        ("frob", "creating", "unknown"),
        (None, "running", "poststart"),
        (None, "paused", "no stage"),
    ],
)
def test_stages_jobns_cannot_serve(arg: str | None, status: str, needle: str) -> None:
    with pytest.raises(JobnsError, match=needle):
        stage_for(arg, status)


# --- hook.state's typed reader agrees with jsonschema on OCI states ----------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**7), 10**7)
    | st.floats(-1e6, 1e6, allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)

field_values = {
    "ociVersion": st.one_of(st.just("1.0.2"), st.just(""), json_values),
    "id": st.one_of(st.just("c1"), st.just(""), st.text(min_size=1020, max_size=1030), json_values),
    "status": st.one_of(
        st.sampled_from(
            ["creating", "created", "running", "stopped", "paused", "Creating", "configured"]
        ),
        json_values,
    ),
    "pid": st.one_of(
        st.integers(-3, 4194310),
        st.sampled_from([0, 4194304, 4194305, True, 1.0, "12"]),
        json_values,
    ),
    "bundle": st.one_of(st.just("/b"), st.just(""), json_values),
    "bundlePath": st.one_of(st.just("/b"), st.just(""), json_values),
    "annotations": st.one_of(
        st.dictionaries(
            st.text(max_size=6), st.one_of(st.text(max_size=4), json_values), max_size=3
        ),
        json_values,
    ),
    "root": json_values,
}


@st.composite
def mutated_states(draw: st.DrawFn) -> dict[str, Any]:
    base: dict[str, Any] = dict(draw(st.sampled_from([RUNC, CRUN, OLD])))
    for key in draw(st.lists(st.sampled_from(sorted(field_values)), max_size=3, unique=True)):
        if draw(st.booleans()):
            base.pop(key, None)
        else:
            base[key] = draw(field_values[key])
    return base


@settings(max_examples=600)
@given(doc=st.one_of(mutated_states(), json_values))
def test_parse_refuses_what_the_schema_refuses(doc: Any) -> None:
    """The hook's typed reader (no jsonschema: ~100 ms) and the schema agree: a state is
    parsed iff jsonschema finds it valid (and its bundle is a clean path)."""
    reference = jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    data = json.dumps(doc).encode("utf-8", "surrogatepass")
    try:
        parse(data)
    except JobnsError as e:
        bundle = doc.get("bundle", doc.get("bundlePath")) if isinstance(doc, dict) else None
        dirty = isinstance(bundle, str) and "control character" in str(e)
        assert not reference or dirty, str(e)
    else:
        assert reference, doc


# --- the JSON decoder --------------------------------------------------------------------


@settings(max_examples=300)
@given(doc=json_values, indent=st.sampled_from([None, 1, "\t"]))
def test_jsonfast_decodes_like_json(doc: Any, indent: int | str | None) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    assert jsonfast.loads(f" \n{text}\r\n".encode()) == doc


@settings(max_examples=300)
@given(
    data=st.binary(max_size=24)
    | st.text(alphabet='{}[]":,0123456789.eE+-tfnrul \\', max_size=16).map(str.encode)
)
def test_jsonfast_rejects_what_json_rejects(data: bytes) -> None:
    try:
        expected = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError):
        with pytest.raises(ValueError):
            jsonfast.loads(data)
        return
    assert jsonfast.loads(data) == expected


def _no_constant(name: str) -> None:
    raise ValueError(name)


def test_jsonfast_errors_without_json_imported() -> None:
    """The C scanner needs json.decoder for most messages; the hook never imports it
    up front."""
    code = (
        "import sys; from jobns.launcher.system.jsonfast import loads\n"
        "for bad in (b'{]', b'[1,]', b'\"a', b'{\"a\" 1}'):\n"
        "    assert 'json' not in sys.modules\n"
        "    try: loads(bad)\n"
        "    except ValueError as e: print(type(e).__name__, e)\n"
        "    else: raise SystemExit('accepted ' + repr(bad))\n"
        "    sys.modules.pop('json', None); sys.modules.pop('json.decoder', None)\n"
        "    sys.modules.pop('json.scanner', None); sys.modules.pop('json.encoder', None)\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(REPO)!r}); exec({code!r})",
        ],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Error") == 4 and "SystemError" not in r.stdout, r.stdout
