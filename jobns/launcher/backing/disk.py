"""The disk backing: an image file of its own in the base (scratch_base for /tmp, the
[[dirs]] entry's base for an extra directory), a file system in it, loop-mounted on the
tree root (diskimage). The image is named in the record before it is made, so teardown,
recover and gc find it whatever step a crash interrupts; gc sweeps the images of jobs
with no record, and a loop device a process still holds is reported as stale."""

from __future__ import annotations

from collections.abc import Callable

from jobns.launcher.backing import diskimage
from jobns.launcher.backing.base import Backing, Making, place
from jobns.launcher.model.capacity import human
from jobns.launcher.model.config import Config
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import TreeRecord
from jobns.launcher.system.mountinfo import Identity, Mount


class Disk(Backing):
    name = "disk"
    sized = True

    def make(self, making: Making) -> Identity | None:
        rec, config = making.rec, making.config
        assert rec.capacity is not None  # a sized backing is chosen only with a size
        tree = making.handle.tree
        base = tree.base if tree.extra is not None else None
        what = f"{tree.extra.target} (disk)" if tree.extra is not None else ""
        rec.image = _image(config, tree, making.job_id)
        making.save()
        fstype = diskimage.fs_type(config)
        diskimage.create(config, tree.role, making.job_id, rec.capacity, base, what)
        diskimage.make_fs(rec.image, fstype, making.uid, making.gid)
        return diskimage.mount(making.handle, rec.image, fstype, making.uid, making.gid)

    def describe(self, config: Config, tree: Tree, size: int) -> list[str]:
        image = _image(config, tree, "JOB")
        return [
            f"image  {image}: sparse file of {size} bytes ({human(size)}), "
            f"{diskimage.fs_type(config)} in it",
            f"mount  it through a loop device (autoclear) on {place(tree)}, owned by the job "
            "user, nosuid,nodev; teardown: shutdown, detach, unlink",
        ]

    def release(self, t: TreeRecord, ours: Callable[[Mount], bool]) -> list[str]:
        if t.image is None:
            return []  # setup stopped before it named the image: nothing was made
        return diskimage.unmount(t.tree, t.image, ours)

    def sweep(self, config: Config, keep_jobs: Callable[[], set[str]], dry: bool) -> list[str]:
        return diskimage.sweep(config, keep_jobs, dry)

    def stale(self, config: Config) -> list[dict[str, object]]:
        return diskimage.stale(config)

    def stale_line(self, entry: dict[str, object]) -> str:
        return diskimage.stale_line(entry)


def _image(config: Config, tree: Tree, job_id: str) -> str:
    """The image file of a tree's disk: an extra directory's goes in its own base (the
    local disk the site named), /tmp's in [capacity] scratch_base."""
    base = tree.base if tree.extra is not None else diskimage.base_of(config)
    return diskimage.image_path(base, tree.role, job_id)


BACKING = Disk()
