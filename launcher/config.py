"""Site configuration: a TOML file over built-in defaults.

Where the file is: ``--config PATH``, else ``$JOBNS_CONFIG``, else
``/etc/jobns/jobns.toml``; when none of these exists the built-in defaults
apply. A path named explicitly (flag or variable) must exist.

The reference of every key is README "Configuration"; schemas/config.schema.json
is the contract and is enforced here by launcher.validate (cheap) so that the
task-launch path never imports jsonschema.
"""

from __future__ import annotations

import os

from launcher.errors import JobnsError

DEFAULT_PATH = "/etc/jobns/jobns.toml"

DEFAULTS: dict[str, object] = {
    "local_base": "/tmp",
    "shm_base": "/dev/shm",
    "shared_base": "",
    "state_dir": "/run/jobns",
    "kill_wait": 30.0,
}


class ArcConfig:
    """arc.conf's job-scratch options (seed 001), exported as RUNTIME_* variables."""

    __slots__ = ("movetool", "scratchdir", "shared_filesystem", "shared_scratch")

    def __init__(self, shared_filesystem: bool, scratchdir: str, movetool: str,
                 shared_scratch: str) -> None:
        self.shared_filesystem = shared_filesystem
        self.scratchdir = scratchdir
        self.movetool = movetool
        self.shared_scratch = shared_scratch


class Config:
    __slots__ = ("arc", "kill_wait", "local_base", "raw", "shared_base", "shm_base", "source",
                 "state_dir")

    def __init__(self, raw: dict[str, object], source: str | None) -> None:
        merged = {**DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS}}
        self.raw = raw
        self.source = source
        self.local_base = str(merged["local_base"])
        self.shm_base = str(merged["shm_base"])
        self.shared_base = str(merged["shared_base"])
        self.state_dir = str(merged["state_dir"])
        kw = merged["kill_wait"]
        assert isinstance(kw, (int, float))
        self.kill_wait = float(kw)
        arc = raw.get("arc")
        self.arc: ArcConfig | None = None
        if isinstance(arc, dict):
            self.arc = ArcConfig(
                shared_filesystem=bool(arc.get("shared_filesystem", True)),
                scratchdir=str(arc.get("scratchdir", "")),
                movetool=str(arc.get("movetool", "")),
                shared_scratch=str(arc.get("shared_scratch", "")),
            )


def config_path(flag: str | None, environ: dict[str, str]) -> tuple[str | None, bool]:
    """(path, explicit): which file to read and whether it must exist."""
    if flag:
        return flag, True
    env = environ.get("JOBNS_CONFIG")
    if env:
        return env, True
    return DEFAULT_PATH, False


def parse(text: str, source: str) -> dict[str, object]:
    """TOML text -> validated dict. Raises JobnsError naming the file and key."""
    # tomllib costs ~14 ms to import: only sites that have a file pay it.
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobnsError(f"read config {source}: not valid TOML: {e}") from None
    check(doc, source)
    return doc


def check(doc: dict[str, object], source: str) -> None:
    from launcher.validate import first_error
    from schemas.generated import SCHEMAS

    problem = first_error(doc, SCHEMAS["config.schema.json"])
    if problem is not None:
        raise JobnsError(f"read config {source}: {problem} (see README 'Configuration')")
    for key in ("local_base", "shm_base", "shared_base", "state_dir"):
        value = doc.get(key)
        if isinstance(value, str) and value and not _is_clean_abspath(value):
            raise JobnsError(f"read config {source}: {key} = {value!r} must be an absolute, "
                             "normalised path (no '..', '.', '//' or trailing '/')")
    arc = doc.get("arc")
    if isinstance(arc, dict) and arc.get("shared_filesystem") is False \
            and not arc.get("scratchdir"):
        raise JobnsError(f"read config {source}: [arc] shared_filesystem = false needs "
                         "scratchdir: jobs cannot find their files otherwise (seed 001)")


def _is_clean_abspath(p: str) -> bool:
    return p == "/" or (p.startswith("/") and os.path.normpath(p) == p and "\n" not in p)


def load(flag: str | None = None, environ: dict[str, str] | None = None) -> Config:
    environ = dict(os.environ) if environ is None else environ
    path, explicit = config_path(flag, environ)
    assert path is not None
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        if explicit:
            raise JobnsError(f"read config {path}: no such file (set --config or "
                             "JOBNS_CONFIG to an existing file, or unset it)") from None
        return Config({}, None)
    except OSError as e:
        raise JobnsError(f"read config {path}: {e.strerror}") from None
    return Config(parse(text, path), path)
