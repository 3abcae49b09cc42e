"""A set-up job's namespaces: make, pin, identify, hold, terminate, unpin.

The only module that knows where pins live and what they may be opened by:

  <state_dir>/jobs/<id>/ns/          root 0700, ACL: the job user may search
  <state_dir>/jobs/<id>/ns/user      /proc/HOLDER/ns/user bind-mounted onto an empty file
  <state_dir>/jobs/<id>/ns/mnt       /proc/HOLDER/ns/mnt likewise
  <state_dir>/jobs/<id>/ns/pid       /proc/HOLDER/ns/pid_for_children ([namespace] pid)

Why a user namespace: under Slurm every task runs as the job user (slurmstepd
drops privileges before it execs the task), and an unprivileged process may setns()
only into namespaces owned by a user namespace it has rights in. So the prolog
forks a *holder* (launcher.system.fork: it holds nothing of root's) that detaches the
state directory in a root-owned scratch namespace and covers the bases that hold other
jobs' trees (launcher.mountns.namespace.cover_bases), becomes the job user, creates a
user namespace (mapping only that user) with the job's mount namespace inside it,
makes the binds, and waits while root pins both. A job run by root gets a plain
mount namespace, and so does every job when the site enforces namespaces through
Slurm (`[slurm] enforce = true`): the SPANK plugin (jobns/slurm/spank/jobns_spank.c) joins
it as root in each task before slurmstepd drops privileges, so no user namespace is
needed, and a namespace owned by the host's user namespace is one no job user can
mount in.

Such a namespace is the user's: she can mount over anything inside it. Root
therefore never enters it (SECURITY.md rule 1): `jobns run` as root becomes the job
user first and joins as her; teardown identifies the namespace's processes from the
host by (st_dev, st_ino) and signals them from outside.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time

from jobns.launcher.backing import fs
from jobns.launcher.backing.fs import TreeHandle
from jobns.launcher.model.job import Job
from jobns.launcher.model.plan import Plan
from jobns.launcher.model.record import Pins
from jobns.launcher.mountns import namespace
from jobns.launcher.protocol import state
from jobns.launcher.system import libc, mountinfo, sysprog
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fork import spawn
from jobns.launcher.system.supervise import signal_all
from jobns.launcher.system.user import switch_user

UNKILLABLE_WAIT = 30.0
NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 0x5, __u64), Linux 6.11+


paths = state.pin_paths  # (user pin, mount pin) of a job


def _make_pin(path: str, uid: int) -> None:
    state.private_dir(os.path.dirname(path), uid)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400))
    except OSError as e:
        raise state.state_error("create pin", path, e) from None


def mntns_id(path: str = "/proc/self/ns/mnt") -> int | None:
    """The kernel's 64-bit id of a mount namespace, or None on kernels without the ioctl."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int.from_bytes(fcntl.ioctl(fd, NS_GET_MNTNS_ID, bytes(8)), sys.byteorder)
    except OSError:
        return None
    finally:
        os.close(fd)


def outrank(pinner_id: int | None) -> None:
    """Make the holder's mount namespace id larger than the pinner's.

    The kernel refuses to bind-mount a mount namespace file unless the namespace is
    newer than the caller's own (mnt_ns_loop(): no reference cycles). Since Linux 6.18
    ids come from per-CPU batches, so a namespace made later on another CPU can have a
    smaller id, and the pin fails with EINVAL whenever the pinner (slurmd in a container
    or a namespaced unit) is not in the first namespace. A CPU whose batch is newer
    exists (the one that numbered the pinner's), so unshare again on each CPU in turn.
    """
    if pinner_id is None:
        return
    allowed = os.sched_getaffinity(0)
    try:
        # Every CPU, not only our affinity mask: the prolog may have been pinned to one
        # CPU whose batch is the old one (a cpuset that forbids a CPU just says EINVAL).
        for cpu in [None, *range(os.cpu_count() or 1)]:
            if cpu is not None:
                try:
                    os.sched_setaffinity(0, {cpu})
                except OSError:
                    continue
                libc.unshare(libc.CLONE_NEWNS)
            mine = mntns_id()
            if mine is None or mine > pinner_id:
                return
    finally:
        os.sched_setaffinity(0, allowed)
    raise JobnsError(
        f"set up namespace: every new mount namespace got an id below the "
        f"prolog's ({pinner_id}); the kernel would refuse to pin it"
    )


def pin(
    plan: Plan,
    handles: list[TreeHandle],
    job: Job,
    state_dir: str,
    enforce: bool = False,
    pid_ns: bool = False,
) -> Pins:
    """Create the job's namespace(s) in a holder child and pin them; the pins record.
    enforce: root's namespace for every job (the SPANK plugin joins it as root).
    pid_ns: a PID namespace too, with its init (start_init); only with enforce."""
    expected = [fs.identity(handles[b.tree], b.child) for b in plan.binds]
    roots = [fs.identity(h, "") for h in handles]
    pinner_id = mntns_id()
    user_pin, mnt_pin = paths(state_dir, job.job_id)
    pid_pin = state.pid_pin_path(state_dir, job.job_id)
    userns = job.user.uid != 0 and not enforce
    pid_ns = pid_ns and enforce
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)

    def hold() -> None:
        libc.unshare(libc.CLONE_NEWNS)
        libc.mount(None, "/", None, libc.MS_REC | libc.MS_SLAVE)
        show_only_own_state(state_dir, job.job_id)
        drop_other_pins()
        # As root, before she can act in the namespace: covers she cannot lift.
        namespace.cover_bases(plan, roots)
        if userns:
            # Only the two pipes are open here (launcher.system.fork): once the job user can
            # ptrace this process, there is nothing of root's to take.
            switch_user(job.user.uid, job.user.gid, job.user.groups)
            # After a uid change /proc/self belongs to root; writing uid_map needs this.
            libc.set_dumpable(True)
            namespace.unshare(userns=True, net_none=False)
        outrank(pinner_id)  # before the binds, so they are made in the final namespace
        namespace.apply_binds(plan, handles, expected)
        init = start_init(job.job_id) if pid_ns else 0
        os.write(ready_w, f"ok {init}".encode())
        os.read(done_r, 1)  # hold the namespaces until root has pinned them

    holder = spawn(hold, keep=(ready_w, done_r))
    os.close(ready_w)
    os.close(done_r)
    init = 0
    try:
        ready = os.read(ready_r, 32)
        if not ready.startswith(b"ok "):
            os.close(done_w)
            done_w = -1
            holder.finish("set up the job's namespace")  # raises with the holder's reason
            raise JobnsError("set up namespace: the namespace holder died")
        init = int(ready[3:])
        pinned = Pins(None, mnt_pin)
        try:
            if userns:
                _make_pin(user_pin, job.user.uid)
                libc.mount(f"/proc/{holder.pid}/ns/user", user_pin, None, libc.MS_BIND)
                pinned.user = user_pin
            _make_pin(mnt_pin, job.user.uid)
            libc.mount(f"/proc/{holder.pid}/ns/mnt", mnt_pin, None, libc.MS_BIND)
            if init:
                _make_pin(pid_pin, job.user.uid)
                # The holder's children's namespace: the one its init is PID 1 of.
                libc.mount(f"/proc/{holder.pid}/ns/pid_for_children", pid_pin, None, libc.MS_BIND)
                pinned.pid = pid_pin
        except (OSError, JobnsError) as e:
            # Never leave half a pin behind.
            unpin(Pins(pinned.user, mnt_pin))  # (the pid pin comes last: never mounted here)
            if init:
                os.kill(init, signal.SIGKILL)  # unpinned, nobody would end it
            if isinstance(e, JobnsError):
                raise  # a pin file state_dir could not hold: the message says why
            raise JobnsError(f"pin the job's namespaces under {state_dir}: {e.strerror}") from None
        st = os.stat(mnt_pin)
        pinned.mnt_dev, pinned.mnt_ino = st.st_dev, st.st_ino
        # Pinned: all the holder has left to do is exit, and the prolog does not wait
        # for it to tear down its copy of this process (~1 ms); init reaps it.
        os.close(holder.report_fd)
        holder.report_fd = -1
        return pinned
    finally:
        os.close(ready_r)
        if done_w >= 0:
            os.close(done_w)  # lets the holder exit
        if holder.report_fd >= 0:
            holder.report()
            holder.wait()


def show_only_own_state(state_dir: str, job_id: str) -> None:
    """In the holder's new mount namespace, as root: replace state_dir by an empty
    read-only tmpfs that shows the job's own directory alone, read-only.

    Dropping state_dir's bind mount drops every pin under it, so the job holds no
    reference to another job's namespace and reads no other job's state. Its own
    directory stays visible because Slurm puts processes in this namespace itself (a
    whole step, joined by the job_container/namespace plugin), and the SPANK plugin and
    `jobns run` in them read the job's run.env there. The clone is of the directory
    alone: the pins made under it afterwards are mounts of the node's namespace, so
    inside they are empty files."""
    flags = libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC
    own = state.job_dir(state_dir, job_id)
    try:
        clone = libc.clone_mount(own)
        try:
            libc.umount2(state_dir, libc.MNT_DETACH)
            libc.mount("jobns-state", state_dir, "tmpfs", flags, "size=4k,mode=0755")
            for made in (f"{state_dir}/{state.JOBS}", own):
                os.mkdir(made)
                os.chmod(made, 0o755)  # noqa: S103 (root's, read-only: the job's user reads)
            libc.attach_mount(clone, own)
        finally:
            os.close(clone)
        # A clone of a slave mount is a slave too: nothing mounted on the node's side
        # (the job's own pins) may come in after it.
        libc.mount(None, own, None, libc.MS_PRIVATE)
        libc.mount(None, own, None, libc.MS_REMOUNT | libc.MS_BIND | libc.MS_RDONLY | flags)
        libc.mount(None, state_dir, None, libc.MS_REMOUNT | libc.MS_RDONLY | flags)
    except OSError as e:
        raise JobnsError(f"hide {state_dir} from the job: {e.strerror}") from None


def drop_other_pins() -> None:
    """Detach, in this (the job's new) mount namespace, every namespace pin still visible:
    those of another jobns instance's state directory (another config), or anything else
    that pins a namespace. A job must hold no reference to other namespaces."""
    for m in reversed(mountinfo.mounts()):
        if m.fstype == "nsfs":
            try:
                libc.umount2(m.point, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
            except OSError:
                pass  # already gone with a mount above it


INIT_NAME = "jobns-init"  # what ps shows as PID 1 of a job's PID namespace


def start_init(job_id: str) -> int:
    """In the holder, as root, in the job's finished mount namespace: a new PID
    namespace and its PID 1 (its host pid returned), before any task can act there.

    The init mounts a fresh /proc for that namespace over /proc (procfs takes the PID
    namespace of the process that mounts it, so only a process inside can), then becomes
    /usr/bin/sleep with SIGCHLD ignored: a disposition exec keeps, with which the kernel
    reaps every orphan re-parented to it, so no code of ours (no Python, a few hundred KB)
    stays for the job's life. It leaves the prolog's session (slurmd kills the prolog's
    process group when the prolog exits) and holds no fd (launcher.system.fork). Signals from
    inside the namespace cannot reach a PID 1 without handlers; when teardown SIGKILLs it
    from the host, the kernel kills every process of the namespace."""
    sleep = sysprog.find("sleep")  # in root's mount namespace: root's directories only
    libc.unshare(libc.CLONE_NEWPID)

    def init() -> None:
        try:
            libc.mount("proc", "/proc", "proc", libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC)
        except OSError as e:
            raise JobnsError(
                f"mount /proc for job {job_id}'s PID namespace: {e.strerror}"
            ) from None
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        os.chdir("/")
        os.execv(sleep, [INIT_NAME, "infinity"])  # noqa: S606 (root's sleep, fixed argv)

    child = spawn(init, before=os.setsid)
    failure = child.report()  # nothing: it exec'd
    if failure is not None:
        child.wait()
        raise JobnsError(failure[1], failure[0])
    return child.pid


def unpin(pinned: Pins) -> list[str]:
    errors = []
    for path in (pinned.mnt, pinned.user, pinned.pid):
        if path is None:
            continue
        try:
            libc.umount2(path, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
        except OSError as e:
            if e.errno != 22:  # EINVAL: not mounted (already unpinned)
                errors.append(f"unpin {path}: {e.strerror}")
    return errors


NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2): the parent of a user namespace
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3): a namespace file's CLONE_NEW* type
NsId = tuple[int, int]  # (st_dev, st_ino) of a namespace file


def processes_in_namespace(
    dev: int, ino: int, userns: NsId | None = None, pidns: int | None = None
) -> list[int]:
    """Every process of the job: its mount namespace is (dev, ino), or (a job whose
    namespace lives in a user namespace of its own) its user namespace is the job's or
    one nested below it. A task that made a namespace of its own (`unshare -Urm` in the
    job) has left the job's mount namespace, but never the user namespace it came from.

    Each process is asked by readlink of /proc/PID/ns/* ("mnt:[INO]"), not stat: a stat
    makes the kernel find the namespace's file, ~4x the cost on a node of a few hundred
    processes, and the epilog scans twice. The inode number alone names a namespace
    (every one is a file of the one nsfs), and the caller holds the job's, so it is not
    reused meanwhile. pidns: the inode of the job's PID namespace, whose processes are
    the job's too (one that made a mount namespace of its own is still in it)."""
    me = os.getpid()
    mnt = f"mnt:[{ino}]"
    pid = f"pid:[{pidns}]" if pidns is not None else None
    host = os.readlink("/proc/self/ns/user")
    job = f"user:[{userns[1]}]" if userns is not None else None
    host_userns = _ns_id("/proc/self/ns/user") if userns is not None else None
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/mnt") == mnt or (
                pid is not None and os.readlink(f"/proc/{name}/ns/pid") == pid
            ):
                out.append(int(name))
                continue
            if userns is None:
                continue
            user = os.readlink(f"/proc/{name}/ns/user")
        except OSError:
            continue  # gone, or a zombie (its namespaces are already released)
        if user != host and (user == job or _below(f"/proc/{name}/ns/user", userns, host_userns)):
            out.append(int(name))
    return out


def _ns_id(path: str) -> NsId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _below(path: str, userns: NsId, host: NsId | None) -> bool:
    """Is the user namespace at path `userns` or nested below it?"""
    mine = _ns_id(path)
    if mine is None or mine == host:
        return False  # the host's: most processes, and never the job's
    if mine == userns:
        return True
    fd = _open_ns(path)
    if fd is None:
        return False
    try:
        for _depth in range(33):  # the kernel nests user namespaces 32 deep at most
            try:
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except OSError:
                return False  # reached the top (EPERM) or the process is gone
            os.close(fd)
            fd = parent
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == userns:
                return True
            if (st.st_dev, st.st_ino) == host:
                return False
        return False
    finally:
        os.close(fd)


def _open_ns(path: str) -> int | None:
    """An fd of a namespace file (/proc/PID/ns/..., or a pin), None if it cannot be opened."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _open_pinned(pin: str | None, nstype: int | None = None) -> int | None:
    """An fd of the namespace pinned at pin (of type nstype, if given), else None: no
    pin, or the bare pin file (already unpinned: the ioctl answers ENOTTY)."""
    fd = None if pin is None else _open_ns(pin)
    if fd is None:
        return None
    try:
        kind: int | None = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        kind = None
    if kind is not None and nstype in (None, kind):
        return fd
    os.close(fd)
    return None


def userns_of(pinned: Pins) -> tuple[int, NsId] | None:
    """(an fd holding it, its id) of the job's user namespace while pinned, else None."""
    fd = _open_pinned(pinned.user)
    if fd is None:
        return None
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def terminate_namespace(
    dev: int, ino: int, kill_wait: float, userns: NsId | None = None, pidns: int | None = None
) -> list[str]:
    """SIGCONT+SIGTERM, wait kill_wait, SIGKILL, wait for all; errors if any survive.
    With a PID namespace (pidns: its inode) its init ignores SIGTERM, so the grace ends
    as soon as only the init is left; its SIGKILL then ends whatever else remains."""
    pids = processes_in_namespace(dev, ino, userns, pidns)
    if not pids:
        return []
    init = _inits(pids, pidns)
    signal_all(pids, signal.SIGCONT)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + kill_wait
    while set(pids) - init and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = processes_in_namespace(dev, ino, userns, pidns)
    deadline = time.monotonic() + UNKILLABLE_WAIT
    pause = 0.001  # a killed process is gone within a millisecond or two, as a whole
    while pids:  # PID namespace (the init's death kills the rest) usually is
        signal_all(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            return [
                f"terminate the job's processes: {sorted(pids)} still alive after SIGKILL "
                f"(stuck in the kernel?); see /proc/PID/stack"
            ]
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        pids = processes_in_namespace(dev, ino, userns, pidns)
    return []


def _inits(pids: list[int], pidns: int | None) -> set[int]:
    """The host pid of the job's init among pids: PID 1 of the job's PID namespace."""
    if pidns is None:
        return set()
    out = set()
    for p in pids:
        try:
            if os.readlink(f"/proc/{p}/ns/pid") != f"pid:[{pidns}]":
                continue
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"NSpid:") and line.split()[-1] == b"1":
                        out.add(p)
        except OSError:
            continue  # gone
    return out


def pidns_of(pinned: Pins) -> tuple[int, int] | None:
    """(an fd holding it, its inode) of the job's PID namespace while pinned, else None:
    held, so that its inode number keeps naming this job's namespace while teardown
    looks for its processes."""
    fd = _open_pinned(pinned.pid, libc.CLONE_NEWPID)
    return None if fd is None else (fd, os.fstat(fd).st_ino)


def hold(pinned: Pins) -> int | None:
    """An fd on the job's mount namespace while teardown runs, or None if it is unpinned.

    Namespace inode numbers are reused once a namespace is freed: holding it keeps
    (dev, ino) meaning *this* job's namespace, so we never signal another job's tasks.
    The fd is only held and compared, never entered (the namespace is the user's).
    """
    mnt, dev, ino = pinned.mnt, pinned.mnt_dev, pinned.mnt_ino
    fd = None if mnt is None else _open_ns(mnt)
    if fd is None:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (dev, ino):
        os.close(fd)  # the bare pin file: already unpinned by an earlier attempt
        return None
    return fd


def terminate(pinned: Pins, kill_wait: float) -> list[str]:
    """End every process left in the job's namespace (as slurmstepd ends a step), keeping the
    pins."""
    held = hold(pinned)
    if held is None:
        return []
    user = userns_of(pinned)
    pid = pidns_of(pinned)
    try:
        assert pinned.mnt_dev is not None and pinned.mnt_ino is not None
        return terminate_namespace(
            pinned.mnt_dev,
            pinned.mnt_ino,
            kill_wait,
            user[1] if user else None,
            pid[1] if pid else None,
        )
    finally:
        os.close(held)
        for got in (user, pid):
            if got is not None:
                os.close(got[0])
