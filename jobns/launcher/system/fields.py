"""Typed reads of a JSON document: each field is checked as it is taken (hot set).

A job record (jobns/schemas/job-state.schema.json) and a runtime's OCI state
(oci-state.schema.json) are read by the OCI hook at every container start, where
jsonschema (~100 ms to import) cannot be paid. So their readers take each field through
a Doc, which raises one JobnsError line naming the document, the field and what it must
be: a damaged or foreign document is an error, never a guess (no int("5"), no default
for a required field). The schemas stay the contract: tests check with jsonschema that
what jobns writes is valid and that these readers refuse what the schemas refuse.
"""

from __future__ import annotations

from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False  # the hot set imports no typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Collection

_MISSING = object()


class Doc:
    """One JSON object of a document named `where` (for messages); `path` is its place."""

    __slots__ = ("d", "path", "where")

    def __init__(self, d: object, where: str, path: str = "") -> None:
        if not isinstance(d, dict):
            raise JobnsError(f"{where}: {path or 'the document'} is not a JSON object")
        self.d: dict[str, object] = d
        self.where = where
        self.path = path

    def _bad(self, key: str, what: str) -> JobnsError:
        return JobnsError(f"{self.where}: '{self.path}{key}' must be {what}")

    def _get(self, key: str, required: bool) -> object:
        v = self.d.get(key, _MISSING)
        if v is _MISSING and required:
            raise JobnsError(f"{self.where}: '{self.path}{key}' is missing")
        return v

    def has(self, key: str) -> bool:
        return key in self.d

    def closed(self, keys: Collection[str]) -> Doc:
        """self, if it holds no key but `keys` (a schema's additionalProperties: false)."""
        extra = sorted(k for k in self.d if k not in keys)
        if extra:
            raise JobnsError(f"{self.where}: {self.path + extra[0]!r} is not a known field")
        return self

    def string(
        self,
        key: str,
        required: bool = True,
        nonempty: bool = False,
        choices: Collection[str] | None = None,
        null: bool = False,
    ) -> str | None:
        v = self._get(key, required)
        if v is _MISSING or (null and v is None):
            return None
        if choices is not None and (not isinstance(v, str) or v not in choices):
            raise self._bad(key, f"one of {', '.join(sorted(choices))} (it is {v!r})")
        if not isinstance(v, str) or (nonempty and not v):
            raise self._bad(key, "a non-empty string" if nonempty else "a string")
        return v

    def integer(
        self, key: str, required: bool = True, minimum: int | None = None, null: bool = False
    ) -> int | None:
        v = self._get(key, required)
        if v is _MISSING or (null and v is None):
            return None
        # JSON Schema's "integer" admits 1.0; bool is no number here.
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._bad(key, "an integer")
        if minimum is not None and v < minimum:
            raise self._bad(key, f"at least {minimum}")
        return v

    def number(self, key: str, required: bool = True, minimum: float | None = None) -> float | None:
        v = self._get(key, required)
        if v is _MISSING:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            raise self._bad(key, "a number")
        if minimum is not None and v < minimum:
            raise self._bad(key, f"at least {minimum}")
        return float(v)

    def boolean(self, key: str, required: bool = True) -> bool | None:
        v = self._get(key, required)
        if v is _MISSING:
            return None
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def obj(self, key: str, required: bool = True, null: bool = False) -> Doc | None:
        v = self._get(key, required)
        if v is _MISSING or (null and v is None):
            return None
        if not isinstance(v, dict):
            raise self._bad(key, "an object")
        return Doc(v, self.where, f"{self.path}{key}.")

    def raw_obj(self, key: str, required: bool = False) -> dict[str, object] | None:
        """An object (or null) kept as it is: a part the reader checks itself, later."""
        v = self._get(key, required)
        if v is _MISSING or v is None:
            return None
        if not isinstance(v, dict):
            raise self._bad(key, "an object or null")
        return v

    def array(self, key: str, required: bool = True) -> list[object] | None:
        v = self._get(key, required)
        if v is _MISSING:
            return None
        if not isinstance(v, list):
            raise self._bad(key, "an array")
        return v

    def strings(self, key: str, required: bool = True) -> list[str] | None:
        v = self.array(key, required)
        if v is None:
            return None
        if not all(isinstance(s, str) for s in v):
            raise self._bad(key, "an array of strings")
        return [str(s) for s in v]

    def objects(self, key: str, required: bool = True) -> list[Doc]:
        v = self.array(key, required)
        return [Doc(x, self.where, f"{self.path}{key}[{i}].") for i, x in enumerate(v or ())]

    def string_map(self, key: str) -> dict[str, str]:
        """An optional object of strings to strings (absent: empty)."""
        v = self._get(key, False)
        if v is _MISSING:
            return {}
        if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
            raise self._bad(key, "an object of strings")
        return dict(v)
