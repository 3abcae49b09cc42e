"""Reading /proc/self/mountinfo: which mounts exist, where, of what, from what; and which
mount an fd is on (its mount id), which is how root tells its own mounts from a user's.

A mount's source ("fsname" of a FUSE mount) and its mount point are strings a user can
choose or change; its mount id, its device and its file system type are the kernel's.
"""

from __future__ import annotations

import os


class Mount:
    __slots__ = ("dev", "fstype", "mount_id", "optional", "parent_id", "point", "root", "source")

    def __init__(
        self,
        dev: str,
        point: str,
        fstype: str,
        source: str,
        optional: tuple[str, ...] = (),
        mount_id: str = "",
        root: str = "/",
        parent_id: str = "",
    ) -> None:
        self.mount_id = mount_id  # as /proc/self/fdinfo/N's mnt_id names it
        self.parent_id = parent_id  # the mount this one is mounted on
        self.dev = dev  # "major:minor" of the mounted file system
        self.root = root  # the directory of that file system mounted here ("/": all of it)
        self.point = point  # the mount point, as this process sees it
        self.fstype = fstype
        self.source = source  # chosen by whoever mounted it: never proof of anything
        self.optional = optional  # propagation: shared:N, master:N, propagate_from:N


def mount_id(fd: int) -> str:
    """The id of the mount an open fd (O_PATH too) lies on, as mountinfo's first field
    names it. Reading fdinfo asks no file system anything (a stalled FUSE server cannot
    hang it)."""
    from jobns.launcher.system.errors import JobnsError

    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return line.split()[1]
    raise JobnsError("read /proc/self/fdinfo: no mnt_id (Linux 3.15 or later needed)")


def unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if "\\" not in field:
        return field  # nearly every field: no per-character walk (prolog and epilog)
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
                        fields[1],
                    )
                )
    return found


def by_id(mid: str) -> Mount | None:
    """The mount with this id (mount_id) in this process's namespace, if it is there."""
    for m in mounts():
        if m.mount_id == mid:
            return m
    return None


class Identity:
    """A mount as jobns made it: its mount id, its file system's device (st_dev) and its
    type, all three as the kernel gave them when jobns mounted it and recorded them in the
    job record. A user can name a FUSE mount anything (its source) and mount it anywhere
    she may write, but she cannot give it these: a mount is jobns's only if all three
    match (a reused mount id alone, after jobns's mount is gone, is not enough)."""

    __slots__ = ("dev", "fstype", "mount_id")

    def __init__(self, mount_id: int, dev: int, fstype: str) -> None:
        self.mount_id, self.dev, self.fstype = mount_id, dev, fstype

    @classmethod
    def of(cls, m: Mount) -> Identity:
        major, _, minor = m.dev.partition(":")
        return cls(int(m.mount_id), os.makedev(int(major), int(minor)), m.fstype)

    def matches(self, m: Mount) -> bool:
        return m.mount_id == str(self.mount_id) and self.same_fs(m)

    def same_fs(self, m: Mount) -> bool:
        """Is m (a bind of) the file system of this mount: same device, same type?"""
        return m.dev == f"{os.major(self.dev)}:{os.minor(self.dev)}" and m.fstype == self.fstype

    def to_dict(self) -> dict[str, object]:
        return {"id": self.mount_id, "dev": self.dev, "fstype": self.fstype}

    @classmethod
    def from_dict(cls, d: object) -> Identity | None:
        if not isinstance(d, dict):
            return None
        mid, dev, fstype = d.get("id"), d.get("dev"), d.get("fstype")
        if isinstance(mid, int) and isinstance(dev, int) and isinstance(fstype, str):
            return cls(mid, dev, fstype)
        return None


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
            'boot (mount --make-rshared /, as systemd does) - docs/design.md "Mount propagation"'
        )
    return ""
