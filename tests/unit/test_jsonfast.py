"""launcher.system.jsonfast encodes exactly as json.dumps(sort_keys=True) (records stay readable
by every JSON tool) and round-trips through its own decoder."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.system.jsonfast import dumps, loads

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_dumps_is_json_dumps_sorted(value: Any) -> None:
    assert dumps(value) == json.dumps(value, sort_keys=True)
    assert loads(dumps(value).encode()) == value


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1, 2}, b"bytes"])
def test_dumps_refuses_what_json_cannot_hold(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        dumps(bad)
