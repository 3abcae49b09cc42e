"""The shared tmpdir offered to Slurm as a burst-buffer pool (#BB_LUA pool=shared).

Slurm charges a job's ``capacity=`` against the pool when its stage-in starts and gives
it back after its teardown; a job that does not fit waits (BurstBufferResources) rather
than failing. What the pool holds comes from ``statvfs`` of shared_base, capped by
``[burst_buffer] size``, in units of ``[burst_buffer] granularity`` (Slurm rounds each
request up to one): ``quantity`` is the pool, ``free`` what the file system has free
(Slurm takes the larger of its own reservations and quantity - free as used). The
capacity is a reservation, not a quota: the shared tmpdir's file system is not limited
per job.

slurm_bb_pools runs inside slurmctld and may neither fork nor block on a cluster file
system, so it reads ``<state_dir>/bb/pools.json``, which every ``jobns bb`` step and
``jobns bb pools`` rewrite (docs/admin.md "The burst buffer").
"""

from __future__ import annotations

import json
import os

from jobns.launcher.burstbuffer import store
from jobns.launcher.burstbuffer.record import POOL
from jobns.launcher.model.config import Config, size_bytes
from jobns.launcher.system import files
from jobns.launcher.system.errors import JobnsError

DEFAULT_GRANULARITY = 1 << 20


class Settings:
    """[burst_buffer] of jobns.toml."""

    def __init__(self, config: Config) -> None:
        raw = config.burst_buffer
        self.enabled = raw.get("enabled", False) is True
        where = f"read config {config.source or '(built-in)'}: [burst_buffer]"
        gran = raw.get("granularity")
        self.granularity = (
            size_bytes(gran, f"{where} granularity", "1GiB")
            if gran is not None
            else DEFAULT_GRANULARITY
        )
        size = raw.get("size")
        self.size = size_bytes(size, f"{where} size", "10TiB") if size is not None else None


def measure(config: Config) -> dict[str, int | str]:
    """The pool as Slurm reads it: integers only."""
    settings = Settings(config)
    try:
        st = os.statvfs(config.shared_base)
    except OSError as e:
        raise JobnsError(f"measure shared_base {config.shared_base}: {e.strerror}") from None
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    cap = min(total, settings.size) if settings.size is not None else total
    gran = settings.granularity
    return {
        "id": POOL,
        "quantity": cap // gran,
        "granularity": gran,
        "free": min(free, cap) // gran,
    }


def publish(config: Config) -> str:
    """Measure the pool and write pools.json for slurm_bb_pools; the JSON written."""
    text = json.dumps({"pools": [measure(config)]}, sort_keys=True) + "\n"
    where = store.controller_dir(config)
    files.write_atomic(where, store.POOLS, text.encode(), 0o644, owner=(0, 0), fsync=False)
    return text
