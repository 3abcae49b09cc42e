"""What every backing is (launcher/backing/kinds.py chooses among them): the Backing
interface, which is also the plain directory's; Making, what its make() is given; and
place(), a tree's place in words for the backings' messages. A backing's module imports
this one, never kinds, so that kinds may import every backing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field

from jobns.launcher.backing.fs import TreeHandle
from jobns.launcher.model.capacity import WHERE
from jobns.launcher.model.config import Config
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import TreeRecord
from jobns.launcher.system.mountinfo import Identity, Mount

DEFAULT = "directory"


@dataclass(slots=True)
class Making:
    """What a backing needs to make one tree's file system: the tree (its root held by
    handle, verified), its record (rec: size, and where the backing notes what it made
    before it makes it), the owner of its file system, and save(), which writes the job
    record (what a crash must find is saved before it exists)."""

    config: Config
    rec: TreeRecord
    handle: TreeHandle
    job_id: str
    owner: InitVar[tuple[int, int]]
    save: Callable[[], None]
    uid: int = field(init=False)
    gid: int = field(init=False)

    def __post_init__(self, owner: tuple[int, int]) -> None:
        self.uid, self.gid = owner


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


def place(tree: Tree) -> str:
    """Where a backing's file system goes, in words: an extra directory's tree, or the
    tree of the job's /tmp or /dev/shm."""
    if tree.extra is not None:
        return tree.path
    role = "tmp" if tree.role == "local" else tree.role
    return f"the {role} tree ({WHERE.get(role, tree.path)})"
