"""The schemas are the contract (no root): each is a valid JSON Schema, what jobns writes is
valid, and the hot set's typed reader of job records (launcher.model.record, no jsonschema)
refuses a record exactly when jsonschema does. The OCI state's reader has the same test in
tests/unit/test_hook_state.py; the config is checked with jsonschema itself."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import TREE_FIELDS, Pins, Record, TreeRecord
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.mountinfo import Identity
from tests.schemas import SCHEMAS

RECORD_SCHEMA = SCHEMAS["job-state.schema.json"]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_is_valid(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMAS[name])


def a_record() -> dict[str, Any]:
    r = Record("7", "alice", 1001, 1001, "n1", "local", False, "running", 30.0)
    r.trees = [
        TreeRecord(
            Tree("local", "/l", (), "job-7", ("tmp", "var_tmp"), True),
            1 << 20,
            True,
            mount=Identity(40, 51, "tmpfs"),
            backing="tmpfs",
        ),
        TreeRecord(Tree("shm", "/s", (), "job-7", (), True), cover="12"),
    ]
    r.pins = Pins("/p/user", "/p/mnt", 1, 2)
    r.errors = ["x"]
    r.ran, r.run, r.prolog_at = True, "0", 12.5
    doc = r.to_dict()
    jsonschema.Draft202012Validator(RECORD_SCHEMA).validate(doc)
    back: dict[str, Any] = json.loads(json.dumps(doc))
    return back


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-1e6, 1e6, allow_nan=False)
    | st.sampled_from(["", "x", "/a", "running", "local", "12", "tmpfs", "ro"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "id"]), children, max_size=2)
    ),
    max_leaves=6,
)
# Where a mutation lands: every field the reader types (arc, options, capacities and
# staging are kept as objects here and read by their own code later).
PLACES = [
    ("version",),
    ("job_id",),
    ("user",),
    ("user", "name"),
    ("user", "uid"),
    ("user", "gid"),
    ("user", "extra"),
    ("hostname",),
    ("layout",),
    ("no_rm_tmpdir",),
    ("state",),
    ("created",),
    ("updated",),
    ("trees",),
    ("pins",),
    ("pins", "mnt"),
    ("pins", "mnt_dev"),
    ("pins", "pid"),
    ("pins", "extra"),
    ("kill_wait",),
    ("teardown_failures",),
    ("errors",),
    ("history",),
    ("ran",),
    ("run",),
    ("prolog_at",),
    *(("trees", 0, k) for k in (*TREE_FIELDS, "extra")),
    ("trees", 0, "mount", "id"),
    ("trees", 0, "mount", "fstype"),
    ("trees", 1, "cover"),
]


def test_tree_fields_are_the_schemas_tree() -> None:
    # The reader's closed set of tree fields is exactly the schema's (no more, no fewer,
    # none twice); "extra", the unknown field PLACES adds, is in neither.
    defs: Any = RECORD_SCHEMA["$defs"]
    tree = defs["tree"]
    assert tree["additionalProperties"] is False
    assert len(set(TREE_FIELDS)) == len(TREE_FIELDS)
    assert set(TREE_FIELDS) == set(tree["properties"])
    assert "extra" not in TREE_FIELDS


@settings(max_examples=800)
@given(place=st.sampled_from(PLACES), value=json_values, delete=st.booleans())
def test_the_record_reader_refuses_what_the_schema_refuses(
    place: tuple[Any, ...], value: Any, delete: bool
) -> None:
    doc = a_record()
    node = doc
    for key in place[:-1]:
        node = node[key]
    if delete:
        node.pop(place[-1], None)
    else:
        node[place[-1]] = copy.deepcopy(value)
    reference = jsonschema.Draft202012Validator(RECORD_SCHEMA).is_valid(doc)
    try:
        Record.from_dict(doc)
    except JobnsError as e:
        assert not reference, f"refused a valid record: {e}"
    else:
        assert reference, f"accepted an invalid record: {place} = {value!r}"


def test_a_record_round_trips_and_a_bad_one_is_one_line() -> None:
    doc = a_record()
    assert Record.from_dict(doc).to_dict() == doc
    doc["trees"][0]["base"] = 5
    with pytest.raises(
        JobnsError, match=r"^job record: 'trees\[0\]\.base' must be a non-empty string$"
    ):
        Record.from_dict(doc)
