"""Inputs -> values: a command's request and the batch system's variables, validated.

Shared by the commands (run, setup, env, oci-config); nothing here touches the system.
"""

from __future__ import annotations

from jobns.launcher.model import config as config_mod
from jobns.launcher.model.job import (
    Job,
    hostname,
    job_id_from,
    layout_from,
    user_from,
)
from jobns.launcher.model.request import Options, Request
from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config

__all__ = ["Options", "Request", "config_from_run_env", "job_from", "kill_wait_from", "net_from"]


def kill_wait_from(req: Request, config: Config) -> float:
    raw = req.kill_wait
    if raw is None:
        return config.kill_wait
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise JobnsError(f"--kill-wait {raw!r}: expected seconds between 0 and 86400")
    return value


def net_from(req: Request) -> bool:
    """True for --net none."""
    net = req.net or "host"
    if net not in ("host", "none"):
        raise JobnsError(f"--net {net!r}: expected host or none")
    return net == "none"


def job_from(req: Request, environ: dict[str, str]) -> Job:
    job_id = job_id_from(req.job_id, environ)
    user = user_from(req.user, environ)
    return Job(job_id, user, hostname(), layout_from(req.shared), req.no_rm_tmpdir)


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
