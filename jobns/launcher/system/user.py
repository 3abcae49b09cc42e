"""Becoming another user: root, acting for someone else, takes on her identity.

The one place jobns changes its credentials (a task of `jobns run`, a namespace's holder,
a staging worker); who that user is, is the caller's to know (launcher.model.job).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Iterable


def switch_user(uid: int, gid: int, groups: Iterable[int]) -> None:
    """Become uid: its supplementary groups first, then gid, then uid (after setuid, root
    could no longer change the other two)."""
    os.setgroups(list(groups))
    os.setgid(gid)
    os.setuid(uid)
