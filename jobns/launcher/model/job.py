"""Who the job is: id, user, host and options, from flags and the batch system's variables.

Everything here becomes a path component or a uid handed to chown, so every
value is validated before it leaves this module.
"""

from __future__ import annotations

import os

from jobns.launcher.system.errors import JobnsError

LAYOUTS = ("local", "shared", "per-node")
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
MAX_COMPONENT = 128


def safe_component(value: str, what: str, fix: str, limit: int = MAX_COMPONENT) -> str:
    """value if it is one harmless path component, else a JobnsError naming `what`."""
    if not value:
        raise JobnsError(f"{what} is empty; {fix}")
    if len(value) > limit:
        raise JobnsError(f"{what} {value[:40]!r}... is longer than {limit} characters; {fix}")
    if value in (".", "..") or not set(value) <= _SAFE:
        raise JobnsError(
            f"{what} {value!r} is not a safe path component (letters, digits, "
            f"'.', '_', '-' only, not '.' or '..'); {fix}"
        )
    return value


class User:
    __slots__ = ("gid", "groups", "home", "name", "uid")

    def __init__(self, name: str, uid: int, gid: int, groups: tuple[int, ...], home: str) -> None:
        self.name = name
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.home = home

    def __repr__(self) -> str:
        return f"User({self.name!r}, uid={self.uid}, gid={self.gid})"


def user_ids(uid: int, gid: int) -> tuple[int, int, list[int]]:
    """The job user's uid, gid and groups (their current groups from NSS, if any)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
        groups = sorted(set(os.getgrouplist(name, gid)))
    except KeyError:
        groups = [gid]
    return uid, gid, groups


def lookup_user(spec: str) -> User:
    """A user by name or numeric uid, with its supplementary groups."""
    import pwd

    try:
        # isascii(): '²' is a digit to str.isdigit but no number to int().
        pw = pwd.getpwuid(int(spec)) if spec.isascii() and spec.isdigit() else pwd.getpwnam(spec)
    except (KeyError, OverflowError, ValueError):  # ValueError: a NUL or a lone surrogate
        raise JobnsError(
            f"look up user {spec!r}: no such user (check --user, SLURM_JOB_USER or SLURM_JOB_UID)"
        ) from None
    # getgrouplist asks NSS for this one user (no enumeration of a site's LDAP).
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def current_user() -> User:
    import pwd

    uid = os.getuid()
    try:
        pw = pwd.getpwuid(uid)
        name, home = pw.pw_name, pw.pw_dir
    except KeyError:
        # A container or a user namespace may have no passwd entry: still a valid caller.
        name, home = str(uid), "/"
    return User(name, uid, os.getgid(), tuple(sorted({os.getgid(), *os.getgroups()})), home)


class Job:
    """Everything jobns needs to know about one job on this node."""

    __slots__ = ("hostname", "job_id", "layout", "no_rm", "user")

    def __init__(
        self,
        job_id: str,
        user: User,
        hostname: str,
        layout: str = "local",
        no_rm: bool = False,
    ) -> None:
        if layout not in LAYOUTS:
            raise JobnsError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        self.job_id = job_id
        self.user = user
        self.hostname = hostname
        self.layout = layout
        self.no_rm = no_rm


MADE_UP_PREFIX = "run-"


def made_up_job_id() -> str:
    """The job id of a `jobns run` with neither --job-id nor SLURM_JOB_ID: run-PID-HEX.

    A Slurm job id is a decimal number, with an array (_N) or het (+N) suffix: one that
    starts with a letter is never one, so this id never names (or collides with) a real
    job, and gc never asks Slurm about it. The pid keeps two runs on one node apart; 48
    random bits keep runs of several nodes apart (a shared_base) and make the id
    unguessable before the run has made its trees (nobody can squat them in advance).
    """
    return f"{MADE_UP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}"


def job_id_from(flag: str | None, environ: dict[str, str]) -> str:
    raw = flag if flag is not None else environ.get("SLURM_JOB_ID")
    if raw is None:
        raise JobnsError("no job id: pass --job-id ID or run under Slurm (SLURM_JOB_ID)")
    return safe_component(raw, "job id", "pass --job-id with letters, digits, '.', '_', '-'")


def run_from(environ: dict[str, str], background: bool) -> str | None:
    """Which run of the job this is: Slurm's restart count (a requeue counts up), which
    slurmd gives the prolog and the epilog. A background setup or teardown comes from the
    packaged scripts, whose marks name "" when Slurm gave none; by hand without Slurm's
    variable there is no run (None: whatever run is recorded is taken as this one)."""
    raw = environ.get("SLURM_JOB_RESTART_COUNT")
    if raw is None:
        return "" if background else None
    if not (raw.isdigit() and raw.isascii() and len(raw) <= 10):
        raise JobnsError(f"SLURM_JOB_RESTART_COUNT is {raw[:20]!r}, not a count")
    return str(int(raw))


def user_from(flag: str | None, environ: dict[str, str]) -> User:
    """--user, else SLURM_JOB_USER / SLURM_JOB_UID, else the caller."""
    spec = flag or environ.get("SLURM_JOB_USER") or environ.get("SLURM_JOB_UID")
    if not spec:
        return current_user()
    user = lookup_user(spec)
    if os.getuid() != 0 and user.uid != os.getuid():
        raise JobnsError(
            f"run as user {user.name!r}: only root may run a job for another user "
            f"(you are uid {os.getuid()}); drop --user or run jobns as root"
        )
    if user.uid == os.getuid():
        # The caller's own credentials are the truth (e.g. groups granted by newgrp).
        return current_user() if os.getuid() != 0 else user
    return user


def hostname() -> str:
    name = os.uname().nodename.split(".", 1)[0]
    return safe_component(name, "host name", "set a host name made of letters, digits, '-'")


def layout_from(flag: str | None) -> str:
    """--use-shared-tmpdir[=per-node] -> layout name."""
    if flag is None:
        return "local"
    if flag in ("", "shared"):
        return "shared"
    if flag == "per-node":
        return "per-node"
    raise JobnsError(f"--use-shared-tmpdir={flag!r}: expected no value or 'per-node'")
