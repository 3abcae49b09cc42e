"""JSON for the hook and the prolog/epilog hot paths, without importing `json`.

`import json` pulls in `re` and json.decoder: +11 ms measured here (hyperfine,
`python -I -c 'import json'` against `-c pass`), most of what a createRuntime
hook may cost, and paid by every prolog and epilog that reads or writes a job
record. The work is done by the C scanner and encoder json itself uses
(`_json.make_scanner`, `_json.make_encoder`); only the thin wrappers are ours.
"""

from __future__ import annotations

import _json


class _Context:
    # The attributes _json.make_scanner reads; plain float/int select its fast paths.
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        # json accepts NaN/Infinity; JSON (RFC 8259) does not, nor does any runtime write it.
        raise ValueError(f"{name} is not valid JSON")


_scan = _json.make_scanner(_Context)  # type: ignore[arg-type]
_SPACE = " \t\n\r"


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _SPACE:
        i += 1
    return i


def loads(data: bytes) -> object:
    """Decode one UTF-8 JSON document; ValueError (with the position) if it is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 at byte {e.start}") from None
    start = _skip(text, 0)
    try:
        try:
            value, end = _scan(text, start)
        except SystemError:
            # The C scanner words most errors with json.decoder.JSONDecodeError, which
            # it looks up in sys.modules without importing it: import it (on this error
            # path only) and scan again for the real message.
            import json.decoder  # noqa: F401

            value, end = _scan(text, start)
    except StopIteration as e:
        # The C scanner signals "no value here" this way; json words it the same.
        raise ValueError(f"expecting a value at character {e.value}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    end = _skip(text, end)
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


def _no_default(obj: object) -> object:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


# json.dumps(..., sort_keys=True) with the default separators, as the C encoder does it.
_encode = _json.make_encoder(
    None, _no_default, _json.encode_basestring_ascii, None, ": ", ", ", True, False, False
)


def dumps(value: object) -> str:
    """Encode like json.dumps(value, sort_keys=True) (NaN and Infinity refused)."""
    return "".join(_encode(value, 0))
