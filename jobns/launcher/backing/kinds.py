"""The backings of a job tree, one module each: what holds the tree's files.

A tree's backing is chosen once, when setup records the plan
(model.record.choose_backing), and kept in the job record with the tree; everything after
(make, release, the dry run, gc's sweep, status) asks the backing named there, never the
config again and never a guess from other fields.

    directory  a plain directory on its base's file system (no size)
    tmpfs      a size-limited tmpfs mounted on the tree root (sizelimit)
    disk       a loop-mounted image file of its own, in the base (diskimage)

A new backing (an XFS project quota, an LVM volume) is one module here, named as the
backing, whose BACKING is a Backing (launcher/backing/base.py), a line for it in LOADERS
below, and its name in the schemas' "backing" enums (config.schema.json's [[dirs]]
backing, job-state.schema.json's tree backing).
"""

from __future__ import annotations

from collections.abc import Callable

from jobns.launcher.backing.base import Backing
from jobns.launcher.model.capacity import Capacities
from jobns.launcher.model.config import Config
from jobns.launcher.model.plan import Plan
from jobns.launcher.model.record import choose_backing, size_of


def of(name: str) -> Backing:
    """The backing named so in a record or the config."""
    load = LOADERS.get(name)
    if load is None:
        raise ValueError(f"no such backing {name!r}: expected one of {', '.join(names())}")
    return load()


# A backing's module is imported only when that backing is asked for, never with this
# one: a job whose trees are plain directories loads neither tmpfs's nor disk's code.
def _directory() -> Backing:
    from jobns.launcher.backing import directory

    return directory.BACKING


def _tmpfs() -> Backing:
    from jobns.launcher.backing import tmpfs

    return tmpfs.BACKING


def _disk() -> Backing:
    from jobns.launcher.backing import disk

    return disk.BACKING


# Every backing, by the name its records and the config give it, in the order of the
# schemas' "backing" enums (tests/unit/test_backing.py checks that they agree).
LOADERS: dict[str, Callable[[], Backing]] = {
    "directory": _directory,
    "tmpfs": _tmpfs,
    "disk": _disk,
}


def names() -> tuple[str, ...]:
    """Every backing, as the schemas' enums list them."""
    return tuple(LOADERS)


def every() -> list[Backing]:
    return [load() for load in LOADERS.values()]


def held(config: Config) -> list[dict[str, object]]:
    """What of every backing outlives its job (Backing.stale), each entry naming its
    backing; for gc's warnings and `jobns status`."""
    return [{**entry, "backing": b.name} for b in every() for entry in b.stale(config)]


def held_line(entry: dict[str, object]) -> str:
    return of(str(entry.get("backing"))).stale_line(entry)


def describe(config: Config, plan: Plan, caps: Capacities | None) -> list[str]:
    """`jobns setup --dry-run`: what each sized tree's backing would put on it."""
    out: list[str] = []
    for tree in plan.trees:
        size = size_of(tree, caps)
        if size is not None:
            out += of(choose_backing(config, tree, size)).describe(config, tree, size)
    return out
