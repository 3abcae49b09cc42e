"""`jobns setup` (the prolog): make a job's directories and one namespace for all its tasks.

Why a user namespace: under Slurm every task runs as the job user (slurmstepd
drops privileges before it execs the task), and an unprivileged process may
setns() only into namespaces owned by a user namespace it has rights in. So
the root prolog forks a child that becomes the job user, creates a user
namespace (mapping only that user) with the job's mount namespace inside it,
makes the binds, and waits while root pins both namespaces by bind-mounting
/proc/CHILD/ns/{user,mnt} onto files in the state directory. Every later task
of the job (README "Why one pinned namespace": measured ~0.1 ms to join) opens
the pins and joins. A job run by root gets a plain mount namespace.

Before that child creates the user namespace it first enters a root-owned
scratch mount namespace and detaches the state directory there, so the job's
namespace holds no copies of other jobs' pins and never sees the state.

Setup runs through seed 003's states (launcher.lifecycle): pending, staging-in (the
directories, their capacity tmpfs, stage_in copies, the ARC session directory moved
into scratch), staged-in, pre-run (the pins above, [lifecycle] pre_run), running.
This module gathers the request (options, #JOBNS directives, capacities, staging)
and keeps the namespace mechanics; lifecycle drives the states.
"""

from __future__ import annotations

import os
import sys
import time

from launcher import config as config_mod
from launcher import fs, libc, namespace, state
from launcher.errors import JobnsError
from launcher.fastimport import set_dumpable
from launcher.plan import Plan, Tree, build
from launcher.run import Options, job_from, kill_wait_from, switch_user

TYPE_CHECKING = False
if TYPE_CHECKING:
    from launcher.capacity import Capacities
    from launcher.config import Config
    from launcher.directives import Directives
    from launcher.fs import TreeHandle
    from launcher.job import Job
    from launcher.staging import Staging


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise JobnsError(f"jobns {what} must run as root (it is a Slurm "
                         f"{'Prolog' if what == 'setup' else 'Epilog'} or an admin command)")


def tree_record(t: Tree, capacity: int | None = None) -> dict[str, object]:
    # "made": this setup created it (a failed setup removes only what it made).
    return {"role": t.role, "base": t.base, "parents": list(t.parents), "name": t.name,
            "children": list(t.children), "remove": t.remove, "capacity": capacity,
            "made": False}


def tree_from_record(r: dict[str, object]) -> Tree:
    parents, children = r["parents"], r["children"]
    assert isinstance(parents, list) and isinstance(children, list)
    return Tree(str(r["role"]), str(r["base"]), tuple(parents), str(r["name"]), tuple(children),
                bool(r["remove"]))


def options_of(job: Job, caps: Capacities | None = None,
               staging: Staging | None = None) -> dict[str, object]:
    """What must match for a repeated setup to be the same setup."""
    return {"user": job.user.uid, "layout": job.layout, "no_rm_tmpdir": job.no_rm,
            "capacities": caps.record() if caps is not None else {"shm": None, "tmp": None},
            "session_dir": staging.session_dir if staging is not None else None}


def new_record(job: Job, plan: Plan, kill_wait: float, config: Config,
               caps: Capacities | None = None,
               staging: Staging | None = None) -> dict[str, object]:
    now = time.time()
    arc = config.raw.get("arc")
    return {
        "version": 1, "job_id": job.job_id,
        "user": {"name": job.user.name, "uid": job.user.uid, "gid": job.user.gid},
        "hostname": job.hostname, "layout": job.layout, "no_rm_tmpdir": job.no_rm,
        "state": "pending", "created": now, "updated": now,
        "trees": [tree_record(t, caps.for_tree(t.role) if caps is not None else None)
                  for t in plan.trees],
        "pins": {"user": None, "mnt": None, "mnt_dev": None, "mnt_ino": None},
        "kill_wait": kill_wait, "arc": arc if isinstance(arc, dict) else None,
        "teardown_failures": 0, "errors": [], "history": [{"state": "pending", "at": now}],
        "options": options_of(job, caps, staging), "ran": False,
        "capacities": caps.record() if caps is not None else {"shm": None, "tmp": None},
        "staging": staging.record() if staging is not None else None,
    }


set_state = state.set_state  # kept here for callers of the first version


def _make_pin(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    os.close(fd)


NS_GET_MNTNS_ID = 0x8008B705  # _IOR(0xb7, 0x5, __u64), Linux 6.11+


def mntns_id(path: str = "/proc/self/ns/mnt") -> int | None:
    """The kernel's 64-bit id of a mount namespace, or None on kernels without the ioctl."""
    import fcntl

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
    raise JobnsError(f"set up namespace: every new mount namespace got an id below the "
                     f"prolog's ({pinner_id}); the kernel would refuse to pin it")


def pin_namespaces(plan: Plan, handles: list[TreeHandle], job: Job, state_dir: str
                   ) -> dict[str, object]:
    """Create the job's namespace(s) in a child and pin them; returns the pins record."""
    expected = [fs.identity(handles[b.tree], b.child) for b in plan.binds]
    pinner_id = mntns_id()
    user_pin, mnt_pin = state.pin_paths(state_dir, job.job_id)
    userns = job.user.uid != 0
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    done_r, done_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the namespace holder
        os.close(ready_r)
        os.close(done_w)
        try:
            libc.unshare(libc.CLONE_NEWNS)
            libc.mount(None, "/", None, libc.MS_REC | libc.MS_SLAVE)
            try:
                # Drop the pins (their bind mount) and cover what lies beneath, so the
                # job holds no reference to other jobs' namespaces and reads no state.
                libc.umount2(state_dir, libc.MNT_DETACH)
                libc.mount("jobns-state", state_dir, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV
                           | libc.MS_NOEXEC | libc.MS_RDONLY, "size=4k,mode=0755")
            except OSError as e:
                raise JobnsError(f"hide {state_dir} from the job: {e.strerror}") from None
            if userns:
                switch_user(job.user)
                # After a uid change /proc/self belongs to root; writing uid_map needs this.
                set_dumpable(True)
                namespace.unshare(userns=True, net_none=False)
            outrank(pinner_id)  # before the binds, so they are made in the final namespace
            sources = [fs.reopen(handles[b.tree], b.child, ident)
                       for b, ident in zip(plan.binds, expected, strict=True)]
            for (fd, path), b in zip(sources, plan.binds, strict=True):
                namespace.bind(fd, path, b.target)
            os.write(ready_w, b"ok")
            os.read(done_r, 1)  # hold the namespaces until root has pinned them
            os._exit(0)
        except BaseException as e:  # report, never unwind into the parent's code
            msg = str(e) if isinstance(e, JobnsError) else f"set up namespace: {e}"
            try:
                os.write(ready_w, msg.encode(errors="replace"))
            finally:
                os._exit(125)
    os.close(ready_w)
    os.close(done_r)
    try:
        reply = os.read(ready_r, 65536).decode(errors="replace")
        if reply != "ok":
            raise JobnsError(reply or "set up namespace: the namespace holder died")
        pins: dict[str, object] = {"user": None, "mnt": mnt_pin}
        try:
            if userns:
                _make_pin(user_pin)
                libc.mount(f"/proc/{pid}/ns/user", user_pin, None, libc.MS_BIND)
                pins["user"] = user_pin
            _make_pin(mnt_pin)
            libc.mount(f"/proc/{pid}/ns/mnt", mnt_pin, None, libc.MS_BIND)
        except OSError as e:
            unpin({"user": pins["user"]})  # never leave half a pin behind
            raise JobnsError(f"pin the job's namespaces under {state_dir}: {e.strerror}"
                             ) from None
        st = os.stat(mnt_pin)
        pins["mnt_dev"], pins["mnt_ino"] = st.st_dev, st.st_ino
        return pins
    finally:
        os.close(ready_r)
        os.close(done_w)  # lets the holder exit
        os.waitpid(pid, 0)


def unpin(pins: dict[str, object]) -> list[str]:
    errors = []
    for key in ("mnt", "user"):
        path = pins.get(key)
        if not isinstance(path, str):
            continue
        try:
            libc.umount2(path, libc.MNT_DETACH | libc.UMOUNT_NOFOLLOW)
        except OSError as e:
            if e.errno != 22:  # EINVAL: not mounted (already unpinned)
                errors.append(f"unpin {path}: {e.strerror}")
    return errors


def run_env_values(record: dict[str, object], config: Config) -> dict[str, str]:
    pins = record["pins"]
    user = record["user"]
    assert isinstance(pins, dict) and isinstance(user, dict)
    values = {
        "job_id": str(record["job_id"]), "uid": str(user["uid"]), "gid": str(user["gid"]),
        "user": str(user["name"]), "layout": str(record["layout"]),
        "user_pin": str(pins["user"] or ""), "mnt_pin": str(pins["mnt"]),
        "kill_wait": repr(record["kill_wait"]),
    }
    # The job environment as setup saw the config: later runs use exactly this.
    arc = config.arc
    if arc is not None:
        scratchdir = arc.scratchdir
        staging = record.get("staging")
        if isinstance(staging, dict) and staging.get("runtime_scratchdir"):
            # Dynamic scratch: ARC's wrapper appends <arc-job-id> to this (seed 001).
            scratchdir = str(staging["runtime_scratchdir"])
        values.update({"arc.shared_filesystem": "1" if arc.shared_filesystem else "",
                       "arc.scratchdir": scratchdir, "arc.movetool": arc.movetool,
                       "arc.shared_scratch": arc.shared_scratch})
    return values


COMMENT_PREFIX = "jobns:"


def gather_directives(opts: Options, environ: dict[str, str],
                      config: Config | None = None) -> Directives | None:
    """#JOBNS directives from --script, --directives and the Slurm job comment.

    Under Slurm a user's own environment never reaches the prolog, but the job's
    comment does (SLURM_JOB_COMMENT): `sbatch --comment "jobns: shared_tmpdir=per-node"`.
    The directive word ([directives] word) and the capacity granularity ([capacity]
    granularity) come from the config.
    """
    script = opts.get("script")
    comment = environ.get("SLURM_JOB_COMMENT", "")
    if not script and not opts.get("directives") and COMMENT_PREFIX not in comment:
        return None  # the common prolog: no directives, so no parser (~25 ms of imports)
    from launcher.capacity import granularity
    from launcher.directives import parse_directives, parse_script

    word = config.directive_word if config is not None else "JOBNS"
    gran = granularity(config) if config is not None else 1
    found: list[Directives] = []
    if script:
        try:
            with open(str(script), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise JobnsError(f"read batch script {script}: {e.strerror}") from None
        found.append(parse_script(text, word, gran))
    if opts.get("directives"):
        found.append(parse_directives(str(opts["directives"]), word, gran))
    if COMMENT_PREFIX in comment:
        found.append(parse_directives(comment.split(COMMENT_PREFIX, 1)[1], word, gran))
    if not found:
        return None
    merged = found[0]
    for d in found[1:]:  # later sources fill in what earlier ones left unset
        merged.layout = merged.layout or d.layout
        merged.no_rm_tmpdir = merged.no_rm_tmpdir or d.no_rm_tmpdir
        merged.shm_capacity = merged.shm_capacity or d.shm_capacity
        merged.tmp_capacity = merged.tmp_capacity or d.tmp_capacity
        merged.stage_in += d.stage_in
        merged.stage_out += d.stage_out
        merged.warnings += d.warnings
    for w in merged.warnings:
        sys.stderr.write(f"jobns: warning: {w}\n")
    return merged


def apply_directives(opts: Options, d: Directives | None) -> None:
    """Flags given on the command line win over directives."""
    if d is None:
        return
    if opts.get("use_shared_tmpdir") is None and d.layout in ("shared", "per-node"):
        opts["use_shared_tmpdir"] = "" if d.layout == "shared" else "per-node"
    if d.no_rm_tmpdir:
        opts["no_rm_tmpdir"] = True


def main(opts: Options, _command: list[str]) -> int:
    from launcher import capacity, lifecycle, staging

    require_root("setup")
    environ = dict(os.environ)
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None, environ)
    directives = gather_directives(opts, environ, config)
    apply_directives(opts, directives)
    job = job_from(opts, environ)
    kill_wait = kill_wait_from(opts, config)
    plan = build(config, job)
    caps = capacity.plan(config, directives, job.layout)
    session_flag = str(opts["session_dir"]) if opts.get("session_dir") else None
    stg: Staging | None = None
    notes: list[str] = []
    if directives is not None or session_flag or config.staging.session_dir:
        # Only then is there anything to stage (and the path machinery worth importing).
        stg, notes = staging.build(config, job, plan, directives, session_flag,
                                   staging.symbols_for(job, environ))
    for note in notes:
        sys.stderr.write(f"jobns: setup {job.job_id}: {note}\n")
    if opts.get("dry_run"):
        lines = [plan.describe(), *caps.describe()]
        lines += stg.describe() if stg is not None else []
        print("\n".join(lines))
        return 0
    state.ensure_state_dir(config.state_dir)
    with state.JobLock(config.state_dir, job.job_id) as lock:
        old = state.read_record(config.state_dir, job.job_id)
        if old is not None:
            if old.get("options") != options_of(job, caps, stg):
                raise JobnsError(f"setup job {job.job_id}: it is already set up on this node "
                                 f"with other options ({old.get('options')}); run jobns "
                                 "teardown first")
            if old["state"] == "running":
                return 0  # idempotent: the prolog ran twice
            # An interrupted setup or epilog of the same job: finish it (nothing is lost:
            # staged-in inputs go back first), then set up anew.
            lifecycle.finish(config, job.job_id, old, force=True)
        try:
            lifecycle.start(config, job, plan, kill_wait, caps, stg)
        except BaseException:
            if not state.is_set_up(config.state_dir, job.job_id):
                lock.release_and_remove()  # nothing of the job is left: neither is its lock
            raise
    return 0


def setup_locked(config: Config, job: Job, plan: Plan, kill_wait: float) -> dict[str, object]:
    """Set a job up without directives (the first version's entry point)."""
    from launcher import lifecycle

    return lifecycle.start(config, job, plan, kill_wait, None, None)
