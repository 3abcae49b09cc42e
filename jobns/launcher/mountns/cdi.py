"""A CDI (Container Device Interface) spec per set-up job: containers get its directories
with no hook of jobns's own to start, from `podman run --device jobns.dev/job=JOB-ID`.

  config                 default        meaning
  [cdi] dir              ""  (off)      the CDI spec directory: /var/run/cdi (or /etc/cdi)
  [cdi] version          "0.5.0"        cdiVersion written (Podman 4.3's CDI library
                                        ignores a spec newer than 0.5.0; the fields used
                                        here are the same in 1.x)
  [cdi] owner_check      true           a createRuntime hook in the spec checks the
                                        container's user (SECURITY.md rule 7)

`jobns setup` writes <dir>/jobns-<job-id>.json as the last step before the job runs
(pre-run), `jobns teardown` removes it and detaches its mount points first thing (any
state: also after a crash, through recover), and `jobns gc` removes specs and mount
points whose job has no record. One device per job, in our own kind (jobns.dev/job),
named by the job id:

  containerEdits.mounts  the job's binds, rbind,nosuid,nodev: each host path is a
                         mount point of root's, <state_dir>/mounts/JOB/cdi/N-TARGET
                         (launcher.mountns.binds), onto which setup bound the job's verified
                         tree through an fd. Never the tree's own path: that goes
                         through her tree roots in sticky bases, which she can rename
                         aside and replace by a link to another job's tree, and the
                         engine (root) would follow it (issue 20, finding 7)
  containerEdits.env     the job environment (launcher.model.environment: TMPDIR, PMIx, ARC)
  containerEdits.hooks   (owner_check) `jobns hook --job-id JOB-ID createRuntime`

Written atomically (a root-only temporary name CDI does not read, then rename),
0644 root, into a directory that must be root's and writable by root only (a spec
directory others can write is anybody's devices).

What CDI cannot do: check who the container runs as. A spec is a list of edits the
engine applies to any container that names the device. So, with owner_check, the
spec carries a createRuntime hook: jobns hook with --job-id checks that the
container's process user (mapped to the host) is the job's owner, and that what the
runtime bound at /tmp, /var/tmp and /dev/shm is the job's verified trees (binding
them over anything else); it fails the container (exit 125) otherwise. That is one
Python start per container (no holder: the job's trees belong to its record). Without
it (owner_check = false: no process at all) the residual risk is SECURITY.md's
"CDI": a rootful container another user's process runs with the job's device gets
the job's /tmp and /var/tmp (mode 1777 directories) and /dev/shm. A rootless engine
cannot use the spec at all: it binds as its user, who cannot enter root's mount
points.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
from collections.abc import Callable
from errno import ENOSPC

from jobns.launcher.backing.fs import TreeHandle, detach_at
from jobns.launcher.model.config import Config
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.job import Job
from jobns.launcher.model.plan import SCRATCH_MODE, Bind, Plan
from jobns.launcher.mountns import binds
from jobns.launcher.mountns.binds import O_PATH_DIR, area
from jobns.launcher.system import files, mountinfo
from jobns.launcher.system.errors import JobnsError, UserError

KIND = "jobns.dev/job"
VERSIONS = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0")
DEFAULT_VERSION = "0.5.0"
PREFIX = "jobns-"
MOUNT_OPTIONS = ["rbind", "nosuid", "nodev"]
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CdiConfig:
    def __init__(self, config: Config) -> None:
        raw = config.raw.get("cdi")
        section = raw if isinstance(raw, dict) else {}
        self.dir = str(section.get("dir", "")).rstrip("/")
        self.version = str(section.get("version", DEFAULT_VERSION))
        self.owner_check = section.get("owner_check", True) is not False


def settings(config: Config) -> CdiConfig | None:
    """The CDI settings, or None when no spec directory is configured (CDI off)."""
    c = CdiConfig(config)
    return c if c.dir else None


def device_name_ok(job_id: str) -> bool:
    """CDI device names: a letter or digit, then letters, digits, '_', '.', ':', '-'."""
    return (
        bool(job_id)
        and job_id[0].isascii()
        and job_id[0].isalnum()
        and all(c.isascii() and (c.isalnum() or c in "_.:-") for c in job_id)
    )


def spec_name(job_id: str) -> str:
    return f"{PREFIX}{job_id}.json"


def device(job_id: str) -> str:
    """What `podman run --device` names."""
    return f"{KIND}={job_id}"


def build(
    c: CdiConfig,
    job_id: str,
    binds: list[tuple[str, str]],
    env: dict[str, str],
    hook: list[str] | None,
    options: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, object]:
    """PURE: the spec of one job. binds: (target in the container, host source); hook:
    the createRuntime hook's argv (its path is argv's first element), or None; options:
    a target's mount options besides rbind,nosuid,nodev (an extra directory's)."""
    edits: dict[str, object] = {
        "env": [f"{k}={v}" for k, v in env.items()],
        "mounts": [
            {
                "hostPath": src,
                "containerPath": target,
                "type": "bind",
                "options": [*MOUNT_OPTIONS, *(options or {}).get(target, ())],
            }
            for target, src in binds
        ],
    }
    if hook is not None:
        edits["hooks"] = [
            {"hookName": "createRuntime", "path": hook[0], "args": ["jobns", *hook[1:]]}
        ]
    return {
        "cdiVersion": c.version,
        "kind": KIND,
        "devices": [{"name": job_id, "containerEdits": edits}],
    }


def verified_binds(
    state_dir: str, job_id: str, plan: Plan, handles: list[TreeHandle]
) -> list[tuple[str, str]]:
    """(target, host path) of the plan's binds: each verified directory is bound, through
    an fd, onto a mount point of root's (launcher.mountns.binds: <state_dir>/mounts/JOB/cdi/),
    and the spec names that. The trees' own paths go through directories the job's user
    owns in sticky bases: she could rename one aside and put a link in its place, and
    the engine (root) would follow it into another user's tree.

    Each source is reached again from its tree's parent by name, without following a
    link or entering another file system, and must be the directory setup verified: a
    tree moved or replaced meanwhile refuses her job (UserError), never the node."""
    binds.release(state_dir, job_id)  # an interrupted earlier pre-run's
    return mount_points(state_dir, job_id, plan, handles, "cdi", "write the CDI spec of the job")


def point_paths(state_dir: str, job_id: str, plan: Plan, sub: str) -> list[tuple[str, str]]:
    """(target, root's mount point) of each of the plan's binds, in the area's sub."""
    return [(b.target, f"{area(state_dir, job_id)}/{sub}/{name}") for b, name in _names(plan)]


def _names(plan: Plan) -> list[tuple[Bind, str]]:
    return [(b, f"{i}{b.target.replace('/', '-')}"[:80]) for i, b in enumerate(plan.binds)]


def mount_points(
    state_dir: str, job_id: str, plan: Plan, handles: list[TreeHandle], sub: str, doing: str
) -> list[tuple[str, str]]:
    """point_paths(), each a mount point of root's onto which the bind's verified
    directory is bound through an fd (launcher.mountns.binds), unless it holds that directory
    already (made by an earlier call: `jobns oci-config` runs once per container).
    doing: what the caller does, for messages."""
    parent = binds.open_area(state_dir, job_id, sub)
    try:
        fcntl.flock(parent, fcntl.LOCK_EX)  # root's, 0700: only another of root's waits
        for b, name in _names(plan):
            handle = handles[b.tree]
            src = _reach(handle, b.child, plan.owner[0], doing)
            what = f"{handle.child_path(b.child)} onto {binds.area(state_dir, job_id)}/{sub}/{name}"
            try:
                if _holds(parent, name, src):
                    continue
                while detach_at(parent, name):  # an earlier call's, of another directory
                    pass
                try:
                    os.rmdir(name, dir_fd=parent)
                except FileNotFoundError:
                    pass
                binds.bind(src, parent, name, what, binds.keeping(b.options))
            finally:
                os.close(src)
    except OSError as e:
        raise JobnsError(f"{doing}: {binds.area(state_dir, job_id)}/{sub}: {e.strerror}") from None
    finally:
        os.close(parent)
    return point_paths(state_dir, job_id, plan, sub)


def _holds(parent: int, name: str, src: int) -> bool:
    """Is parent/name a mount point (of root's, in root's area) of the directory at src?"""
    try:
        fd = os.open(name, O_PATH_DIR, dir_fd=parent)
    except FileNotFoundError:
        return False
    try:
        return mountinfo.mount_id(fd) != mountinfo.mount_id(parent) and _same(
            os.fstat(fd), os.fstat(src)
        )
    finally:
        os.close(fd)


def _reach(handle: TreeHandle, child: str, uid: int, doing: str) -> int:
    """An O_PATH fd of the tree root (or its child) as its place names it now, checked to
    be what setup verified. O_PATH opens and fdinfo ask no file system anything, so a
    FUSE mount she put there (stalled or not) is told apart by its mount id before
    anything of it is looked at."""
    path = handle.child_path(child)
    here = mountinfo.mount_id(handle.fd)
    want = os.fstat(handle.fd)
    fds: list[int] = []
    try:
        fds.append(os.open(handle.tree.name, O_PATH_DIR, dir_fd=handle.parent_fds[-1]))
        ok = mountinfo.mount_id(fds[-1]) == here and _same(os.fstat(fds[-1]), want)
        if ok and child:
            fds.append(os.open(child, O_PATH_DIR, dir_fd=fds[-1]))
            st = os.fstat(fds[-1]) if mountinfo.mount_id(fds[-1]) == here else None
            ok = st is not None and (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, SCRATCH_MODE)
        if not ok:
            raise UserError(
                f"{doing}: {path} is not the job's verified "
                "directory (replaced while setting up?); refusing"
            )
        return fds.pop()
    except FileNotFoundError:
        raise UserError(
            f"{doing}: {path}: it is gone (moved while setting up?); refusing"
        ) from None
    except OSError as e:  # a link (ENOTDIR with O_DIRECTORY), a file
        raise UserError(
            f"{doing}: {path} is not the job's verified directory "
            f"({e.strerror}: replaced while setting up?); refusing"
        ) from None
    finally:
        for fd in fds:
            os.close(fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_dir(path: str, create: bool, check: bool = True) -> int | None:
    """The spec directory, checked (unless check is False): root's, writable by root only.
    None if it is absent and create is False."""
    if create:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError as e:
            raise JobnsError(
                f"create CDI spec directory {path}: {e.strerror}; fix [cdi] dir in the config"
            ) from None
    try:
        fd = os.open(path, O_DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JobnsError(
            f"open CDI spec directory {path}: {e.strerror}; fix [cdi] dir in the config"
        ) from None
    st = os.fstat(fd)
    if check and (st.st_uid != 0 or st.st_mode & 0o022):
        os.close(fd)
        raise JobnsError(
            f"refuse CDI spec directory {path}: not owned by root or writable by "
            "others (anybody could define devices there); fix it or [cdi] dir"
        )
    return fd


def write(c: CdiConfig, job_id: str, doc: dict[str, object]) -> str:
    """Write the spec atomically, 0644 and fsynced (its temporary name is no *.json: CDI
    never reads it); returns its path."""
    if not device_name_ok(job_id):
        raise JobnsError(
            f"write the CDI spec of job {job_id!r}: not a valid CDI device name "
            "(a letter or digit first); use another job id or unset [cdi] dir"
        )
    fd = _open_dir(c.dir, create=True)
    assert fd is not None
    name = spec_name(job_id)
    path = f"{c.dir}/{name}"
    try:
        data = (json.dumps(doc, indent=1) + "\n").encode()
        try:
            files.write_atomic(fd, name, data, 0o644)
        except OSError as e:
            full = "; its file system is full: free space on it" if e.errno == ENOSPC else ""
            raise JobnsError(f"write CDI spec {path}: {e.strerror}{full}") from None
    finally:
        os.close(fd)
    return path


def remove(config: Config, job_id: str) -> list[str]:
    """Remove the job's spec (absent: nothing to do), then detach the mount points it
    named (whatever the config says now: they hold the job's trees). Returns error
    messages."""
    return _remove_spec(config, job_id) + binds.release(config.state_dir, job_id)


def _remove_spec(config: Config, job_id: str) -> list[str]:
    c = settings(config)
    if c is None or not device_name_ok(job_id):
        return []
    try:
        # Unchecked: removing our one name never follows a link, and a spec directory that
        # went bad must not keep a job's spec (write refuses to write there).
        fd = _open_dir(c.dir, create=False, check=False)
    except JobnsError as e:
        return [str(e)]
    if fd is None:
        return []
    try:
        os.unlink(spec_name(job_id), dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        return [f"remove CDI spec {c.dir}/{spec_name(job_id)}: {e.strerror}"]
    finally:
        os.close(fd)
    return []


def publish(config: Config, job: Job, plan: Plan, handles: list[TreeHandle]) -> str | None:
    """setup: write the job's spec (if CDI is configured); returns its path."""
    c = settings(config)
    if c is None:
        return None
    if not device_name_ok(job.job_id):
        # Not the node's fault, nor worth failing the job: its tasks work, only CDI cannot
        # name it (Slurm's ids always can).
        sys.stderr.write(
            f"jobns: setup {job.job_id}: warning: no CDI spec: the job id is not "
            "a CDI device name (a letter or digit first)\n"
        )
        return None
    bound = verified_binds(config.state_dir, job.job_id, plan, handles)
    hook = None
    if c.owner_check:
        program = os.path.join(os.path.dirname(sys.executable), "jobns")
        opts = ["--config", os.path.abspath(config.source)] if config.source else []
        hook = [program, "hook", *opts, "--job-id", job.job_id, "createRuntime"]
    options = {b.target: b.options for b in plan.binds if b.options}
    doc = build(c, job.job_id, bound, job_environment(config, job), hook, options)
    return write(c, job.job_id, doc)


def orphans(config: Config, live: Callable[[], set[str]]) -> list[str]:
    """gc: job ids of jobns specs in the spec directory whose job live() does not list.
    The specs are listed first: a job set up meanwhile has its record before its spec."""
    c = settings(config)
    if c is None:
        return []
    try:
        names = os.listdir(c.dir)
    except OSError:
        return []
    ids = [n[len(PREFIX) : -5] for n in names if n.startswith(PREFIX) and n.endswith(".json")]
    jobs = live()
    return sorted(i for i in ids if i not in jobs)
