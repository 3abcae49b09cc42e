"""The burst buffer (docs/admin.md "The burst buffer"): does this node's configuration
agree with Slurm's, and, on the controller, can slurmctld and slurmscriptd run it?

Every node with `[burst_buffer] enabled` (the config refuses it without shared_base):
slurm.conf naming burst_buffer/lua (slurm.conf is the same on every node), and the
records directory, if there is one yet, root's and private (a node ignores records
anywhere else). The controller (SlurmctldHost is this host): jobns's burst_buffer.lua
beside slurm.conf, pointing at this state_dir's pools.json and an executable jobns,
lua-posix installed, pools.json fresh (jobns-bb-pools.timer runs), and, when SlurmUser
is not root, sudo letting it run `jobns bb`.
"""

from __future__ import annotations

import glob
import os
import re
import socket
import stat
import subprocess
import time

from jobns.launcher.burstbuffer.record import DIR
from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding, _regular_text, _shown
from jobns.launcher.model.config import Config

LUA_TYPE = "burst_buffer/lua"
PACKAGED_LUA = "/usr/share/jobns/slurm/lua/burst_buffer.lua"
GUIDE = 'docs/admin.md "The burst buffer"'
POOLS_STALE = 300.0  # seconds: the timer measures every 30 s
# Where Debian's lua-posix (and a luarocks install) put the module Slurm's Lua loads.
POSIX_MODULES = (
    "/usr/share/lua/5.*/posix/init.lua",
    "/usr/local/share/lua/5.*/posix/init.lua",
)


def burst_buffer_findings(
    config: Config, values: dict[str, str], conf_dir: str, host: str | None = None
) -> list[Finding]:
    """The findings about the burst buffer; none on a node that neither enables it nor
    names jobns's burst_buffer.lua."""
    bb_type = values.get("burstbuffertype", "").strip()
    lua_path = f"{conf_dir}/burst_buffer.lua"
    lua = _regular_text(lua_path) if bb_type == LUA_TYPE else None
    ours = lua is not None and _lua_value(lua, "JOBNS_LUA_DIR") is not None
    if config.burst_buffer.get("enabled") is not True:
        if ours:
            return [
                (
                    NOTE,
                    f"slurm.conf runs jobns's {lua_path} but [burst_buffer] enabled is not "
                    "true: it checks #JOBNS lines at submission, and each node's prolog "
                    "does the staging (set it on the controller and every node to stage "
                    f"before the job is allocated: {GUIDE})",
                )
            ]
        return []
    found: list[Finding] = []
    if bb_type != LUA_TYPE:
        found.append(
            (
                PROBLEM,
                f"[burst_buffer] enabled, but slurm.conf's BurstBufferType is "
                f"{_shown(bb_type) or 'unset'}: Slurm runs no jobns bb step, so no job gets "
                f"a burst buffer; fix: BurstBufferType={LUA_TYPE} in slurm.conf ({GUIDE})",
            )
        )
    if config.shared_base:
        found += _records(f"{config.shared_base.rstrip('/')}/{DIR}")
    if bb_type == LUA_TYPE and _is_controller(values, host or socket.gethostname()):
        found += _controller(config, values, lua_path, lua if ours else None)
    return found


def _records(path: str) -> list[Finding]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return [(OK, f"burst buffer: no {path} yet (the first jobns bb setup makes it)")]
    except OSError as e:
        return [(PROBLEM, f"burst buffer: {path}: {e.strerror}; fix: check shared_base's mount")]
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        return [
            (
                PROBLEM,
                f"burst buffer: {path} is not root's private directory (uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}): every node ignores the records in it (a "
                "job's #JOBNS header, the copies done); fix: remove it, the controller's next "
                "jobns bb setup makes it (root's, 0700)",
            )
        ]
    return [(OK, f"burst buffer: records in {path} (root's, 0700)")]


def _is_controller(values: dict[str, str], host: str) -> bool:
    """SlurmctldHost (or the older ControlMachine) names this host: `name` or
    `name(address)`. The last such line wins (slurm_conf_values keeps one per key)."""
    named = values.get("slurmctldhost") or values.get("controlmachine") or ""
    name = named.split("(", 1)[0].strip()
    return bool(name) and name in (host, host.split(".", 1)[0])


def _controller(
    config: Config, values: dict[str, str], lua_path: str, lua: str | None
) -> list[Finding]:
    if lua is None:
        return [
            (
                PROBLEM,
                f"burst buffer: {lua_path} is not jobns's; fix: cp {PACKAGED_LUA} "
                f"{os.path.dirname(lua_path)}/ ({GUIDE})",
            )
        ]
    found: list[Finding] = []
    pools = f"{config.state_dir.rstrip('/')}/bb/pools.json"
    named = _lua_value(lua, "POOLS_FILE")
    if named != pools:
        found.append(
            (
                PROBLEM,
                f"burst buffer: {lua_path} reads the pool from {_shown(str(named))}, jobns "
                f"writes it to {pools} (state_dir); fix: set POOLS_FILE in {lua_path} to "
                f"{pools}",
            )
        )
    jobns = _lua_value(lua, "JOBNS") or ""
    if not (jobns.startswith("/") and os.access(jobns, os.X_OK)):
        found.append(
            (
                PROBLEM,
                f"burst buffer: {lua_path} runs {_shown(jobns)}, which is not an executable; "
                "fix: set JOBNS in it to the jobns program (/usr/bin/jobns from the package)",
            )
        )
    if not any(glob.glob(p) for p in POSIX_MODULES):
        found.append(
            (
                PROBLEM,
                "burst buffer: no Lua posix module (lua-posix): slurmscriptd cannot run "
                "jobns bb, so every burst-buffer job fails its setup; fix: apt-get install "
                "lua-posix",
            )
        )
    if not found:
        found.append((OK, f"burst buffer: {lua_path} is jobns's, runs {jobns}, reads {pools}"))
    found += _pools_age(pools)
    found += _sudo(values.get("slurmuser", "root").strip() or "root", jobns)
    return found


def _pools_age(pools: str, now: float | None = None) -> list[Finding]:
    try:
        age = (time.time() if now is None else now) - os.stat(pools).st_mtime
    except OSError:
        age = None
    if age is None or age > POOLS_STALE:
        what = "is missing" if age is None else f"was last written {age:.0f} s ago"
        return [
            (
                PROBLEM,
                f"burst buffer: {pools} {what}: Slurm's pool is not measured, so a job "
                "asking for capacity= is refused or waits on an old figure; fix: "
                "systemctl enable --now jobns-bb-pools.timer",
            )
        ]
    return [(OK, f"burst buffer: the pool measured {age:.0f} s ago ({pools})")]


def _sudo(slurm_user: str, jobns: str) -> list[Finding]:
    """burst_buffer.lua runs `sudo -n JOBNS bb ...` when SlurmUser is not root: sudo must
    allow exactly that without a password."""
    if slurm_user in ("root", "0") or not jobns:
        return []
    line = f"{slurm_user} ALL=(root) NOPASSWD: {jobns} bb *"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", slurm_user):
        return [(PROBLEM, f"burst buffer: SlurmUser {_shown(slurm_user)} is not a user name")]
    try:
        r = subprocess.run(
            ["sudo", "-n", "-l", "-U", slurm_user, jobns, "bb", "status"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
        allowed = r.returncode == 0
    except FileNotFoundError:
        return [
            (
                PROBLEM,
                f"burst buffer: SlurmUser is {slurm_user} and there is no sudo here: "
                f"burst_buffer.lua cannot run jobns bb as root; fix: apt-get install sudo, "
                f"and `{line}` in /etc/sudoers.d/jobns-bb",
            )
        ]
    except (OSError, subprocess.TimeoutExpired):
        allowed = False
    if allowed:
        return [(OK, f"burst buffer: sudo lets SlurmUser {slurm_user} run {jobns} bb")]
    return [
        (
            PROBLEM,
            f"burst buffer: SlurmUser is {slurm_user}, and sudo does not let it run "
            f"`{jobns} bb` without a password; fix: `{line}` in /etc/sudoers.d/jobns-bb",
        )
    ]


def _lua_value(lua: str, name: str) -> str | None:
    """The string a `local NAME = "..."` line of burst_buffer.lua sets."""
    m = re.search(rf'^local {name} = "([^"\n]*)"', lua, re.MULTILINE)
    return m.group(1) if m else None
