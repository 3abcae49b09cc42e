"""The backings of a job tree, one module each: what holds the tree's files.

A tree's backing is chosen once, when setup records the plan
(model.record.choose_backing), and kept in the job record with the tree; everything after
(make, release, the dry run, gc's sweep, status) asks the backing named there, never the
config again and never a guess from other fields.

    directory  a plain directory on its base's file system (no size)
    tmpfs      a size-limited tmpfs mounted on the tree root (sizelimit)
    disk       a loop-mounted image file of its own, in the base (diskimage)

A new backing (an XFS project quota, an LVM volume) is one module here, named as the
backing, whose BACKING is a Backing, plus its name in the schemas' "backing" enums
(config.schema.json's [[dirs]] backing, job-state.schema.json's tree backing).
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.capacity import Capacities
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.plan import Plan, Tree
    from jobns.launcher.model.record import TreeRecord
    from jobns.launcher.system.mountinfo import Identity, Mount

DEFAULT = "directory"


class Making:
    """What a backing needs to make one tree's file system: the tree (its root held by
    handle, verified), its record (rec: size, and where the backing notes what it made
    before it makes it), the owner of its file system, and save(), which writes the job
    record (what a crash must find is saved before it exists)."""

    __slots__ = ("config", "gid", "handle", "job_id", "rec", "save", "uid")

    def __init__(
        self,
        config: Config,
        rec: TreeRecord,
        handle: TreeHandle,
        job_id: str,
        owner: tuple[int, int],
        save: Callable[[], None],
    ) -> None:
        self.config = config
        self.rec = rec
        self.handle = handle
        self.job_id = job_id
        self.uid, self.gid = owner
        self.save = save


class Backing:
    """One backing. The base class is the plain directory: nothing to mount or release."""

    name = DEFAULT
    sized = False  # does the backing enforce a size (the tree's capacity)?

    def make(self, making: Making) -> Identity | None:
        """Put the backing's file system on the tree root; its mount's identity, or None
        when there is no mount."""
        return None

    def release(self, t: TreeRecord, ours: Callable[[Mount], bool]) -> list[str]:
        """Empty and detach the backing's mounts on a sealed tree's root (ours says which
        mounts are jobns's); problems, as lines."""
        return []

    def sweep(self, config: Config, keep_jobs: Callable[[], set[str]], dry: bool) -> list[str]:
        """gc: reclaim what this backing keeps outside the trees for jobs with no record."""
        return []

    def stale(self, config: Config) -> list[dict[str, object]]:
        """What of this backing outlives its job (a held reference), for gc and status."""
        return []

    def describe(self, config: Config, tree: Tree, size: int) -> list[str]:
        """The dry run's lines on what this backing would put on the tree (of size bytes)."""
        return []

    def stale_line(self, entry: dict[str, object]) -> str:
        """One line on a stale() entry: what it is, why it is there, how to end it."""
        return f"{self.name}: {entry}"


def of(name: str) -> Backing:
    """The backing named so in a record or the config."""
    if name not in names():
        raise ValueError(f"no such backing {name!r}: expected one of {', '.join(names())}")
    return _load(name)


def _load(name: str) -> Backing:
    backing: Backing = import_module(f"jobns.launcher.backing.{name}").BACKING
    return backing


def names() -> tuple[str, ...]:
    """Every backing, as the job record's schema lists them."""
    from jobns.schemas.generated import SCHEMAS

    tree = SCHEMAS["job-state.schema.json"]["$defs"]["tree"]  # type: ignore[index]
    return tuple(tree["properties"]["backing"]["enum"])


def every() -> list[Backing]:
    return [_load(name) for name in names()]


def held(config: Config) -> list[dict[str, object]]:
    """What of every backing outlives its job (Backing.stale), each entry naming its
    backing; for gc's warnings and `jobns status`."""
    return [{**entry, "backing": b.name} for b in every() for entry in b.stale(config)]


def held_line(entry: dict[str, object]) -> str:
    return of(str(entry.get("backing"))).stale_line(entry)


def describe(config: Config, plan: Plan, caps: Capacities | None) -> list[str]:
    """`jobns setup --dry-run`: what each sized tree's backing would put on it."""
    from jobns.launcher.model.record import choose_backing, size_of

    out: list[str] = []
    for tree in plan.trees:
        size = size_of(tree, caps)
        if size is not None:
            out += of(choose_backing(config, tree, size)).describe(config, tree, size)
    return out


def place(tree: Tree) -> str:
    """Where a backing's file system goes, in words: an extra directory's tree, or the
    tree of the job's /tmp or /dev/shm."""
    if tree.extra is not None:
        return tree.path
    from jobns.launcher.model.capacity import WHERE

    role = "tmp" if tree.role == "local" else tree.role
    return f"the {role} tree ({WHERE.get(role, tree.path)})"
