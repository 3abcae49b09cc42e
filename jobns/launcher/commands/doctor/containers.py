"""Containers: the Container Device Interface directory ([cdi] dir), root's to write."""

from __future__ import annotations

import os
import stat

from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding

DEFAULT_CDI_DIR = "/etc/cdi"


def cdi(directory: str, configured: bool = False) -> list[Finding]:
    """Container Device Interface specs are root's to write: a spec can add any mount and
    hook to a container. configured: it is [cdi] dir, where jobns setup writes each job's
    spec (launcher.mountns.cdi)."""
    off = (
        []
        if configured
        else [
            (
                NOTE,
                "CDI is off ([cdi] dir unset): set it (e.g. "
                "/var/run/cdi) to give containers a job's directories "
                "through --device jobns.dev/job=JOB-ID",
            )
        ]
    )
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if configured:
            parent = os.path.dirname(directory.rstrip("/")) or "/"
            if os.path.isdir(parent):
                return [(OK, f"CDI directory {directory}: made by the first jobns setup")]
            return [
                (
                    PROBLEM,
                    f"CDI directory {directory} ([cdi] dir) cannot be made: "
                    f"{parent} does not exist; fix: create it, or change [cdi] dir",
                )
            ]
        return [*off, (NOTE, f"no CDI directory {directory}")]
    except OSError as e:
        return [(PROBLEM, f"CDI directory {directory}: {e.strerror}")]
    if not stat.S_ISDIR(st.st_mode):
        return [(PROBLEM, f"CDI directory {directory} is not a directory; fix: remove it")]
    if st.st_uid != 0 or st.st_mode & 0o022:
        return [
            (
                PROBLEM,
                f"CDI directory {directory} is writable by others than root (uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): a user could add mounts "
                f"and hooks to containers; fix: chown root {directory} && chmod 0755 "
                f"{directory}",
            )
        ]
    specs = sum(1 for n in os.listdir(directory) if n.startswith("jobns-"))
    where = " ([cdi] dir: jobns setup writes each job's spec here)" if configured else ""
    return [*off, (OK, f"CDI directory {directory}: root's{where}; {specs} jobns spec(s)")]
