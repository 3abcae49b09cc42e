"""The programs root runs: found in a fixed list of system directories, never through
PATH, and started with a fixed environment, never the caller's.

slurmd starts a Prolog and an Epilog with only SLURM_* variables: no PATH. Python then
searches os.defpath (/bin:/usr/bin) and misses /usr/sbin, where mkfs.ext4 and mkfs.xfs
live: every disk capacity failed its prolog, and the node drained. And a PATH (or a
SQUEUE_FORMAT, SLURM_CLUSTERS, MKE2FS_CONFIG...) that reaches root's code is not root's
to trust. So every program root runs by name is resolved here (launcher.backing.diskimage,
slurmquery, gc, programs, transfer), and gets ``environment()``.

The system's directories come first; /usr/local's after them (a Slurm built from
source installs its commands there, and systemd gives services that PATH too), so
nothing there can stand in for a system program. A candidate that anyone but root
could replace (the file or its directory not root's, or writable by group or others)
is skipped.
"""

from __future__ import annotations

import errno
import os
import stat

DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
PATH = ":".join(DIRS)
# What to install for each program jobns runs by name (Debian's package names).
PACKAGES = {
    "mkfs.ext4": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "scontrol": "Slurm's commands (Debian: slurm-client) or set [slurm] bin_dir",
    "squeue": "Slurm's commands (Debian: slurm-client) or set [slurm] bin_dir",
}


class NotFound(FileNotFoundError):
    """A program root may not run from where it is, or that is nowhere it looks. An
    OSError, so each caller's handling of a failed exec applies as it is; strerror says
    where root looked and what to install."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(errno.ENOENT, why)
        self.program = name

    def __str__(self) -> str:
        return f"{self.program}: {self.strerror}"


def find(name: str, first: str = "") -> str:
    """The absolute path of the program name, searched in first (a directory the site
    named in jobns.toml: [slurm] bin_dir) and then DIRS. An absolute name, the site's
    own program from jobns.toml, is returned as it is. NotFound otherwise."""
    if name.startswith("/"):
        return name
    if not name or "/" in name:
        raise NotFound(name, "root runs a program by a plain name or an absolute path only")
    dirs = (first, *DIRS) if first else DIRS
    skipped = []
    for d in dirs:
        path = f"{d.rstrip('/')}/{name}"
        why = untrusted(path)
        if not why:
            return path
        if why != "missing":
            skipped.append(f"{path} ({why})")
    package = PACKAGES.get(name)
    fix = f"install {package}" if package else "install it in one of them"
    seen = f"; skipped {', '.join(skipped)}" if skipped else ""
    raise NotFound(
        name,
        f"not found in {', '.join(dirs)} (root never searches PATH){seen}; {fix}",
    )


def argv(cmd: list[str], first: str = "") -> list[str]:
    """cmd with its program resolved by find()."""
    return [find(cmd[0], first), *cmd[1:]]


def environment(base: dict[str, str] | None = None, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a program root runs: base (the caller's own fixed variables),
    then PATH (the fixed list: what the program itself runs is found where root's are)
    and LC_ALL=C (output jobns reads, and messages in the node's log, in one language),
    then the variables named in keep from jobns's own environment (SLURM_CONF: where a
    configless node's Slurm commands find the cluster; it comes from slurmd or root)."""
    env = dict(base or {})
    env.update(PATH=PATH, LC_ALL="C")
    env.update({k: os.environ[k] for k in keep if k in os.environ})
    return env


def untrusted(path: str) -> str:
    """'' when path is an executable file that only root can replace: it and every
    directory above it root's, none writable by others (a sticky one only lets an
    entry's owner, root here, replace it); else why not ('missing': nothing there)."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return "missing"
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
        return "not an executable file"
    where, sticky_ok = real, False
    while True:
        if st.st_uid != 0 or (st.st_mode & 0o022 and not sticky_ok):
            return (
                f"{where} is uid {st.st_uid}'s, mode {stat.S_IMODE(st.st_mode):04o}: "
                "others than root could replace the program"
            )
        if where == "/":
            return ""
        where = os.path.dirname(where)
        st = os.stat(where)
        sticky_ok = bool(st.st_mode & stat.S_ISVTX)
