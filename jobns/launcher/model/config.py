"""Site configuration: a TOML file over built-in defaults.

Where the file is: ``--config PATH``, else ``$JOBNS_CONFIG``, else
``/etc/jobns/jobns.toml``; when none of these exists the built-in defaults
apply. A path named explicitly (flag or variable) must exist.

The reference of every key is docs/config.md; jobns/schemas/config.schema.json
is the contract, checked with jsonschema when a file is parsed (a cache miss: root keeps
the checked result in CACHE_PATH, so tasks and hooks never import jsonschema).
"""

from __future__ import annotations

import os

from jobns.launcher.system.errors import JobnsError

DEFAULT_PATH = "/etc/jobns/jobns.toml"
STAGE_TIMEOUT = 3600.0  # [staging] timeout's default: seconds a staging worker may run

DEFAULTS: dict[str, object] = {
    "local_base": "/tmp",
    "shm_base": "/dev/shm",
    "shared_base": "",
    "state_dir": "/run/jobns",
    "kill_wait": 30.0,
}


class ArcConfig:
    """arc.conf's job-scratch options (ARC), exported as RUNTIME_* variables."""

    __slots__ = ("movetool", "scratchdir", "shared_filesystem", "shared_scratch")

    def __init__(
        self, shared_filesystem: bool, scratchdir: str, movetool: str, shared_scratch: str
    ) -> None:
        self.shared_filesystem = shared_filesystem
        self.scratchdir = scratchdir
        self.movetool = movetool
        self.shared_scratch = shared_scratch


class StagingConfig:
    """[staging]: how setup finds an ARC job's session directory and which host
    directories #JOBNS stage_in/stage_out may read from or write to (docs/users.md "Staging")."""

    __slots__ = (
        "dynamic_scratch",
        "session_dir",
        "session_roots",
        "stage_roots",
        "stdio",
        "timeout",
    )

    def __init__(self, raw: dict[str, object]) -> None:
        self.session_roots = [str(r) for r in _list(raw.get("session_roots"))]
        self.session_dir = str(raw.get("session_dir", ""))
        self.dynamic_scratch = bool(raw.get("dynamic_scratch", False))
        stdio = raw.get("stdio")
        self.stdio = [str(n) for n in _list(stdio)] if stdio is not None else ["stdout", "stderr"]
        self.stage_roots = [str(r) for r in _list(raw.get("stage_roots"))]
        # Every staging worker's deadline; 0 (older configs' "no limit") is the default:
        # a worker stalled by a file system its user serves must end (docs/config.md).
        timeout = raw.get("timeout", STAGE_TIMEOUT)
        self.timeout = (
            float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else STAGE_TIMEOUT
        )


class LifecycleConfig:
    """[lifecycle]: the pre-run and post-run programs (like job_container's InitScript and
    the burst buffer's pre_run/post_run), run as root without a shell."""

    __slots__ = ("post_run", "pre_run", "program_timeout")

    def __init__(self, raw: dict[str, object]) -> None:
        self.pre_run = str(raw.get("pre_run", ""))
        self.post_run = str(raw.get("post_run", ""))
        timeout = raw.get("program_timeout", 300)
        self.program_timeout = float(timeout) if isinstance(timeout, (int, float)) else 300.0


class DirConfig:
    """One [[dirs]] entry: an extra job-private directory (docs/admin.md
    "Extra private directories"). size is in bytes (config.parse turns the site's text into
    bytes)."""

    __slots__ = ("backing", "base", "options", "path", "size")

    def __init__(self, raw: dict[str, object]) -> None:
        self.path = str(raw["path"])
        self.base = str(raw["base"])
        self.backing = str(raw.get("backing", "directory"))
        size = raw.get("size")
        self.size = dir_size(size, self.path) if size is not None else None
        self.options = tuple(sorted({str(o) for o in _list(raw.get("options"))}))


def dir_size(value: object, path: str, source: str = "") -> int:
    """A [[dirs]] size in bytes: an int, or size text ("200GiB") like a capacity's."""
    where = f"read config {source or '(built-in)'}: [[dirs]] path = {path!r}: size = {value!r}"
    return size_bytes(value, where, "200GiB")


def size_bytes(value: object, where: str, example: str) -> int:
    """A size the site wrote in its config, in bytes: a positive int, or text in the
    capacities' units ("4GiB"); anything else is a JobnsError that starts with where."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise JobnsError(f'{where}: expected a size such as "{example}" or a number of bytes')
    if isinstance(value, int):
        if value < 1:
            raise JobnsError(f"{where}: must be at least 1 byte")
        return value
    # directives costs ~15 ms to import (dataclasses, fractions): only when sizes are used.
    from jobns.launcher.model.directives import DirectiveError, NodeCount, parse_capacity

    try:
        size = parse_capacity(value)
    except DirectiveError as e:
        raise JobnsError(f"{where}: {e.problem}") from None
    if isinstance(size, NodeCount):
        raise JobnsError(f'{where}: a node count (N) is not a size; give e.g. "{example}"')
    return size


MIB = 1024**2
# The smallest disk-capacity image each file system is made in (with the options of
# launcher.backing.diskimage.make_fs), measured on Debian 12 (e2fsprogs 1.47.0, xfsprogs 6.1.0;
# tests/integration/test_disk_capacity.py::test_the_file_system_minimums_hold_for_this_mkfs
# checks them). launcher.model.capacity rounds a smaller tmp capacity up to it; a smaller
# [[dirs]] disk size or tmp_max is a config error (_check_disk_sizes):
# - mkfs.ext4 fails below 104 KiB ("Device size reported to be zero", "Illegal inode
#   number while writing reserved inodes", "Not enough space to build proposed
#   filesystem"), and at 104 KiB leaves 4 free inodes: too few for a job's tmp/, var_tmp/
#   and PMIx directories. 1 MiB (mke2fs.conf's "floppy" type: 128 inodes) leaves 117 and
#   a margin for other e2fsprogs releases.
# - mkfs.xfs refuses anything below 300 MiB ("Filesystem must be larger than 300MB",
#   xfsprogs 5.19 and later; 314572800 bytes is accepted).
FS_MIN_BYTES = {"ext4": 1 * MIB, "xfs": 300 * MIB}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _section(raw: dict[str, object], name: str) -> dict[str, object]:
    value = raw.get(name)
    return value if isinstance(value, dict) else {}


PID_NS_IGNORED = (
    "[namespace] pid = true is ignored: a PID namespace per job needs [slurm] enforce = "
    "true (without it the job's namespaces are its user's, and a PID namespace she owns "
    "hides nothing from her); set enforce with the SPANK plugin, or drop pid"
)


class Config:
    __slots__ = (
        "arc",
        "burst_buffer",
        "capacity",
        "directive_word",
        "dirs",
        "enforce",
        "kill_wait",
        "lifecycle",
        "local_base",
        "pid_ns",
        "raw",
        "shared_base",
        "shm_base",
        "slurm_bin",
        "source",
        "staging",
        "state_dir",
    )

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
        # Sizes stay strings/ints here: parsing them needs launcher.model.directives, which the
        # task-launch path must not import; setup parses them (launcher.model.capacity).
        self.capacity = _section(raw, "capacity")
        self.directive_word = str(_section(raw, "directives").get("word", "JOBNS"))
        self.staging = StagingConfig(_section(raw, "staging"))
        self.dirs = [DirConfig(d) for d in _list(raw.get("dirs")) if isinstance(d, dict)]
        self.lifecycle = LifecycleConfig(_section(raw, "lifecycle"))
        # [burst_buffer]: read by `jobns bb` and setup only (launcher.burstbuffer.pools).
        self.burst_buffer = _section(raw, "burst_buffer")
        # [slurm] enforce: the site's SPANK plugin puts every task in the job's namespace,
        # so the prolog makes that namespace root's (docs/admin.md "Enforced by Slurm").
        self.enforce = _section(raw, "slurm").get("enforce", False) is True
        # Where Slurm's commands are, if not in root's fixed directories (launcher.system.sysprog).
        self.slurm_bin = str(_section(raw, "slurm").get("bin_dir", ""))
        # [namespace] pid: a PID namespace per job, only where the namespace is root's
        # (launcher.mountns.pins); without enforce setup warns and doctor says so.
        self.pid_ns = _section(raw, "namespace").get("pid", False) is True


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
    for entry in _list(doc.get("dirs")):
        # Bytes from here on (and in the cache): tasks never parse a size.
        if isinstance(entry, dict) and entry.get("size") is not None:
            entry["size"] = dir_size(entry["size"], str(entry.get("path")), source)
    return doc


def check(doc: dict[str, object], source: str) -> None:
    problem = schema_error(doc)
    if problem is not None:
        raise JobnsError(f"read config {source}: {problem} (see docs/config.md)")
    _check_text(doc, source, "")
    for key in ("local_base", "shm_base", "shared_base", "state_dir"):
        value = doc.get(key)
        if isinstance(value, str) and value and not _is_clean_abspath(value):
            raise JobnsError(
                f"read config {source}: {key} = {value!r} must be an absolute, "
                "normalised path (no '..', '.', '//' or trailing '/')"
            )
    arc = doc.get("arc")
    if (
        isinstance(arc, dict)
        and arc.get("shared_filesystem") is False
        and not arc.get("scratchdir")
    ):
        raise JobnsError(
            f"read config {source}: [arc] shared_filesystem = false needs "
            "scratchdir: jobs cannot find their files otherwise (ARC's job scratch)"
        )
    _check_staging(doc, source)
    _check_dirs(doc, source)
    _check_disk_sizes(doc, source)
    _check_burst_buffer(doc, source)


def _check_burst_buffer(doc: dict[str, object], source: str) -> None:
    """[burst_buffer]: its sizes parse, and it needs the shared layout's base."""
    bb = _section(doc, "burst_buffer")
    for key, example in (("granularity", "1GiB"), ("size", "10TiB")):
        if key in bb:
            size_bytes(bb[key], f"read config {source}: [burst_buffer] {key}", example)
    if bb.get("enabled") is True and not doc.get("shared_base"):
        raise JobnsError(
            f"read config {source}: [burst_buffer] enabled needs shared_base (the burst "
            "buffer's records and the shared tmpdir live there)"
        )


def schema_error(doc: object) -> str | None:
    """What jobns/schemas/config.schema.json finds wrong with doc, as one line naming the
    key; None if nothing. Only parsing a file pays jsonschema's import (~100 ms): root
    keeps the checked result in CACHE_PATH (load), which tasks and hooks read."""
    import json
    from pathlib import Path

    import jsonschema

    odd = _non_finite(doc, ())
    if odd is not None:
        return odd
    schema = json.loads((Path(__file__).parents[2] / "schemas" / "config.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return None
    schema_at = error.schema if isinstance(error.schema, dict) else {}
    known = sorted(schema_at.get("properties", {}))
    path = tuple(error.absolute_path)
    return _say(error.validator, error.validator_value, error.instance, path, known)


def _where(path: tuple[object, ...]) -> str:
    """A key's place as an admin writes it (dirs[0].size); a key that is not plain text
    is quoted, so that the message stays one line whatever the file holds."""
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        else:
            k = str(key)
            plain = k and k.isprintable() and not any(c in k for c in " .[]'\"")
            out += ("." if out else "") + (k if plain else repr(k))
    return out or "(top level)"


# The schema keywords whose message is one sentence about the keyword's value.
_SAID = {
    "enum": "must be one of {value}",
    "const": "must be {value!r}",
    "minimum": "must be >= {value}",
    "maximum": "must be <= {value}",
    "minLength": "must be at least {value} characters",
    "maxLength": "must be at most {value} characters",
    "minItems": "must have at least {value} items",
    "pattern": "{instance!r} does not match {value!r}",
}


def _say(
    keyword: object, value: object, instance: object, path: tuple[object, ...], known: list[str]
) -> str:
    """One schema error in the words of docs/config.md (known: the keys allowed there)."""
    where = _where(path)
    if keyword == "type":
        names = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
        return f"{where}: must be of type {' or '.join(str(n) for n in names)}"
    if isinstance(keyword, str) and keyword in _SAID:
        return f"{where}: " + _SAID[keyword].format(value=value, instance=instance)
    if keyword == "required" and isinstance(instance, dict) and isinstance(value, list):
        missing = [k for k in value if k not in instance]
        return f"{where}: missing required key {missing[0]!r}"
    if keyword == "additionalProperties" and isinstance(instance, dict):
        unknown = next((k for k in instance if k not in known), None)
        if unknown is not None:
            return f"{_where((*path, unknown))}: unknown key (allowed: {', '.join(known)})"
    return f"{where}: does not match any allowed form"


def _non_finite(value: object, path: tuple[object, ...]) -> str | None:
    """TOML has nan and inf, JSON (and every number jobns reads) has not."""
    if isinstance(value, float) and value - value != 0.0:
        return f"{_where(path)}: must be a number ({value} is not a number in JSON)"
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _non_finite(item, (*path, key))
        if found is not None:
            return found
    return None


def _check_text(value: object, source: str, where: str) -> None:
    """No string may hold a NUL (the kernel and execve cut a path, an argument or a
    variable there) or a lone surrogate (it cannot be encoded for them at all)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_text(v, source, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, source, f"{where}[{i}]")
    elif isinstance(value, str):
        try:
            value.encode("utf-8", "surrogateescape")
            bad = "\0" in value
        except UnicodeEncodeError:
            bad = True
        if bad:
            raise JobnsError(
                f"read config {source}: {where} = {value!r}: a NUL or a lone "
                "surrogate cannot be part of a path, a command or a variable"
            )


def _check_staging(doc: dict[str, object], source: str) -> None:
    """What the schema cannot say about [arc], [staging] and [lifecycle]."""
    arc = _section(doc, "arc")
    staging = _section(doc, "staging")
    paths = [("arc", "scratchdir", arc.get("scratchdir"))]
    paths += [
        ("staging", key, p)
        for key in ("session_roots", "stage_roots")
        for p in _list(staging.get(key))
    ]
    for section, key, value in paths:
        if isinstance(value, str) and value and not _is_clean_abspath(value):
            raise JobnsError(
                f"read config {source}: [{section}] {key}: {value!r} must be an "
                "absolute, normalised path (no '..', '.', '//' or trailing '/')"
            )
    for name in _list(staging.get("stdio")):
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name:
            raise JobnsError(
                f"read config {source}: [staging] stdio: {name!r} must be a "
                "file name in the session directory (no '/')"
            )
    scratchdir = str(arc.get("scratchdir", ""))
    if staging.get("session_dir"):
        if not scratchdir:
            raise JobnsError(
                f"read config {source}: [staging] session_dir needs [arc] "
                "scratchdir: the job's files are moved there (ARC's job scratch)"
            )
        if not staging.get("session_roots"):
            raise JobnsError(
                f"read config {source}: [staging] session_dir needs "
                "session_roots (the sessiondir roots of arc.conf)"
            )
        for private in ("/tmp", "/var/tmp", "/dev/shm"):
            if scratchdir == private or scratchdir.startswith(private + "/"):
                raise JobnsError(
                    f"read config {source}: [arc] scratchdir = {scratchdir!r} "
                    f"is under {private}, which every job sees as its own "
                    "private directory; pick a directory outside it"
                )
    commands = [("arc", "movetool", arc.get("movetool"), False)]
    lifecycle = _section(doc, "lifecycle")
    commands += [("lifecycle", k, lifecycle.get(k), True) for k in ("pre_run", "post_run")]
    for section, key, value, absolute in commands:
        if not isinstance(value, str) or not value:
            continue
        import shlex

        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise JobnsError(
                f"read config {source}: [{section}] {key} = {value!r}: {e} "
                "(it is split like a shell would, but never run by one)"
            ) from None
        if not argv:
            raise JobnsError(f"read config {source}: [{section}] {key} is blank")
        if absolute and not argv[0].startswith("/"):
            raise JobnsError(
                f"read config {source}: [{section}] {key} = {value!r}: root runs "
                "it, so give the program as an absolute path"
            )


PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # every job's own already
SYSTEM = ("/proc", "/sys", "/dev")  # the kernel's: never covered


def _within(p: str, top: str) -> bool:
    """p is top or lies below it."""
    return p == top or p.startswith(top.rstrip("/") + "/")


def _check_dirs(doc: dict[str, object], source: str) -> None:
    """[[dirs]]: what the schema cannot say. Every path a job sees must be a new one
    (not already private, not the kernel's, not jobns's own state), and every base a
    directory of its own: trees of different kinds never share one, so gc and teardown
    never take one kind for another."""
    entries = [e for e in _list(doc.get("dirs")) if isinstance(e, dict)]
    if not entries:
        return
    state_dir = str(doc.get("state_dir", DEFAULTS["state_dir"]))
    capacity = _section(doc, "capacity")
    bases = [
        (f"{key} = {value!r}", value)
        for key, value in (
            ("local_base", doc.get("local_base", DEFAULTS["local_base"])),
            ("shm_base", doc.get("shm_base", DEFAULTS["shm_base"])),
            ("shared_base", doc.get("shared_base")),
            ("[capacity] scratch_base", capacity.get("scratch_base") or "/var/lib/jobns/scratch"),
            ("state_dir", state_dir),
        )
        if isinstance(value, str) and value
    ]
    from jobns.launcher.model.dirpath import may_overlap, may_within, problem

    seen: list[str] = []
    for entry in entries:
        path, base = str(entry["path"]), str(entry["base"])
        where = f"read config {source}: [[dirs]] path = {path!r}"
        for key, value in (("path", path), ("base", base)):
            if not _is_clean_abspath(value) or value == "/":
                raise JobnsError(
                    f"{where}: {key} = {value!r} must be an absolute, normalised path "
                    "other than / (no '..', '.', '//', trailing '/' or control characters)"
                )
        symbols = problem(path)
        if symbols:
            raise JobnsError(f"{where}: {symbols}")
        if "%" in base:
            raise JobnsError(
                f"{where}: base = {base!r}: base takes no symbols (one directory for "
                "every job; its trees are named job-ID already); use them in path"
            )
        # A component with a symbol (%j, %u) may be any name: refuse what some job's
        # expansion could make overlap.
        for private in PRIVATE:
            if may_overlap(path, private):
                raise JobnsError(
                    f"{where}: {private} is already private to every job; pick a path "
                    "that neither is, holds nor lies under /tmp, /var/tmp or /dev/shm"
                )
        for system in SYSTEM:
            if may_within(path, system):
                raise JobnsError(
                    f"{where}: {system} belongs to the kernel; pick a path outside "
                    "/proc, /sys and /dev"
                )
        if may_overlap(path, state_dir):
            raise JobnsError(
                f"{where}: it overlaps state_dir {state_dir!r} (jobns's own state); "
                "pick another path"
            )
        for other in seen:
            if may_overlap(path, other):
                raise JobnsError(
                    f"{where}: it is, holds or lies under the [[dirs]] path {other!r}; "
                    "give each extra directory a path of its own"
                )
        seen.append(path)
        for what, other_base in bases:
            if _within(base, other_base) or _within(other_base, base):
                raise JobnsError(
                    f"{where}: base = {base!r} overlaps {what}; give each [[dirs]] "
                    "entry a base directory of its own (gc tells trees apart by base)"
                )
        bases.append((f"the base of [[dirs]] path = {path!r}", base))
        backing = entry.get("backing", "directory")
        if backing == "directory" and entry.get("size") is not None:
            raise JobnsError(
                f'{where}: a size needs backing = "tmpfs" or "disk" (a plain '
                "directory cannot enforce one); drop size or pick a backing"
            )
        if backing != "directory":
            if entry.get("size") is None:
                raise JobnsError(
                    f'{where}: backing = "{backing}" needs a size, e.g. size = "200GiB"'
                )
            dir_size(entry["size"], path, source)


def _check_disk_sizes(doc: dict[str, object], source: str) -> None:
    """A site's size for a disk image (a [[dirs]] entry's, or tmp_max with disk-backed
    tmp capacities) below what its file system can be made in would fail every such job
    at setup: the site's mistake, named here (FS_MIN_BYTES)."""
    capacity = _section(doc, "capacity")
    sizes = [
        (f"[[dirs]] path = {e.get('path')!r}: size", e.get("size"))
        for e in _list(doc.get("dirs"))
        if isinstance(e, dict) and e.get("backing") == "disk"
    ]
    if capacity.get("tmp_backing") == "disk" and capacity.get("tmp_max") not in (None, ""):
        sizes.append(("[capacity] tmp_max", capacity.get("tmp_max")))
    if not sizes:
        return
    fstype = str(capacity.get("fs_type", "ext4"))
    minimum = FS_MIN_BYTES.get(fstype, 1)
    for what, value in sizes:
        size = size_bytes(value, f"read config {source}: {what} = {value!r}", "200GiB")
        if size < minimum:
            raise JobnsError(
                f"read config {source}: {what} = {value!r} ({size} bytes) is smaller than "
                f"{fstype}'s smallest file system, {minimum} bytes ({minimum // MIB} MiB, "
                f'[capacity] fs_type); fix: give at least "{minimum // MIB}MiB"'
            )


def _is_clean_abspath(p: str) -> bool:
    # No control character at all: these paths end up in messages, mounts and records.
    return p == "/" or (
        p.startswith("/")
        and os.path.normpath(p) == p
        and not any(c < " " or c == "\x7f" for c in p)
    )


def load(flag: str | None = None, environ: dict[str, str] | None = None) -> Config:
    environ = dict(os.environ) if environ is None else environ
    path, explicit = config_path(flag, environ)
    assert path is not None
    # The path is the caller's (--config, JOBNS_CONFIG): every message shows it, so a
    # line break or a terminal escape in it must not reach stderr raw.
    shown = path if path.isprintable() else repr(path)
    try:
        if "\0" in path:  # open() would raise ValueError, not OSError
            raise FileNotFoundError
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (
                os.path.abspath(path),
                st.st_dev,
                st.st_ino,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
            )
            cached = _read_cache(key)
            if cached is not None:
                return Config(cached, shown)
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        if explicit:
            raise JobnsError(
                f"read config {shown}: no such file (set --config or "
                "JOBNS_CONFIG to an existing file, or unset it)"
            ) from None
        return Config({}, None)
    except OSError as e:
        raise JobnsError(f"read config {shown}: {e.strerror}") from None
    raw = parse(text, shown)
    _write_cache(key, raw)
    return Config(raw, shown)


# The task-launch path must not pay for tomllib (~14 ms) on every task of a site that has
# a config file: root (the prolog, a root task) keeps the parsed, validated file here,
# keyed by the file's identity, and everyone reads it with marshal (built in, no import).
CACHE_PATH = "/run/jobns-config.cache"


def _read_cache(key: tuple[object, ...]) -> dict[str, object] | None:
    import marshal

    try:
        fd = os.open(CACHE_PATH, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_mode & 0o022:
            return None  # only root's cache is trusted
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        # Safe: only a root-owned, not group/other-writable file is read (checked above).
        cached_key, raw = marshal.loads(data)  # noqa: S302
    except (EOFError, ValueError, TypeError):
        return None
    return raw if cached_key == key and isinstance(raw, dict) else None


def _write_cache(key: tuple[object, ...], raw: dict[str, object]) -> None:
    if os.geteuid() != 0:
        return
    import marshal

    from jobns.launcher.system import files

    where, name = files.split(CACHE_PATH)
    try:
        data = marshal.dumps((key, raw))  # type: ignore[arg-type]
        files.write_atomic(where, name, data, 0o644, fsync=False)  # a cache: no fsync
    except (OSError, ValueError):
        pass
