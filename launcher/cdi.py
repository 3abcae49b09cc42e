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
(pre-run), `jobns teardown` removes it first thing (any state: also after a crash,
through recover), and `jobns gc` removes specs whose job has no record. One device
per job, in our own kind (jobns.dev/job), named by the job id:

  containerEdits.mounts  the job's binds (host paths of the record's trees, each
                         checked by (st_dev, st_ino) against the tree opened and
                         verified by fd just before: never a path that is not the
                         job's verified tree), rbind,nosuid,nodev
  containerEdits.env     the job environment (launcher.environment: TMPDIR, PMIx, ARC)
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
of another user cannot: it binds as that user, who cannot enter the job's 0700 tree
roots.
"""

from __future__ import annotations

import os
import stat

from jobns.launcher.errors import JobnsError, UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from jobns.launcher.config import Config
    from jobns.launcher.fs import TreeHandle
    from jobns.launcher.job import Job
    from jobns.launcher.plan import Plan

KIND = "jobns.dev/job"
VERSIONS = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0")
DEFAULT_VERSION = "0.5.0"
PREFIX = "jobns-"
MOUNT_OPTIONS = ["rbind", "nosuid", "nodev"]
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CdiConfig:
    __slots__ = ("dir", "owner_check", "version")

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


def verified_binds(plan: Plan, handles: list[TreeHandle]) -> list[tuple[str, str]]:
    """(target, host source) of the plan's binds, each source checked now: the path,
    looked up without following a link at its end, is the directory the verified
    handle holds. Else UserError (her tree root is hers to rename: a swap fails her job,
    never the node): such a spec is never written."""
    from jobns.launcher import fs

    out = []
    for b in plan.binds:
        tree = plan.trees[b.tree]
        src = tree.path + (f"/{b.child}" if b.child else "")
        want = fs.identity(handles[b.tree], b.child)
        try:
            st = os.stat(src, follow_symlinks=False)
        except OSError as e:
            raise UserError(
                f"write the CDI spec of the job: {src}: {e.strerror} (moved "
                "while setting up?); refusing"
            ) from None
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != want:
            raise UserError(
                f"write the CDI spec of the job: {src} is not the job's verified "
                "directory (replaced while setting up?); refusing"
            )
        out.append((b.target, src))
    return out


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
    """Write the spec atomically; returns its path."""
    import json
    from errno import ENOSPC

    from jobns.launcher import state

    if not device_name_ok(job_id):
        raise JobnsError(
            f"write the CDI spec of job {job_id!r}: not a valid CDI device name "
            "(a letter or digit first); use another job id or unset [cdi] dir"
        )
    fd = _open_dir(c.dir, create=True)
    assert fd is not None
    name = spec_name(job_id)
    tmp = f".{name}.tmp-{os.getpid()}"  # not *.json: CDI never reads it
    path = f"{c.dir}/{name}"
    try:
        data = (json.dumps(doc, indent=1) + "\n").encode()
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        try:
            out = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=fd,
            )
            try:
                state.write_all(out, data)  # a short write on a filling /run is no spec
                os.fchmod(out, 0o644)
                os.fsync(out)
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError as e:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            full = "; its file system is full: free space on it" if e.errno == ENOSPC else ""
            raise JobnsError(f"write CDI spec {path}: {e.strerror}{full}") from None
    finally:
        os.close(fd)
    return path


def remove(config: Config, job_id: str) -> list[str]:
    """Remove the job's spec (absent: nothing to do). Returns error messages."""
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
        import sys

        sys.stderr.write(
            f"jobns: setup {job.job_id}: warning: no CDI spec: the job id is not "
            "a CDI device name (a letter or digit first)\n"
        )
        return None
    from jobns.launcher.environment import job_environment

    binds = verified_binds(plan, handles)
    hook = None
    if c.owner_check:
        import sys

        program = os.path.join(os.path.dirname(sys.executable), "jobns")
        opts = ["--config", os.path.abspath(config.source)] if config.source else []
        hook = [program, "hook", *opts, "--job-id", job.job_id, "createRuntime"]
    options = {b.target: b.options for b in plan.binds if b.options}
    doc = build(c, job.job_id, binds, job_environment(config, job), hook, options)
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
