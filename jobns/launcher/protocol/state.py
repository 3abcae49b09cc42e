"""The node's file protocol: every name under the state directory (state_dir, default
/run/jobns), its format, who writes it and who reads it.

Version: RUN_ENV_VERSION ("1"), the first line of every run.env; the C side's
JOBNS_RUN_ENV_VERSION (jobns/slurm/jobns_node.h) is the same, and
tests/unit/test_protocol_golden.py proves that the C readers understand what this module
writes. Writers and readers are named by module (launcher.X is jobns/launcher/X.py);
"C" is jobns/slurm/jobns_node.h as the SPANK plugin, the job_container plugin and the PAM
module include it; "the scripts" are the packaged prolog and epilog (jobns/slurm/scripts/).
Only root writes anything here.

  <state_dir>/                 root 0711 (0755 when the SPANK plugin in slurmd made it
                               first), a private bind mount of itself: ensure_state_dir,
                               called by every Python writer; the prolog script may make
                               it, and jobs/, first. C checks it is root's and not
                               writable by others (jobns_open_root_owned)
  <state_dir>/jobs/            root 0755 (job ids are no secret: `jobns status` lists them);
                               list_jobs skips the locks, marks and temporary files in it
  <state_dir>/jobs/<id>.lock   root 0600, empty: setup, teardown, gc, recover, a release
                               and the OCI hook flock it exclusively (JobLock); C asks
                               whether it is held now (jobns_setup_under_way)
  <state_dir>/jobs/<id>.setup  the prolog's mark, "<run>\n" (SLURM_JOB_RESTART_COUNT, or
                               empty), written by the prolog script; read and removed here
                               (read_mark, mark_time, drop_mark, drop_mark_before: setup
                               and teardown); C reads its time (jobns_mark_at,
                               jobns_run_is_over, jobns_wait_for_setup); see "the marks"
  <state_dir>/jobs/<id>.ending the epilog's mark, the same format, written by the epilog
                               script; removed by teardown (drop_mark_before), or by setup
                               when older than the prolog's (drop_stale_ending); C: this
                               run is over when it is not older than <id>.setup
                               (jobns_run_is_over)
  <state_dir>/jobs/<id>/       root 0700, ACL: the job user may search (x), nobody else;
                               made with the job's first record (write_record)
      state.json               root 0600, ACL: the job user may read; the job record
                               (jobns/schemas/job-state.schema.json), for humans/tools:
                               launcher.model.record makes it, write_record writes it,
                               read_record reads it (setup, teardown, gc, recover, status,
                               the OCI hook). C never reads it.
      run.env                  root 0600, ACL: the job user may read; the join record:
                               the few values a task needs to join, as KEY=VALUE lines
                               (the task-launch path reads this, never JSON; see below).
                               write_run_env / close_run_env write it (called by
                               launcher.lifecycle.lifecycle); read_run_env reads it
                               (`jobns run`, `jobns env`), and so does C (jobns_open_dir,
                               jobns_wait_for_setup, jobns_check_open, jobns_value_of)
      ns/                      root 0700, ACL: the job user may search; made by
                               launcher.mountns.pins
      ns/user, ns/mnt          pins: /proc/HOLDER/ns/* bind-mounted onto empty files by
                               launcher.mountns.pins (which unmounts them; so does
                               remove_job_dir); `jobns run` opens the paths run.env names,
                               C opens ns/mnt (jobns_open_pin: root's namespace only)
      ns/pid                   the pin of the job's PID namespace ([namespace] pid), the
                               same way; C opens it when run.env has pid_pin
  <state_dir>/tasks-wait       empty, 0644: the SPANK plugin (C, in slurmd) makes it when
                               slurmd loads it and removes it when slurmd stops; the
                               prolog script (then it returns at once) and `jobns doctor`
                               look for it
  <state_dir>/propagation-checked  empty, root 0600: the once-per-boot marker of setup's
                               propagation warning (launcher.lifecycle.lifecycle, via touch)
  <state_dir>/gc.json          root 0600, JSON: the last `jobns gc`'s counts
                               (launcher.lifecycle.metrics: gc writes, status reads)
  <state_dir>/helper/          root 0700: the resident helper (launcher.commands.helper)
      pid                      its pid: the helper writes it (write_atomic), the scripts
                               (kill -0) and `jobns doctor` read it
      doorbell                 a FIFO: the helper makes it, the scripts write a byte
      requests/                root 0700, made by the helper
      requests/<id>.<verb>     a request: NUL-separated NAME=value, ending with
                               JOBNS_END=1; the scripts write it, the helper takes it
  <state_dir>/holds/           root 0700: container holds (jobns.hook.holds, the OCI hook;
      <id>/<container>         gc sweeps them): root 0700 directories, root 0600 files
                               of KEY=VALUE lines (version=1 first), flock'ed by the holder
  <state_dir>/locks/           root 0700: launcher.backing.diskimage
      disk-<major>:<minor>.lock  root 0600, empty: one disk-image base's lock (flock)
  <state_dir>/mounts/          root 0700: root's mount points (launcher.mountns.binds)
      <id>/                    a small tmpfs of root's per job (the job's area), holding
                               cdi/ (launcher.mountns.cdi), oci/ (jobns.hook.oci_config),
                               fill/ and stage (launcher.mountns.dirs); teardown and gc
                               release it
  <state_dir>/releases/        root 0700: launcher.lifecycle.release
      <id>~<hex>               root 0600, JSON lines (whose, then one per renamed tree),
                               flock'ed by its release process; recover and gc finish
                               one nobody holds
  .<name>.tmp-<pid>-<hex>      a file being replaced (write_atomic, through
                               launcher.system.files), beside <name>; gone on any failure
  .jobns-doctor-<pid>          `jobns doctor`'s scratch file for its ACL check, removed
                               at once (launcher.commands.doctor.node)

Inside a job's mount namespace state_dir is an empty read-only tmpfs showing only
jobs/<id>/, read-only (launcher.mountns.pins.show_only_own_state): no mark, no lock, and
the pins are empty files there; C reads run.env at once (jobns_wait_for_setup).

run.env, one KEY=VALUE a line (no newline in a value, none and no '=' in a key; a value
may hold '='; a reader splits at the first '='):
  version=1                    always first (RUN_ENV_VERSION); another version is refused
                               by both readers
  closed=<state>               while no task may join (a state of STATES: setup under way,
                               refused, or ending); then nothing but version and reason
  reason=<text>                with closed=refused: why, one line of at most MAX_REASON
  job_id, uid, gid, user, layout, user_pin, mnt_pin, mnt_ns (<st_dev>:<st_ino> of the
  mount namespace), pid_pin (only with [namespace] pid), kill_wait, arc.*
                               launcher.model.record.run_env_values
  enforced=1, env.NAME=VALUE   launcher.lifecycle.lifecycle.enforced_values: the job
                               environment every task gets ([slurm] enforce = true)
C uses version, closed, reason, uid (the PAM module), mnt_ns, pid_pin and the env. lines;
it reads at most JOBNS_RUN_ENV_MAX (64 KiB) of the file, and the SPANK plugin refuses a
task (the PAM module a login) whose env. line does not fit its 4200-byte buffer: it
never cuts one. Nothing here bounds either yet: a writer must stay within them.

Job state is private (SECURITY.md, rule 5): another user who could open a job's pin
could keep its namespace (and its capacity tmpfs) alive after teardown, or read its
record. A POSIX ACL names exactly the job's user; the group and other bits stay empty.

Every write is atomic (temporary file, then rename), so a crash leaves the old
record or the new one, never half of one; on a state_dir that outlives a reboot (not
tmpfs) the file is also fsynced before the rename (survives_reboot says why only there).

While the job is not running (set up, or ending) run.env says so (``closed=<state>``)
and no task may join: a task must neither see a half-staged job nor write into scratch
while its outputs are staged out.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from jobns.launcher.system import files, libc
from jobns.launcher.system.errors import JobnsError, describe_oserror

# The names under state_dir (the docstring says what each holds and who uses it); the C
# header and the scripts in jobns/slurm/ spell the ones they use themselves.
JOBS = "jobs"
RUN_ENV = "run.env"
STATE = "state.json"
TASKS_WAIT = "tasks-wait"
PROPAGATION_CHECKED = "propagation-checked"
GC_SUMMARY = "gc.json"
HELPER = "helper"
HELPER_PID = "pid"  # these three under HELPER
HELPER_DOORBELL = "doorbell"
HELPER_REQUESTS = "requests"
HOLDS = "holds"
LOCKS = "locks"
MOUNTS = "mounts"
RELEASES = "releases"

RUN_ENV_VERSION = "1"


FULL = "the file system of state_dir is full: free space on it (df -h and df -i show it)"


def job_dir(state_dir: str, job_id: str) -> str:
    return f"{state_dir}/{JOBS}/{job_id}"


def state_error(op: str, path: str, err: OSError) -> JobnsError:
    """A failure to write under state_dir: the node's fault (exit 125), said plainly; a
    full file system (blocks or inodes, or a quota) is named as such with its fix."""
    message = describe_oserror(op, path, err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        message += f"; {FULL}"
    return JobnsError(message)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def touch(path: str, what: str) -> None:
    """Create an empty root-only file (a marker) under state_dir, or say why not."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError as e:
        raise state_error(f"create {what}", path, e) from None


def _is_mount_root(path: str) -> bool:
    """Is path the root of a mount? Its mount id differs from its parent's ("..", which
    leaves a mount root for the mount beneath): two fdinfo reads, not a parse of every
    mount of the node on each prolog."""
    from jobns.launcher.system.mountinfo import mount_id

    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            return mount_id(fd) != mount_id(parent)
        finally:
            os.close(parent)
    finally:
        os.close(fd)


def ensure_state_dir(state_dir: str) -> None:
    """Create the state directory and make it a private mount of its own.

    Pins are bind mounts of namespace files. In a shared mount they would
    propagate into the very namespaces they pin (the kernel refuses that), so,
    like Slurm's job_container BasePath, the directory is bound onto itself and
    made private once per boot.
    """
    # makedirs gives the directories above JOBS 0777 & ~umask, and the caller's umask may
    # be 0: crun runs OCI hooks so, and a hook may be a node's first jobns call. A
    # world-writable state directory would be refused below for every later job.
    old_umask = os.umask(0o022)
    try:
        os.makedirs(f"{state_dir}/{JOBS}", mode=0o711, exist_ok=True)
    except OSError as e:
        raise state_error("create state directory", state_dir, e) from None
    finally:
        os.umask(old_umask)
    for path in (state_dir, f"{state_dir}/{JOBS}"):
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise JobnsError(
                f"refuse state directory {path}: it must be a directory owned by "
                "root and writable only by root; fix it or set state_dir"
            )
    # Job ids may be listed (as squeue lists them), so `jobns status` shows a user her own
    # jobs; what is in a job's directory stays private to root and its user.
    os.chmod(f"{state_dir}/{JOBS}", 0o755)  # noqa: S103 -- deliberate, see above
    if not _is_mount_root(state_dir):
        try:
            libc.mount(state_dir, state_dir, None, libc.MS_BIND)
            libc.mount(None, state_dir, None, libc.MS_PRIVATE)
        except OSError as e:
            raise JobnsError(f"make {state_dir} a private mount: {e.strerror}") from None


class JobLock:
    """Exclusive flock on <state_dir>/jobs/<id>.lock (root only)."""

    def __init__(self, state_dir: str, job_id: str, blocking: bool = True) -> None:
        self.path = f"{state_dir}/{JOBS}/{job_id}.lock"
        self.blocking = blocking
        self.fd = -1

    def __enter__(self) -> JobLock:
        while True:
            try:
                fd = os.open(
                    self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                )
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise  # no state directory yet: the caller knows what that means
                raise state_error("create job lock", self.path, e) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                raise JobnsError(f"job lock {self.path} is held by another jobns") from None
            # Whoever held it before may have removed the file: lock the current one.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    self.fd = fd
                    return self
            except FileNotFoundError:
                pass
            os.close(fd)

    def release_and_remove(self) -> None:
        """Remove the lock file while still holding it (the job is gone)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


# POSIX ACL as the kernel stores it in system.posix_acl_access (<linux/posix_acl_xattr.h>):
# a version word, then (tag u16, perm u16, id u32) entries sorted by tag.
_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 1, 2, 4, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def grant(fd: int, path: str, owner_perms: int, uid: int | None, perms: int) -> None:
    """Give exactly one user (besides root) `perms` (rwx bits 4/2/1) on the file open at
    fd; group and others get nothing. uid None or 0: only the owner's mode bits."""
    if not uid:
        os.fchmod(fd, owner_perms << 6)
        return
    entries = (
        (_ACL_USER_OBJ, owner_perms, _NO_ID),
        (_ACL_USER, perms, uid),
        (_ACL_GROUP_OBJ, 0, _NO_ID),
        (_ACL_MASK, perms, _NO_ID),
        (_ACL_OTHER, 0, _NO_ID),
    )
    # struct.pack("<I") and ("<HHI") by hand: the prolog need not import struct for this.
    data = _ACL_VERSION.to_bytes(4, "little") + b"".join(
        tag.to_bytes(2, "little") + perm.to_bytes(2, "little") + ident.to_bytes(4, "little")
        for tag, perm, ident in entries
    )
    try:
        os.setxattr(fd, "system.posix_acl_access", data)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # an ACL can need a block of its own
            raise state_error(f"give uid {uid} access to", path, e) from None
        raise JobnsError(
            f"give uid {uid} access to {path}: {e.strerror}; state_dir must be "
            "on a file system with POSIX ACLs (tmpfs, ext4, xfs)"
        ) from None


def private_dir(path: str, uid: int | None) -> bool:
    """mkdir-or-check a root-only directory the job user (uid) may only search; True if
    this call made it."""
    try:
        os.mkdir(path, 0o700)
        made = True
    except FileExistsError:
        made = False
    except OSError as e:
        raise state_error("create directory", path, e) from None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0:
            raise JobnsError(f"refuse {path}: not owned by root; remove it")
        grant(fd, path, 7, uid, 1)
    finally:
        os.close(fd)
    return made


def write_atomic(
    path: str, data: bytes, reader: int | None = None, what: str = "", durable: bool = True
) -> None:
    """Write a root-only file (mode 0600) atomically (launcher.system.files); `reader` (a
    uid) may read it. Whatever fails, the temporary file is gone again (a full state_dir
    gets no litter) and the error names the file; `what` says what it is (e.g. "job
    record"). durable=False: no fsync even where the file would outlive a reboot (a file
    that means nothing after one, such as run.env: see survives_reboot)."""
    where, name = files.split(path)
    try:
        files.write_atomic(
            where,
            name,
            data,
            0o600,
            prepare=lambda fd: grant(fd, path, 6, reader, 4),
            fsync=survives_reboot if durable else False,
        )
    except OSError as e:
        raise state_error(f"write {what}".rstrip(), path, e) from None


_SURVIVES: dict[int, bool] = {}  # st_dev -> does a write there outlive the node's uptime?


def survives_reboot(fd: int) -> bool:
    """Is the file at fd on a file system that keeps its content over a reboot (not
    tmpfs or ramfs, as the default state_dir under /run is on a systemd node)?

    Only there does write_atomic fsync. Its rename alone keeps a record whole (the old
    one or the new one) whenever jobns dies, since what was written is in the page
    cache; an fsync adds durability only against a crash of the whole node, after which
    a tmpfs holds nothing anyway. (On tmpfs an fsync costs next to nothing; where /run
    is a disk, as on these VMs or in a container, each costs a journal commit, ~2 ms,
    and the job record keeps it: recover reads it after a reboot. run.env never does.)"""
    dev = os.fstat(fd).st_dev
    known = _SURVIVES.get(dev)
    if known is None:
        known = libc.fs_type(fd) not in (libc.TMPFS_MAGIC, libc.RAMFS_MAGIC)
        _SURVIVES[dev] = known
    return known


def read_record(state_dir: str, job_id: str) -> dict[str, object] | None:
    from jobns.launcher.system.jsonfast import loads

    try:
        with open(f"{job_dir(state_dir, job_id)}/{STATE}", "rb") as f:
            doc = loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise JobnsError(
            f"read job state {job_dir(state_dir, job_id)}/{STATE}: {e}; "
            "`jobns teardown --force` removes a broken record"
        ) from None
    if not isinstance(doc, dict):
        raise JobnsError(
            f"read job state {job_dir(state_dir, job_id)}/{STATE}: not a JSON object; "
            "`jobns teardown --force` removes a broken record"
        )
    return doc  # launcher.model.record.Record.from_dict checks each field


def write_record(state_dir: str, job_id: str, doc: dict[str, object], uid: int | None) -> None:
    """Write a job's record document (launcher.model.record.save) where only root and the job's
    user (uid) can read it."""
    from jobns.launcher.system.jsonfast import dumps

    d = job_dir(state_dir, job_id)
    made = private_dir(d, uid)
    try:
        write_atomic(f"{d}/{STATE}", dumps(doc).encode() + b"\n", uid, "job record")
    except BaseException:
        if made:  # the job's first record: leave no empty directory behind either
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise


MAX_REASON = 2000
REFUSED = "refused"  # setup found a user-caused problem: the job is failed, not the node
STATES = (
    "pending",
    "staging-in",
    "staged-in",
    "pre-run",
    "running",
    "post-run",
    "staging-out",
    "teardown",
    "teardown-fail",
    "complete",
    REFUSED,
)
PAUSE_VAR = "JOBNS_TEST_PAUSE_IN"


def pause_point(point: str) -> None:
    """Test hook (docs/development.md "Test hooks"): with JOBNS_TEST_PAUSE_IN=<point> jobns stops
    itself (SIGSTOP) there, so a test can SIGKILL it in exactly that state."""
    if os.environ.get(PAUSE_VAR) == point:
        from jobns.launcher.system.fastimport import signal

        os.kill(os.getpid(), signal.SIGSTOP)


def close_run_env(state_dir: str, job_id: str, why: str, uid: int | None, reason: str = "") -> None:
    """No task may join the job from now on (see the module docstring); `reason` says
    why a refused job was refused (every task then fails with it)."""
    values = {"closed": why}
    if reason:
        # One line of bounded size, whatever the user's directive said.
        values["reason"] = " ".join(reason.split())[:MAX_REASON]
    write_run_env(state_dir, job_id, values, uid)


def write_run_env(state_dir: str, job_id: str, values: dict[str, str], uid: int | None) -> None:
    for k, v in values.items():
        if "\n" in k or "=" in k or "\n" in v:
            raise JobnsError(f"internal error: run.env value {k!r} has a newline or '='")
    body = "".join(f"{k}={v}\n" for k, v in {"version": RUN_ENV_VERSION, **values}.items())
    # Not durable: after a reboot the pins it names are gone (no task can join through
    # it), and setup, recover and gc read the job record, never run.env.
    write_atomic(
        f"{job_dir(state_dir, job_id)}/{RUN_ENV}", body.encode(), uid, "join record", False
    )


def read_run_env(state_dir: str, job_id: str) -> dict[str, str] | None:
    """The join record of a set-up job, or None. Hot path: no json, one open."""
    path = f"{job_dir(state_dir, job_id)}/{RUN_ENV}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.path.exists(f"{job_dir(state_dir, job_id)}/{STATE}"):
                # Recorded, but never opened (run.env is written right after the first
                # record): a setup under way, or one that failed (a full state_dir). Not
                # a job nobody set up: no task may make trees of its own for it.
                raise JobnsError(
                    f"join job {job_id}: it is recorded on this node but was never "
                    f"opened to tasks ({path} is missing): its setup is under way or "
                    "failed (see the prolog log)"
                ) from None
            return None
        if e.errno == errno.EACCES:
            raise JobnsError(
                f"join job {job_id}: it belongs to another user (a job's state "
                f"under {state_dir} is private to its owner)"
            ) from None
        raise JobnsError(f"read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        # Trust only what root wrote: a user-writable state_dir must not steer a task.
        # (The group bits show the ACL mask: read-only for the job's user.)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise JobnsError(
                f"refuse {path}: not owned by root or writable by others; "
                "check state_dir in the config"
            )
        data = os.read(fd, 1 << 20).decode()
    finally:
        os.close(fd)
    values = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
    if values.get("version") != RUN_ENV_VERSION:
        raise JobnsError(
            f"read {path}: unknown version {values.get('version')!r}; was the job "
            "set up by another jobns version? (jobns teardown, then setup)"
        )
    closed = values.get("closed")
    if closed == REFUSED:
        raise JobnsError(
            f"job {job_id} was refused by jobns setup on this node: "
            f"{values.get('reason') or 'see the prolog log'}"
        )
    if closed is not None:
        when = (
            "is ending"
            if closed in ("post-run", "staging-out", "teardown")
            else "is still being set up"
        )
        raise JobnsError(
            f"join job {job_id}: it {when} on this node (state {closed}); no "
            "task may join it now (see jobns status)"
        )
    return values


def pin_paths(state_dir: str, job_id: str) -> tuple[str, str]:
    """(user pin, mount pin) of a job (launcher.mountns.pins makes them)."""
    d = f"{job_dir(state_dir, job_id)}/ns"
    return f"{d}/user", f"{d}/mnt"


def pid_pin_path(state_dir: str, job_id: str) -> str:
    """The pin of a job's PID namespace ([namespace] pid)."""
    return f"{job_dir(state_dir, job_id)}/ns/pid"


def remove_job_dir(state_dir: str, job_id: str) -> list[str]:
    from jobns.launcher.system import removal

    # Pins the record may not name: a setup that could not record them (a full
    # state_dir) or was killed between pinning and recording. No task ever joined such a
    # job (run.env was not open yet), and the directory holds only root's own pins.
    every = (*pin_paths(state_dir, job_id), pid_pin_path(state_dir, job_id))
    for path in every * 3:  # a retried pre-run may stack them
        try:
            libc.umount2(path, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
        except OSError:
            pass  # not mounted (the usual case): removal below says if anything is left

    base = os.open(f"{state_dir}/{JOBS}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return removal.remove_entry(base, job_id, job_dir(state_dir, job_id))
    finally:
        os.close(base)


# A run of a job is the job id and Slurm's restart count (SLURM_JOB_RESTART_COUNT, which
# slurmd gives the prolog and the epilog of every release: a requeue counts up). The
# packaged scripts leave a mark naming the run before they hand the job on, so that the
# order of the setup and the teardown that follow is decided under the job's lock, never
# by which of them started first (docs/admin.md "What the prolog and epilog wait for"):
#   <jobs>/<id>.setup    the prolog: a setup of this run is on its way. The setup of that
#                        run takes it; a teardown of the same run that comes first takes
#                        it instead, and the late setup then sets nothing up.
#   <jobs>/<id>.ending   the epilog: this run is over and its teardown is on its way. The
#                        SPANK plugin stops waiting for a setup when it sees it; the
#                        teardown removes it whatever happens.
# Each mark holds the run (digits, or nothing when Slurm gave no restart count). The
# epilog's count is not its run's: slurmctld counts a requeue up before it ends the run,
# so a teardown knows its run by time instead: the epilog hands it the time it ran
# (JOBNS_EPILOG_AT), and a run whose prolog (its record's prolog_at, its mark's time)
# came later is another run.
SETUP_MARK = ".setup"
ENDING = ".ending"
MARKS = (SETUP_MARK, ENDING)
ENDING_SLACK = 0.05


def mark_path(state_dir: str, job_id: str, suffix: str) -> str:
    return f"{state_dir}/{JOBS}/{job_id}{suffix}"


def read_mark(state_dir: str, job_id: str, suffix: str) -> str | None:
    """The run a script's mark names ("" for a run without a number), None without one.
    Only root writes under <jobs>; a link or anything but a small file is no mark."""
    path = mark_path(state_dir, job_id, suffix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise state_error("read the mark", path, e) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return text if text.isdigit() or not text else None


def drop_mark(state_dir: str, job_id: str, suffix: str, run: str | None) -> bool:
    """Remove the mark when it names `run` (any run when run is None: by hand); True if
    one was removed."""
    named = read_mark(state_dir, job_id, suffix)
    if named is None or (run is not None and named != run):
        return False
    return _remove_mark(state_dir, job_id, suffix)


def _remove_mark(state_dir: str, job_id: str, suffix: str) -> bool:
    try:
        os.unlink(mark_path(state_dir, job_id, suffix))
    except FileNotFoundError:
        return False
    except OSError as e:
        raise state_error("remove the mark", mark_path(state_dir, job_id, suffix), e) from None
    return True


def mark_time(state_dir: str, job_id: str, suffix: str) -> int | None:
    """When a mark was written (st_mtime_ns), None without one."""
    try:
        return os.lstat(mark_path(state_dir, job_id, suffix)).st_mtime_ns
    except FileNotFoundError:
        return None


def drop_stale_ending(state_dir: str, job_id: str, setup_at: int) -> None:
    """An epilog's mark older than the prolog's mark of the run being set up belongs to
    an earlier job of the same id (a run's epilog never comes before its prolog):
    remove it. (The SPANK plugin applies the same rule before it trusts the mark.)"""
    ending_at = mark_time(state_dir, job_id, ENDING)
    if ending_at is not None and ending_at < setup_at:
        _unlink_quietly(mark_path(state_dir, job_id, ENDING))


def drop_mark_before(
    state_dir: str, job_id: str, suffix: str, before: float | None, slack: float = 0.0
) -> bool:
    """Remove the mark when it was written no later than `before` (seconds since the
    epoch) plus `slack` (any mark when None: by hand); True if one was removed. A prolog's
    mark is older than its run's epilog: no slack. The epilog's own mark is written just
    after it read the time, and the kernel stamps it with its coarse clock: a little
    slack (ENDING_SLACK) keeps it its own, while a later run's marks are seconds later."""
    at = mark_time(state_dir, job_id, suffix)
    if at is None or (before is not None and at > (before + slack) * 1e9):
        return False
    return _remove_mark(state_dir, job_id, suffix)


def is_set_up(state_dir: str, job_id: str) -> bool:
    """A record exists: a setup owns (or is making) the job's trees on this node."""
    return os.path.exists(f"{job_dir(state_dir, job_id)}/{STATE}")


def list_jobs(state_dir: str) -> list[str]:
    try:
        names = os.listdir(f"{state_dir}/{JOBS}")
    except FileNotFoundError:
        return []
    except PermissionError:
        raise JobnsError(
            f"list the jobs under {state_dir}: permission denied (job state is "
            "private: run this as root)"
        ) from None
    return sorted(n for n in names if not n.endswith((".lock", *MARKS)) and ".tmp-" not in n)
