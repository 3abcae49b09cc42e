"""The directory backing: a plain directory on its base's file system, with no size of
its own (what a tree without a capacity is). fs makes and removes it like every tree."""

from __future__ import annotations

from jobns.launcher.backing.base import Backing

BACKING = Backing()
