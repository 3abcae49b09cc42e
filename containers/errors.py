"""The one exception the rig raises: it names the operation that failed."""

from __future__ import annotations


class RigError(Exception):
    """A rig operation failed; the message says which one and what to do about it."""
