"""An OCI bundle's config.json: read safely, the few fields jobns needs, written atomically.

The bundle path comes from the runtime (the state on stdin) and is followed like
the runtime follows it; root.path is only joined to it here (jobns/hook/rootfs.py opens
it, following root's links only). config.json itself is opened without following a
link, and only the fields below are used, each checked with an error naming it.

process.user is who the container runs as; mapped through the container's user
namespace (the live init's maps when the hook has its pid, else linux.uidMappings)
it is the host uid that must own the job whose directories the container gets
(jobns/hook/identity.py, DESIGN.md rule 7).
"""

from __future__ import annotations

import errno
import os
import stat

from jobns.launcher.system.errors import JobnsError, printable_path

MAX_CONFIG = 4 << 20
CONFIG = "config.json"


class Bundle:
    __slots__ = ("annotations", "doc", "env", "path", "rootfs", "where")

    def __init__(self, path: str, doc: dict[str, object]) -> None:
        self.path = path
        self.doc = doc
        where = f"{path}/{CONFIG}"
        self.annotations = _str_map(doc.get("annotations"), f"{where}: annotations")
        root = doc.get("root")
        root_path = root.get("path") if isinstance(root, dict) else None
        if not isinstance(root_path, str) or not root_path:
            raise JobnsError(
                f"read {where}: root.path is missing or not a string; the bundle "
                "must name its root file system"
            )
        self.rootfs = rootfs_path(path, root_path)
        process = doc.get("process")
        process = process if isinstance(process, dict) else {}
        self.env = env_map(process.get("env"), where)
        self.where = where

    def process_user(self) -> tuple[int, int]:
        """process.user's uid and gid, as the container sees them (0 if unset)."""
        process = self.doc.get("process")
        user = process.get("user") if isinstance(process, dict) else None
        user = user if isinstance(user, dict) else {}
        uid, gid = user.get("uid", 0), user.get("gid", 0)
        if not _is_id(uid) or not _is_id(gid):
            raise JobnsError(f"read {self.where}: process.user.uid/gid must be numbers >= 0")
        assert isinstance(uid, int) and isinstance(gid, int)
        return uid, gid

    def process_ids(self, pid: int = 0) -> tuple[int, int]:
        """The host uid and gid the container's process runs as: process.user mapped
        through the container's user namespace, if it has one. With the pid of the
        container's init (a hook), its live /proc/PID/uid_map and gid_map are the truth;
        else (oci-config) linux.uidMappings and gidMappings."""
        uid, gid = self.process_user()
        if pid > 0:
            return live_host_ids(pid, uid, gid)
        return host_ids(self.doc, uid, gid, self.where)


def _is_id(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32


def _str_map(v: object, what: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise JobnsError(f"read {what}: must be an object of strings")
    return v


def rootfs_path(bundle: str, root_path: str) -> str:
    """root.path is relative to the bundle unless absolute (runtime-spec config.md#root)."""
    if root_path.startswith("/"):
        return os.path.normpath(root_path)
    return os.path.normpath(f"{bundle}/{root_path}")


def env_map(env: object, where: str) -> dict[str, str]:
    """process.env ["K=V", ...] -> {K: V} (the last one wins, as for execve's getenv)."""
    if env is None:
        return {}
    if not isinstance(env, list) or not all(isinstance(x, str) for x in env):
        raise JobnsError(f"read {where}: process.env must be a list of strings")
    out = {}
    for item in env:
        key, eq, value = item.partition("=")
        if eq:
            out[key] = value
    return out


def host_ids(doc: dict[str, object], uid: int, gid: int, where: str) -> tuple[int, int]:
    """The host uid/gid behind the container process's, through a user namespace's maps."""
    linux = doc.get("linux")
    if not isinstance(linux, dict):
        return uid, gid
    spaces = linux.get("namespaces")
    if not isinstance(spaces, list) or not any(
        isinstance(n, dict) and n.get("type") == "user" for n in spaces
    ):
        return uid, gid
    return (
        _map(linux.get("uidMappings"), uid, f"{where}: linux.uidMappings"),
        _map(linux.get("gidMappings"), gid, f"{where}: linux.gidMappings"),
    )


def live_host_ids(pid: int, uid: int, gid: int) -> tuple[int, int]:
    """The host uid/gid behind the container's, through the user namespace its init (pid)
    is in now: the runtime has written its maps before any createRuntime hook runs."""
    where = f"/proc/{pid}"
    try:
        theirs = os.stat(f"{where}/ns/user")
        mine = os.stat("/proc/self/ns/user")
    except OSError as e:
        raise JobnsError(
            f"read {where}/ns/user (the container's init): {e.strerror}; the "
            "state's pid is not a live process (run jobns as a createRuntime "
            "hook)"
        ) from None
    if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
        return uid, gid  # no user namespace of its own: its ids are ours
    return (_map_live(f"{where}/uid_map", uid, "uid"), _map_live(f"{where}/gid_map", gid, "gid"))


def _map_live(path: str, cid: int, what: str) -> int:
    """Map cid through a /proc/PID/{uid,gid}_map ("inside outside count" lines; read from
    another user namespace, 'outside' is in the reader's, the host's here)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode()
    except OSError as e:
        raise JobnsError(f"read {path} (the container's init): {e.strerror}") from None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(x.isdigit() for x in fields):
            c, h, n = (int(x) for x in fields)
            if c <= cid < c + n:
                return h + cid - c
    raise JobnsError(
        f"read {path}: the container's {what} {cid} (process.user) is not mapped "
        f"to the host; map it (linux.{what}Mappings) or run the container as a "
        f"mapped {what}"
    )


def _map(mappings: object, cid: int, where: str) -> int:
    for m in mappings if isinstance(mappings, list) else []:
        if not isinstance(m, dict):
            continue
        c, h, n = m.get("containerID"), m.get("hostID"), m.get("size")
        if _is_id(c) and _is_id(h) and _is_id(n):
            assert isinstance(c, int) and isinstance(h, int) and isinstance(n, int)
            if c <= cid < c + n:
                return h + cid - c
    raise JobnsError(
        f"read {where}: container id {cid} of process.user is not mapped; "
        "map it to the job user's host id"
    )


def _open_dir(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise JobnsError(
            f"open bundle {path}: {e.strerror}; the runtime's state names a "
            "bundle that is not there (removed already?)"
        ) from None


def read_doc(path: str) -> dict[str, object]:
    """config.json of the bundle at path, parsed (a JSON object)."""
    from jobns.launcher.system.jsonfast import loads

    printable_path(path, "open bundle")
    where = f"{path}/{CONFIG}"
    dfd = _open_dir(path)
    try:
        fd = os.open(CONFIG, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise JobnsError(
                f"read {where}: it is a symbolic link; jobns (root) reads only "
                "a regular config.json: copy the file into the bundle"
            ) from None
        raise JobnsError(f"read {where}: {e.strerror}; is {path} an OCI bundle?") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG:
            raise JobnsError(f"read {where}: not a regular file of at most {MAX_CONFIG} bytes")
        data = b""
        while chunk := os.read(fd, MAX_CONFIG + 1 - len(data)):
            data += chunk
            if len(data) > MAX_CONFIG:
                raise JobnsError(f"read {where}: larger than {MAX_CONFIG} bytes")
    finally:
        os.close(fd)
    try:
        doc = loads(data)
    except ValueError as e:
        raise JobnsError(f"read {where}: not JSON ({e}); fix the bundle") from None
    if not isinstance(doc, dict):
        raise JobnsError(f"read {where}: not a JSON object; fix the bundle")
    return doc


def load(path: str) -> Bundle:
    # Absolute now: the rootfs is opened again after setns, where the cwd (the bundle,
    # as runtimes run hooks) is reset to the namespace's root.
    path = os.path.abspath(printable_path(path, "open bundle"))
    return Bundle(path, read_doc(path))


def write_doc(path: str, doc: dict[str, object]) -> None:
    """Replace config.json atomically (launcher.system.files: temporary file, fsync,
    rename), keeping its owner and mode: a runtime reading it concurrently sees the old
    file or the new one."""
    import json

    from jobns.launcher.system import files

    where = f"{path}/{CONFIG}"
    data = json.dumps(doc, indent=2).encode() + b"\n"
    dfd = _open_dir(path)
    try:
        old = os.stat(CONFIG, dir_fd=dfd, follow_symlinks=False)
        owner = (old.st_uid, old.st_gid) if os.geteuid() == 0 else None
        files.write_atomic(dfd, CONFIG, data, stat.S_IMODE(old.st_mode), owner=owner)
        os.fsync(dfd)
    except OSError as e:
        raise JobnsError(f"write {where}: {e.strerror}") from None
    finally:
        os.close(dfd)
