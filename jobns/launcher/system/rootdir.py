"""A directory only root may change, made if missing and checked if not.

Root keeps its own files (the helper's requests, the burst buffer's locks and pools) in
directories below state_dir. A directory already there is used only if it is root's, a
real directory (lstat: never a symlink), and has none of the `forbidden` mode bits; else
the caller's operation stops with one line saying how to mend it.
"""

from __future__ import annotations

import os
import stat

from jobns.launcher.system.errors import JobnsError


def ensure_root_dir(path: str, mode: int, forbidden: int, user: str) -> None:
    """mkdir path (mode; its parent must exist), then check it. user names the
    operation in the error ("helper", "burst buffer")."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & forbidden:
        raise JobnsError(
            f"{user}: {path} must be a directory of root's, mode {mode:04o}; "
            "remove it (jobns makes it again)"
        )
