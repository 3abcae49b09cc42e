"""Where the burst buffer keeps its records (launcher.burstbuffer.record), and its
controller-side files.

The records live in ``<shared_base>/.jobns-bb/`` so that every node of a job reads what
the controller wrote. The directory is root's and 0700: a user who can create entries
in shared_base (a sticky, world-writable base) and made her own ``.jobns-bb`` (or a
symlink there) finds it moved aside by the controller (fs.move_aside), and a node never
reads a record from a directory that is not root's. Every name below it is opened
relative to its descriptor, never through a symlink.

On the controller, ``<state_dir>/bb/`` holds each job's lock (one ``jobns bb`` step of a
job at a time: a step slurmctld re-runs after a restart waits for one still running)
and ``pools.json``, which burst_buffer.lua's slurm_bb_pools reads (it may not fork).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from jobns.launcher.backing import fs
from jobns.launcher.burstbuffer.record import DIR, BbRecord, file_name
from jobns.launcher.model.config import Config
from jobns.launcher.system import files
from jobns.launcher.system.errors import JobnsError, warn
from jobns.launcher.system.locking import flock_within
from jobns.launcher.system.rootdir import ensure_root_dir

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_RECORD = 8 << 20  # a record holds a script header: bounded like Slurm's scripts
POOLS = "pools.json"
LOCK_WAIT = 600.0  # a step of the same job still running (slurmctld restarted meanwhile)


def records_dir(config: Config) -> str:
    return f"{config.shared_base.rstrip('/')}/{DIR}"


def open_records(config: Config, create: bool) -> int | None:
    """The records directory, opened; None when it does not exist (or, on a node, is not
    root's: then nothing in it is believed). create (the controller): make it, moving
    aside whatever else is at its place."""
    if not config.shared_base:
        raise JobnsError(
            "the burst buffer needs shared_base in the config "
            f"({config.source or 'no config file read'}): set it to a directory on the "
            "cluster file system that the controller and every node mount"
        )
    base = fs.open_base(config.shared_base, "shared_base")
    path = records_dir(config)
    try:
        for _attempt in range(5):
            try:
                fd = os.open(DIR, O_DIR, dir_fd=base)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(DIR, 0o700, dir_fd=base)
                except FileExistsError:
                    pass
                continue
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise JobnsError(f"open {path}: {e.strerror}") from None
                fd = -1
            if fd >= 0:
                st = os.fstat(fd)
                if st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o077 == 0:
                    return fd
                os.close(fd)
            if not create:
                warn(f"burst buffer: ignore {path}: it is not root's directory (mode 0700)")
                return None
            aside: list[str] = []
            fs.move_aside(base, DIR, path, aside)
            for note in aside:
                warn(f"burst buffer: {note}")
        raise JobnsError(f"create {path}: it keeps being replaced; look at who writes there")
    finally:
        os.close(base)


def load(config: Config, job_id: str) -> BbRecord | None:
    """The job's record, or None (not a burst-buffer job, or its teardown ran)."""
    dfd = open_records(config, create=False)
    if dfd is None:
        return None
    try:
        return load_at(dfd, job_id, records_dir(config))
    finally:
        os.close(dfd)


def handed_over(config: Config, job_id: str) -> BbRecord | None:
    """The prolog's question: what did the burst buffer do for this job? None when the
    site runs no jobns burst buffer ([burst_buffer] enabled) or the job asked for none."""
    if config.burst_buffer.get("enabled") is not True or not config.shared_base:
        return None
    return load(config, job_id)


def load_at(dfd: int, job_id: str, where: str) -> BbRecord | None:
    name = file_name(job_id)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JobnsError(f"read burst-buffer record {where}/{name}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_size > MAX_RECORD:
            raise JobnsError(
                f"read burst-buffer record {where}/{name}: not a regular file of root's "
                "of a sane size; remove it"
            )
        data = read_bounded(fd, MAX_RECORD)
    finally:
        os.close(fd)
    return BbRecord.from_json(data, f"{where}/{name}")


def read_bounded(fd: int, limit: int) -> bytes:
    """At most limit bytes of an open file, to its end."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def save_at(dfd: int, record: BbRecord) -> None:
    files.write_atomic(dfd, file_name(record.job_id), record.to_json(), 0o600, owner=(0, 0))


def delete_at(dfd: int, job_id: str) -> None:
    try:
        os.unlink(file_name(job_id), dir_fd=dfd)
    except FileNotFoundError:
        pass


def controller_dir(config: Config) -> str:
    """<state_dir>/bb, made root's 0755 (slurmctld's SlurmUser reads pools.json)."""
    path = f"{config.state_dir.rstrip('/')}/bb"
    os.makedirs(config.state_dir, mode=0o711, exist_ok=True)
    ensure_root_dir(path, 0o755, 0o022, "burst buffer")
    return path


class StepLock:
    """One `jobns bb` step of a job at a time, on the controller (flock, bounded wait)."""

    def __init__(self, config: Config, job_id: str) -> None:
        self.path = f"{controller_dir(config)}/{job_id}.lock"
        self.fd = -1

    def __enter__(self) -> StepLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if not flock_within(fd, fcntl.LOCK_EX, LOCK_WAIT, 0.2):
            os.close(fd)
            raise JobnsError(
                f"lock {self.path}: another jobns bb step of the job has held it "
                f"for {LOCK_WAIT:g} s; look at it with ps"
            )
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def remove(self) -> None:
        """The job's buffer is gone: so is its lock file (removed while held)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
