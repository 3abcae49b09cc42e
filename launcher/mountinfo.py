"""Reading /proc/self/mountinfo: which mounts exist, where, of what, from what."""

from __future__ import annotations


class Mount:
    __slots__ = ("dev", "fstype", "mount_id", "optional", "point", "root", "source")

    def __init__(
        self,
        dev: str,
        point: str,
        fstype: str,
        source: str,
        optional: tuple[str, ...] = (),
        mount_id: str = "",
        root: str = "/",
    ) -> None:
        self.mount_id = mount_id  # as /proc/self/fdinfo/N's mnt_id names it
        self.dev = dev  # "major:minor" of the mounted file system
        self.root = root  # the directory of that file system mounted here ("/": all of it)
        self.point = point  # the mount point, as this process sees it
        self.fstype = fstype
        self.source = source
        self.optional = optional  # propagation: shared:N, master:N, propagate_from:N


def mount_id(fd: int) -> str:
    """The id of the mount an open fd (O_PATH too) lies on, as mountinfo's first field
    names it. Reading fdinfo asks no file system anything (a stalled FUSE server cannot
    hang it)."""
    from jobns.launcher.errors import JobnsError

    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return line.split()[1]
    raise JobnsError("read /proc/self/fdinfo: no mnt_id (Linux 3.15 or later needed)")


def unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts() -> list[Mount]:
    """Every mount of this process's namespace, in mount order (bottom first)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rest = right.split()
            if len(fields) >= 5 and len(rest) >= 2:
                found.append(
                    Mount(
                        fields[2],
                        unescape(fields[4]),
                        rest[0],
                        unescape(rest[1]),
                        tuple(fields[6:]),
                        fields[0],
                        unescape(fields[3]),
                    )
                )
    return found


def under(path: str) -> list[Mount]:
    """Mounts at path or anywhere below it, shallowest first (then bottom first)."""
    top = path.rstrip("/")
    inside = [m for m in mounts() if m.point == top or m.point.startswith(top + "/")]
    return sorted(inside, key=lambda m: 0 if m.point == "/" else m.point.count("/"))


def propagation_warning() -> str:
    """A warning if the host's / is not a shared mount: then a job's namespace (a slave
    of the host's mounts) never sees an NFS or autofs mount the host makes after the job
    started. Empty when all is well."""
    root = [m for m in mounts() if m.point == "/"]
    if root and not any(o.startswith("shared:") for o in root[-1].optional):
        return (
            "/ is a private mount on this node, so file systems the host mounts after a "
            "job started (NFS, autofs) never appear inside the job; make it shared at "
            'boot (mount --make-rshared /, as systemd does) - README "Mount propagation"'
        )
    return ""
