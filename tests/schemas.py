"""jobns/schemas/*.json for the tests, and jsonschema's verdict on a document as one line."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "jobns" / "schemas"
SCHEMAS: dict[str, dict[str, object]] = {
    p.name: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.schema.json"))
}


def first_error(doc: object, schema: dict[str, object]) -> str | None:
    """jsonschema's best error for doc as `path: message`, or None if doc is valid."""
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(doc)
    )
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
