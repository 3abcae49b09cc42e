"""The documentation holds together: every cited page and section exists, the README
stays short, and docs/config.md is what jobns/schemas/docgen.py writes (no root).

The citation format, in code, comments, --help text, scripts and documents:
  docs/PAGE.md "Heading"       a section by its heading text (README.md "Heading" too)
  docs/PAGE.md#anchor          a section by its anchor
  docs/PAGE.md                 a whole page
and in Markdown, links: [text](PAGE.md#anchor), [text](#anchor), [text](path).
A citation may wrap across comment lines. The old forms (README "Section", pointers to
documents outside the repository) are refused, so a new one cannot creep back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.backing import diskimage
from jobns.launcher.model import config
from jobns.launcher.mountns import cdi
from jobns.schemas import docgen

REPO = Path(__file__).resolve().parents[2]
# Where citations live.
SCANNED_DIRS = ("jobns", "ci", "containers", "tests", "debian", "docs")
SCANNED_FILES = ("README.md", "SECURITY.md", "pyproject.toml")
SKIPPED = {Path("tests/unit/test_docs.py")}

# A page, then optionally an anchor or a quoted heading; the heading may wrap across
# comment lines ("#", "*", "//" continuation markers are dropped).
CITATION = re.compile(
    r"(?<![\w/.])((?:docs/[\w-]+|README|SECURITY)\.md)"
    r"""(?:#([\w-]+)|[ \t]+(["'])((?:(?!\3).){1,160}?)\3)?""",
    re.S,
)
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
OLD_FORMS = (
    re.compile(r"""README\s+\\?["']"""),  # README "Section": say which page now
    re.compile(r"\b[Ss]eed(?:\s+00\d|'s)"),  # documents that are not in the repository
    re.compile(r"shared/MACHINE\.md"),  # a file outside the repository
)


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    """The headings of a Markdown page, outside fenced code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m[1].strip())
    return out


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings(page):
        a = anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def scanned() -> Iterator[Path]:
    for name in SCANNED_FILES:
        yield REPO / name
    for d in SCANNED_DIRS:
        for p in sorted((REPO / d).rglob("*")):
            text_file = p.suffix in (".py", ".md", ".json", ".toml", ".c", ".sh", "")
            rel = p.relative_to(REPO)
            if p.is_file() and text_file and rel not in SKIPPED and "__pycache__" not in p.parts:
                yield p


def unwrap(text: str) -> str:
    """A heading wrapped across comment or string lines, as one line."""
    return re.sub(r"""["']?\s*\n\s*(?:#|\*|//|f?["'])?\s*""", " ", text).strip()


def broken_citations(path: Path, text: str) -> Iterator[str]:
    for m in CITATION.finditer(text):
        page = REPO / m[1]
        where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
        if not page.is_file():
            yield f"{where}: {m[1]} does not exist"
        elif m[2] and m[2] not in anchors(page):
            yield f"{where}: {m[1]} has no anchor #{m[2]}"
        elif m[4] and unwrap(m[4]) not in headings(page) and m[1] != "SECURITY.md":
            yield f"{where}: {m[1]} has no heading {unwrap(m[4])!r}"


def broken_links(path: Path, text: str) -> Iterator[str]:
    for m in MD_LINK.finditer(text):
        target = m[1]
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, frag = target.partition("#")
        page = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(REPO)}: link {target}"
        if not page.exists():
            yield f"{where}: no such file"
        elif frag and page.suffix == ".md" and frag not in anchors(page):
            yield f"{where}: no such anchor"


def test_every_cited_page_and_section_exists() -> None:
    problems: list[str] = []
    for path in scanned():
        text = path.read_text(errors="replace")
        problems += broken_citations(path, text)
        if path.suffix == ".md":
            problems += broken_links(path, text)
    assert not problems, "\n".join(problems)


def test_no_pointer_in_an_old_form() -> None:
    problems = []
    for path in scanned():
        text = path.read_text(errors="replace")
        for rx in OLD_FORMS:
            problems += [
                f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]!r}"
                for m in rx.finditer(text)
            ]
    assert not problems, 'cite docs/PAGE.md "Heading" instead:\n' + "\n".join(problems)


def test_the_checker_catches_a_missing_section() -> None:
    """The checker is not vacuous: a made-up heading and anchor are reported."""
    fake = REPO / "jobns" / "launcher" / "x.py"
    text = 'see docs/admin.md "No such section" and docs/users.md#nowhere and docs/nope.md'
    assert len(list(broken_citations(fake, text))) == 3
    wrapped = '# (docs/admin.md "Who is failed\n# by what")'
    assert list(broken_citations(fake, wrapped)) == []


def test_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines < 160, f"README.md has {lines} lines: move detail to docs/"


def test_every_docs_page_says_who_it_is_for() -> None:
    for page in sorted((REPO / "docs").glob("*.md")):
        first = page.read_text().split("\n\n")[1]
        assert first.startswith("For "), f"{page.name}: the line after the title says who it is for"


@pytest.mark.parametrize("name", ["config.md"])
def test_config_reference_is_generated(name: str) -> None:
    committed = (REPO / "docs" / name).read_text()
    assert committed == docgen.render(), (
        "docs/config.md is stale: run python -m jobns.schemas.docgen"
    )


def schema_default(*path: str) -> object:
    node = json.loads(docgen.SCHEMA.read_text())
    for key in path:
        node = node["items"] if key == "[]" else node["properties"][key]
    return node["default"]


def test_the_documented_defaults_are_the_programs() -> None:
    """docs/config.md shows the schema's defaults: they are what jobns does with an empty
    section (the defaults still live beside the code that reads each key)."""
    c = config.Config({"arc": {}, "dirs": [{"path": "/x", "base": "/b"}]}, None)
    assert c.arc is not None
    d = c.dirs[0]
    seen: dict[tuple[str, ...], object] = {
        **{(k,): v for k, v in config.DEFAULTS.items()},
        ("arc", "shared_filesystem"): c.arc.shared_filesystem,
        ("arc", "scratchdir"): c.arc.scratchdir,
        ("arc", "movetool"): c.arc.movetool,
        ("arc", "shared_scratch"): c.arc.shared_scratch,
        ("directives", "word"): c.directive_word,
        ("capacity", "scratch_base"): diskimage.DEFAULT_BASE,
        ("staging", "session_roots"): c.staging.session_roots,
        ("staging", "session_dir"): c.staging.session_dir,
        ("staging", "dynamic_scratch"): c.staging.dynamic_scratch,
        ("staging", "stdio"): c.staging.stdio,
        ("staging", "stage_roots"): c.staging.stage_roots,
        ("staging", "timeout"): c.staging.timeout,
        ("cdi", "version"): cdi.DEFAULT_VERSION,
        ("lifecycle", "pre_run"): c.lifecycle.pre_run,
        ("lifecycle", "post_run"): c.lifecycle.post_run,
        ("lifecycle", "program_timeout"): c.lifecycle.program_timeout,
        ("slurm", "enforce"): c.enforce,
        ("dirs", "[]", "backing"): d.backing,
        ("dirs", "[]", "options"): list(d.options),
    }
    for path, value in seen.items():
        assert schema_default(*path) == value, f"{'.'.join(path)}: schema {schema_default(*path)!r}"
