"""A small JSON Schema checker for the hot path.

The schemas in ``jobns/schemas/*.json`` are the contract. jsonschema costs ~100 ms
to import, too much for a task wrapper or an OCI hook that runs once per task,
so the launch path checks documents with this interpreter of the subset of
JSON Schema our schemas use. ``jobns/schemas/generated.py`` holds the schemas as
Python literals (no json import either); tests keep it equal to the JSON files
and check that this checker and jsonschema agree on good and bad documents.

Supported keywords: type, properties, required, additionalProperties (bool or
schema), items, enum, const, minimum, maximum, minLength, maxLength,
minItems, pattern (only as a plain character-class spec, see _pattern_ok),
anyOf, $ref (local "#/$defs/..." only), description/title/$schema/$id/default
(ignored).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name

if TYPE_CHECKING:
    from collections.abc import Iterator

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}

_IGNORED = frozenset(
    {"description", "title", "$schema", "$id", "default", "$defs", "examples", "$comment"}
)
KNOWN = (
    frozenset(
        {
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
            "const",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "minItems",
            "pattern",
            "anyOf",
            "$ref",
        }
    )
    | _IGNORED
)


def _type_ok(value: object, name: str) -> bool:
    # bool is an int subclass in Python but not an integer in JSON Schema.
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    # JSON has no NaN or Infinity, but TOML has (kill_wait = nan): not numbers here, or
    # nan would slip past every minimum/maximum (all comparisons with it are false).
    if isinstance(value, float) and name in ("integer", "number") and value - value != 0.0:
        return False
    # ...and 1.0 is one (JSON Schema 2020-12: an integer is a number without a fraction).
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _where(path: str | tuple[object, object]) -> str:
    """A path for a message. Inside a document it is kept as (parent path, key) pairs, a
    list index as (i,), and made text only for a message: building it for every key of
    every record the prolog and epilog check was most of the checking time."""
    keys = []
    node: object = path
    while isinstance(node, tuple):
        node, key = node
        keys.append(key)
    out = str(node)
    for key in reversed(keys):
        if isinstance(key, tuple):
            out = f"{out}[{key[0]}]"
        else:
            out = f"{out}.{_key(key)}" if out else _key(key)
    return out or "(top level)"


def _key(key: object) -> str:
    """A document's key as a path element: as is when plain, else quoted (a key is the
    document author's text and may hold a line break or a terminal escape)."""
    k = str(key)
    return k if k and k.isprintable() and not any(c in k for c in " .[]'\"") else repr(k)


def _resolve(root: dict[str, object], ref: str) -> dict[str, object]:
    if not ref.startswith("#/"):
        raise ValueError(f"unsupported $ref {ref!r}")
    node: object = root
    for part in ref[2:].split("/"):
        assert isinstance(node, dict)
        node = node[part]
    assert isinstance(node, dict)
    return node


_SPECIAL = frozenset("\\.^$*+?{}[]|()")


def _pattern_ok(pattern: str, value: str) -> bool:
    # Patterns are compiled lazily: `re` costs ~5 ms to import and only a few
    # schema strings carry one; a plain anchored prefix (the job record's "^/", checked
    # by every prolog and epilog) needs no `re` at all.
    literal = pattern[1:]
    if pattern.startswith("^") and literal and not any(c in _SPECIAL for c in literal):
        return value.startswith(literal)
    import re

    return re.search(pattern, value) is not None


def iter_errors(
    doc: object,
    schema: dict[str, object],
    root: dict[str, object] | None = None,
    path: str | tuple[object, object] = "",
) -> Iterator[str]:
    """Yield one message per violation: '<json path>: <what is wrong>'."""
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        yield from iter_errors(doc, _resolve(root, ref), root, path)
        return
    unknown = set(schema) - KNOWN
    if unknown:
        raise ValueError(f"schema keyword(s) not supported here: {sorted(unknown)}")
    t = schema.get("type")
    if t is not None:
        names = [t] if isinstance(t, str) else [str(x) for x in t] if isinstance(t, list) else []
        if not any(_type_ok(doc, n) for n in names):
            finite = (
                ""
                if not isinstance(doc, float) or doc - doc == 0.0
                else f" ({doc} is not a number in JSON)"
            )
            yield f"{_where(path)}: must be of type {' or '.join(names)}{finite}"
            return
    if "enum" in schema and doc not in schema["enum"]:  # type: ignore[operator]
        yield f"{_where(path)}: must be one of {schema['enum']}"
    if "const" in schema and doc != schema["const"]:
        yield f"{_where(path)}: must be {schema['const']!r}"
    if "anyOf" in schema:
        options = schema["anyOf"]
        assert isinstance(options, list)
        if not any(not list(iter_errors(doc, o, root, path)) for o in options):
            yield f"{_where(path)}: does not match any allowed form"
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if isinstance(lo, (int, float)) and doc < lo:
            yield f"{_where(path)}: must be >= {lo}"
        if isinstance(hi, (int, float)) and doc > hi:
            yield f"{_where(path)}: must be <= {hi}"
    if isinstance(doc, str):
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        if isinstance(lo, int) and len(doc) < lo:
            yield f"{_where(path)}: must be at least {lo} characters"
        if isinstance(hi, int) and len(doc) > hi:
            yield f"{_where(path)}: must be at most {hi} characters"
        pat = schema.get("pattern")
        if isinstance(pat, str) and not _pattern_ok(pat, doc):
            yield f"{_where(path)}: {doc!r} does not match {pat!r}"
    if isinstance(doc, list):
        lo = schema.get("minItems")
        if isinstance(lo, int) and len(doc) < lo:
            yield f"{_where(path)}: must have at least {lo} items"
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(doc):
                yield from iter_errors(item, items, root, (path, (i,)))
    if isinstance(doc, dict):
        props = schema.get("properties", {})
        assert isinstance(props, dict)
        required = schema.get("required", [])
        assert isinstance(required, list)
        for key in required:
            if key not in doc:
                yield f"{_where(path)}: missing required key {key!r}"
        extra = schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in props:
                yield from iter_errors(value, props[key], root, (path, key))
            elif extra is False:
                yield f"{_where((path, key))}: unknown key (allowed: {', '.join(sorted(props))})"
            elif isinstance(extra, dict):
                yield from iter_errors(value, extra, root, (path, key))


def first_error(doc: object, schema: dict[str, object]) -> str | None:
    """The first violation, or None when the document is valid."""
    if valid(doc, schema):
        return None
    return next(iter_errors(doc, schema), None)


def valid(doc: object, schema: dict[str, object], root: dict[str, object] | None = None) -> bool:
    """iter_errors' verdict without its messages: no generator, no path per node, ~3x
    faster on a job record, which every prolog and epilog checks about ten times.
    first_error asks iter_errors only when this says no (tests/unit/test_schemas.py
    holds both to jsonschema's verdict)."""
    root = schema if root is None else root
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return valid(doc, _resolve(root, ref), root)
    t = schema.get("type")
    names = [t] if isinstance(t, str) else [str(x) for x in t] if isinstance(t, list) else []
    if not KNOWN.issuperset(schema) or (t is not None and not any(_type_ok(doc, n) for n in names)):
        return False  # (iter_errors raises for a keyword it does not know)
    if ("enum" in schema and doc not in schema["enum"]) or (  # type: ignore[operator]
        "const" in schema and doc != schema["const"]
    ):
        return False
    options = schema.get("anyOf")
    if isinstance(options, list) and not any(valid(doc, o, root) for o in options):
        return False
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        return not (isinstance(lo, (int, float)) and doc < lo) and not (
            isinstance(hi, (int, float)) and doc > hi
        )
    if isinstance(doc, str):
        lo, hi, pat = schema.get("minLength"), schema.get("maxLength"), schema.get("pattern")
        return (
            not (isinstance(lo, int) and len(doc) < lo)
            and not (isinstance(hi, int) and len(doc) > hi)
            and not (isinstance(pat, str) and not _pattern_ok(pat, doc))
        )
    if isinstance(doc, list):
        lo, items = schema.get("minItems"), schema.get("items")
        if isinstance(lo, int) and len(doc) < lo:
            return False
        return not isinstance(items, dict) or all(valid(i, items, root) for i in doc)
    if isinstance(doc, dict):
        return _valid_object(doc, schema, root)
    return True


def _valid_object(
    doc: dict[object, object], schema: dict[str, object], root: dict[str, object]
) -> bool:
    props = schema.get("properties", {})
    required = schema.get("required", [])
    assert isinstance(props, dict) and isinstance(required, list)
    if not all(key in doc for key in required):
        return False
    extra = schema.get("additionalProperties", True)
    for key, value in doc.items():
        if key in props:
            if not valid(value, props[key], root):
                return False
        elif extra is False or (isinstance(extra, dict) and not valid(value, extra, root)):
            return False
    return True
