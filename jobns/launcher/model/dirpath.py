"""PURE: the job's symbols in a [[dirs]] entry's path: `%j` the job id, `%u` the job
user's name, `%%` a literal percent sign (as Slurm's filename patterns spell them).

Only `path` (where the job sees the directory) takes symbols; `base` is one directory
for every job (gc and teardown find the trees there by name, job-ID, which names the
job already). A symbol never stands for more than one harmless path component: its
value must be a safe component (letters, digits, '.', '_', '-'; not '.' or '..'), so an
id or a user name can neither add a '/' nor climb out with '..'. The config is checked
with every component that holds a symbol taken as "any name" (may_within), so no
expansion can land on /tmp, /proc, state_dir or another entry's path.

Imported by `jobns run` only when the site has [[dirs]] entries: plain string work.
"""

from __future__ import annotations

from jobns.launcher.model.job import safe_component
from jobns.launcher.system.errors import JobnsError, UserError

SYMBOLS = {"j": "job id", "u": "user name"}


def _pieces(template: str) -> list[tuple[str, str]]:
    """template read once, left to right: (text, "") for literal text ('%%' is the text
    '%'), ("", letter) for '%' and the letter after it ("" for a lone '%' at the end)."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(template):
        if template[i] != "%":
            out.append((template[i], ""))
            i += 1
            continue
        letter = template[i + 1 : i + 2]
        out.append(("%", "") if letter == "%" else ("", letter))
        i += 2
    return out


def problem(template: str) -> str | None:
    """What is wrong with the symbols of template (None: nothing), for a config error."""
    for text, letter in _pieces(template):
        if text:
            continue
        if letter == "":
            return "it ends with a lone '%'; write '%%' for a literal %"
        if letter not in SYMBOLS:
            shown = repr("%" + letter)
            return (
                f"unknown symbol {shown}; the symbols are %j (job id), %u (user name) "
                "and %% (a literal %)"
            )
    return None


def has_symbols(template: str) -> bool:
    return any(letter in SYMBOLS for _, letter in _pieces(template))


def components(template: str) -> list[str | None]:
    """The components of an absolute template: each literal one unescaped ('%%' -> '%'),
    None for one that holds a symbol (it differs per job)."""
    return [None if has_symbols(part) else part.replace("%%", "%") for part in template.split("/")]


def fixed_part(template: str) -> str:
    """The directory every job's expansion of template lies in: its components before
    the first one with a symbol (template itself when it has none)."""
    parts = components(template)
    if None not in parts:
        return template
    return "/".join(str(p) for p in parts[: parts.index(None)]) or "/"


def may_within(a: str, b: str) -> bool:
    """Could a (a template or a plain path) be b or lie below it, for some job? A
    component with a symbol may be any name."""
    pa, pb = components(a.rstrip("/") or "/"), components(b.rstrip("/") or "/")
    if b == "/":
        return True
    if len(pa) < len(pb):
        return False
    return all(x is None or y is None or x == y for x, y in zip(pa, pb, strict=False))


def may_overlap(a: str, b: str) -> bool:
    return may_within(a, b) or may_within(b, a)


def expand(template: str, job_id: str, user: str) -> str:
    """template with its symbols replaced (template checked by problem() first). A value
    that is not one safe path component refuses the job (UserError), and the result
    must still be an absolute path of non-empty components other than '.' and '..'."""
    if "%" not in template:
        return template
    values = {"j": job_id, "u": user}
    path = "".join(
        text or _safe(values[letter], letter, template) for text, letter in _pieces(template)
    )
    parts = path.split("/")
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts[1:]):
        raise JobnsError(f"[[dirs]] path = {template!r} expands to {path!r}, not a clean path")
    return path


def _safe(value: str, letter: str, template: str) -> str:
    """value, if it is one safe path component (job.safe_component's rule); else the job
    is refused."""
    try:
        return safe_component(value, SYMBOLS[letter], "")
    except JobnsError:
        raise UserError(
            f"[[dirs]] path = {template!r}: the {SYMBOLS[letter]} {value!r} is not a safe "
            f"path component for %{letter} (letters, digits, '.', '_', '-' only, not '.' "
            "or '..'); the job cannot be given this directory"
        ) from None
