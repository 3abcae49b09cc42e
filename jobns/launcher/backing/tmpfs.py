"""The tmpfs backing: a size-limited tmpfs on the tree root (mounted and detached by
sizelimit), gone with its mount: nothing of it outlives the job on disk."""

from __future__ import annotations

from collections.abc import Callable

from jobns.launcher.backing import sizelimit
from jobns.launcher.backing.base import Backing, Making, place
from jobns.launcher.model.capacity import human
from jobns.launcher.model.config import Config
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import TreeRecord
from jobns.launcher.system.mountinfo import Identity, Mount


class Tmpfs(Backing):
    name = "tmpfs"
    sized = True

    def make(self, making: Making) -> Identity | None:
        size = making.rec.capacity
        assert size is not None  # a sized backing is chosen only with a size
        return sizelimit.mount(making.handle, size, making.uid, making.gid, making.job_id)

    def describe(self, config: Config, tree: Tree, size: int) -> list[str]:
        return [
            f"mount  tmpfs size={size} ({human(size)}) on {place(tree)}, mode 0700, owned by "
            "the job user, nosuid,nodev"
        ]

    def release(self, t: TreeRecord, ours: Callable[[Mount], bool]) -> list[str]:
        # Unmounted first: removal never crosses into another file system.
        return sizelimit.unmount(t.tree, ours)


BACKING = Tmpfs()
