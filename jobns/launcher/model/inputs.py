"""Inputs -> values: a command's options and the batch system's variables, validated.

Shared by the commands (run, setup, env, oci-config); nothing here touches the system.
"""

from __future__ import annotations

from jobns.launcher.model import config as config_mod
from jobns.launcher.model.job import (
    Job,
    hostname,
    job_id_from,
    layout_from,
    pmix_identity,
    user_from,
)
from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config

Options = dict[str, "str | bool | None"]


def kill_wait_from(opts: Options, config: Config) -> float:
    raw = opts.get("kill_wait")
    if raw is None:
        return config.kill_wait
    try:
        value = float(str(raw))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise JobnsError(f"--kill-wait {raw!r}: expected seconds between 0 and 86400")
    return value


def net_from(opts: Options) -> bool:
    """True for --net none."""
    net = opts.get("net") or "host"
    if net not in ("host", "none"):
        raise JobnsError(f"--net {net!r}: expected host or none")
    return net == "none"


def job_from(opts: Options, environ: dict[str, str]) -> Job:
    raw_id = opts.get("job_id")
    job_id = job_id_from(None if raw_id is None else str(raw_id), environ)
    user = user_from(str(opts["user"]) if opts.get("user") else None, environ)
    shared = opts.get("use_shared_tmpdir")
    nspace, rank = pmix_identity(job_id, environ)
    return Job(
        job_id,
        user,
        hostname(),
        layout_from(None if shared is None else str(shared)),
        bool(opts.get("no_rm_tmpdir")),
        nspace,
        rank,
    )


def config_from_run_env(values: dict[str, str]) -> Config:
    raw: dict[str, object] = {}
    if "arc.scratchdir" in values:
        raw["arc"] = {
            "shared_filesystem": bool(values["arc.shared_filesystem"]),
            "scratchdir": values["arc.scratchdir"],
            "movetool": values["arc.movetool"],
            "shared_scratch": values["arc.shared_scratch"],
        }
    return config_mod.Config(raw, "jobns setup")
