"""The schemas are the contract: generated.py equals them, and the hot-path checker
(launcher.system.validate) agrees with jsonschema on good and bad documents (no root)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobns.launcher.system.validate import KNOWN, first_error, iter_errors, valid
from jobns.schemas import generate
from jobns.schemas.generated import SCHEMAS

SCHEMA_DIR = Path(generate.__file__).parent


def test_generated_module_is_up_to_date() -> None:
    assert (SCHEMA_DIR / "generated.py").read_text() == generate.render(), (
        "run `python -m jobns.schemas.generate` after editing jobns/schemas/*.json"
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_is_valid_and_uses_only_supported_keywords(name: str) -> None:
    schema = json.loads((SCHEMA_DIR / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            # property names are data, not keywords
            for k, v in node.items():
                if k in ("properties", "$defs"):
                    for sub in v.values():
                        walk(sub)
                else:
                    assert k in KNOWN, (
                        f"{name}: keyword {k!r} unsupported by launcher.system.validate"
                    )
                    walk(v)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(-1e6, 1e6, allow_nan=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def mutate_config() -> st.SearchStrategy[dict[str, Any]]:
    keys = st.sampled_from(
        ["local_base", "shm_base", "shared_base", "state_dir", "kill_wait", "arc", "other"]
    )
    arc = st.dictionaries(
        st.sampled_from(["shared_filesystem", "scratchdir", "movetool", "shared_scratch", "x"]),
        json_values,
        max_size=4,
    )
    value = st.one_of(json_values, arc, st.text(min_size=1, max_size=8), st.integers(-5, 100_000))
    return st.dictionaries(keys, value, max_size=6)


@settings(max_examples=400)
@given(doc=st.one_of(mutate_config(), json_values))
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_checker_agrees_with_jsonschema(name: str, doc: Any) -> None:
    schema = SCHEMAS[name]
    reference = jsonschema.Draft202012Validator(schema).is_valid(doc)
    assert (first_error(doc, schema) is None) == reference, list(iter_errors(doc, schema))
    # The fast verdict (first_error's) and the messages agree with each other too.
    assert valid(doc, schema) == (not list(iter_errors(doc, schema)))
