"""`jobns hook [STAGE]`: the OCI hook (design: jobns/hook/__init__.py).

createRuntime (or prestart): the container's job gets its directories (made, or
the prolog's reused) and they are bound over <rootfs>/tmp, /var/tmp, /dev/shm in
the container's mount namespace; a standalone job's container gets a hold.
poststop: the container's hold is released; the last user removes the trees.

A failure is one line on stderr (`jobns: ...`, all a runtime shows of a hook)
and exit status 125, which aborts the container; whatever this call made is
undone first.
"""

from __future__ import annotations

import os

from jobns.hook import holds
from jobns.hook import state as oci
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.job import safe_component
from jobns.launcher.system.errors import JobnsError

# poststop needs none of what follows (ctypes alone is ~2.5 ms of a ~12 ms start);
# createRuntime imports it in create().

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Callable

    from jobns.hook.bundle import Bundle
    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.inputs import Options
    from jobns.launcher.model.job import Job
    from jobns.launcher.model.plan import Plan
    from jobns.launcher.model.record import Record
    from jobns.launcher.protocol.state import JobLock


def main(opts: Options, command: list[str]) -> int:
    if len(command) > 1:
        raise JobnsError(
            f"hook: one STAGE at most, not {' '.join(command)!r} (usage: "
            "jobns hook [createRuntime|prestart|poststop] < STATE)"
        )
    if os.geteuid() != 0:
        raise JobnsError(
            "jobns hook must run as root (rootful runc, crun and Podman run hooks "
            "as root); for rootless containers use a prolog (jobns setup) and "
            "jobns oci-config"
        )
    st = oci.parse(oci.read_stdin())
    stage = oci.stage_for(command[0] if command else None, st.status)
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None, dict(os.environ))
    cid = safe_component(
        st.id, "container id", "name the container with letters, digits, '.', '_', '-'"
    )
    if stage == oci.POSTSTOP:
        poststop(config, st.bundle, cid)
    else:
        job_id = opts.get("job_id")
        create(config, st, cid, None if job_id is None else str(job_id))
    return 0


def create(config: Config, st: oci.OciState, cid: str, set_up: str | None = None) -> None:
    """set_up: the job id --job-id names (a job spec's CDI hook): that job, which a prolog
    must have set up here; the container's annotations and environment do not count."""
    from jobns.hook import bundle as bundle_mod
    from jobns.hook import identity, mounts
    from jobns.launcher.protocol import state

    if st.pid <= 0:
        raise JobnsError(
            f"createRuntime hook of container {cid}: the OCI state has no pid; "
            "run jobns as a createRuntime or prestart hook"
        )
    b = bundle_mod.load(st.bundle)
    who = f"container {cid}"
    # Who the container runs as on the host (its init's user namespace, live): a job id
    # or a user name is anybody's to write, so they must agree with it (identity.py).
    ids = b.process_ids(st.pid)
    # The state's annotations are the runtime's word; config.json's the bundle author's.
    if set_up is not None:
        # The CDI spec's hook: the runtime bound the job's directories already; check whose
        # container it is, and that what was bound is the job's (SECURITY.md rule 7).
        return check_set_up(config, st, cid, set_up, b, ids[0])
    job, named = identity.job_of({**b.annotations, **st.annotations}, b, cid, ids=ids)
    identity.check_named(who, ids[0], job.user, named)
    try:
        pidfd = os.pidfd_open(st.pid)
    except OSError as e:
        raise JobnsError(
            f"createRuntime hook of container {cid}: pid {st.pid}: {e.strerror}"
        ) from None
    try:
        ns_fd = mounts.open_namespace(st.pid, cid)
        try:
            state.ensure_state_dir(config.state_dir)
            held = holds.live(config.state_dir, job.job_id, cid)
            if held is not None and held.get("pid") != str(st.pid):
                # An earlier container with this id, whose holder is finishing; not under
                # the JobLock, which that holder takes to retire its hold.
                holds.wait_gone(config.state_dir, job.job_id, cid)
                held = None
            with state.JobLock(config.state_dir, job.job_id) as lock:
                _create_locked(
                    config, st, cid, job, named, ids[0], b, pidfd, ns_fd, lock, held is not None
                )
        finally:
            os.close(ns_fd)
    finally:
        os.close(pidfd)


def _create_locked(
    config: Config,
    st: oci.OciState,
    cid: str,
    job: Job,
    named: str,
    container_uid: int,
    b: Bundle,
    pidfd: int,
    ns_fd: int,
    lock: JobLock,
    held: bool,
) -> None:
    from jobns.hook import mounts
    from jobns.launcher.model.plan import build

    ns_path = f"/proc/{st.pid}/ns/mnt"
    who = f"container {cid}"
    record = recorded(config.state_dir, job.job_id)
    if record is not None:
        # Set up by a prolog: its trees, verified, never removed here (the epilog's).
        plan = recorded_plan(config, job, named, who, record, container_uid)
        uid, gid = plan.owner
        handles = acquire_all(plan, uid, gid, create=False, lock=False)
        try:
            if not already_bound(st.pid, b.rootfs, plan, handles):
                mounts.apply(ns_fd, ns_path, b.rootfs, plan, handles)
        finally:
            for h in handles:
                h.close()
        return
    plan = build(config, job)
    check_trees_owner(who, container_uid, job.job_id, plan)
    uid, gid = plan.owner
    # Share-locked like a `jobns run` task's: a finishing task cannot remove them now.
    adopted = holds.adopted(config.state_dir, job.job_id)
    handles = acquire_all(plan, uid, gid, create=True, lock=True, adopted=adopted)
    pending = None
    try:
        if not held:  # else: a second createRuntime/prestart call of the same container
            pending = holds.prepare(config.state_dir, job, cid, st.pid, st.bundle)
        # A bundle from oci-config: the runtime bound the trees already (no bind child).
        if not already_bound(st.pid, b.rootfs, plan, handles):
            mounts.apply(ns_fd, ns_path, b.rootfs, plan, handles)
        if pending is not None:
            pending.commit(handles, pidfd)
    except BaseException:
        if pending is not None:
            pending.abort()
        drop(handles, adopted)
        if holds.unused(config.state_dir, job.job_id):
            lock.release_and_remove()
        raise
    for h in handles:
        h.close()  # the holder has its own copies (and with them the share locks)


def check_set_up(
    config: Config, st: oci.OciState, cid: str, job_id: str, b: Bundle, container_uid: int
) -> None:
    """createRuntime for a job named by --job-id (its CDI spec's hook): the job must be
    set up here and owned by the container's user; its trees are bound where the runtime
    did not bind them (or bound something else: a tree renamed and replaced by a link
    after the spec was written), so the container sees exactly the verified trees."""
    from jobns.hook import identity, mounts
    from jobns.launcher.model.job import User, safe_component

    job_id = safe_component(job_id, "--job-id", "name a job jobns setup prepared")
    who = f"container {cid}"
    if st.pid <= 0:
        raise JobnsError(
            f"createRuntime hook of container {cid}: the OCI state has no pid; "
            "run jobns as a createRuntime or prestart hook"
        )
    record = recorded(config.state_dir, job_id)
    if record is None:
        raise JobnsError(
            f"{who}: job {job_id} is not set up on this node (no jobns setup, or "
            "it was torn down); start the container inside the job"
        )
    owner = User(record.user_name, record.uid, record.gid, (record.gid,), "/")
    identity.check_owner(who, container_uid, job_id, owner)
    from jobns.launcher.model.record import job_of

    plan = recorded_plan(config, job_of(record, owner), "", who, record, container_uid)
    uid, gid = plan.owner
    ns_fd = mounts.open_namespace(st.pid, cid)
    try:
        handles = acquire_all(plan, uid, gid, create=False, lock=False)
        try:
            if not already_bound(st.pid, b.rootfs, plan, handles):
                mounts.apply(ns_fd, f"/proc/{st.pid}/ns/mnt", b.rootfs, plan, handles)
        finally:
            for h in handles:
                h.close()
    finally:
        os.close(ns_fd)


def already_bound(pid: int, rootfs: str, plan: Plan, handles: list[TreeHandle]) -> bool:
    """Did the runtime bind exactly the job's verified trees at every target (a CDI spec's
    or oci-config's mounts)? Looked at through /proc/PID/root, which resolves in the
    container's mount namespace: no bind child to fork, the common case of a CDI hook.
    Only a yes skips anything; any doubt (a link on the way, another directory) leaves it
    to mounts.apply, which walks without following links and binds or refuses."""
    from jobns.launcher.backing import fs

    if os.path.realpath(rootfs) != rootfs:
        return False  # a link on the way to the rootfs: mounts.apply decides (rootfs.py)
    for bind in plan.binds:
        try:
            st = os.stat(f"/proc/{pid}/root{rootfs}{bind.target}", follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != fs.identity(handles[bind.tree], bind.child):
            return False
        if not flags_ok(f"/proc/{pid}/root{rootfs}{bind.target}", bind.options):
            return False  # mounts.apply remounts it with the job's flags
    return True


def flags_ok(path: str, options: tuple[str, ...]) -> bool:
    """Has the mount at path nosuid,nodev and these options (noexec, ro)?"""
    from jobns.launcher.mountns.namespace import has_flags

    try:
        return has_flags(os.statvfs(path), options)
    except OSError:
        return False


def recorded(state_dir: str, job_id: str) -> Record | None:
    """The prolog's record of the job, if any (a stat first: a record costs json)."""
    from jobns.launcher.model import record as records
    from jobns.launcher.protocol import state

    if not os.path.exists(f"{state.job_dir(state_dir, job_id)}/{state.STATE}"):
        return None
    return records.load(state_dir, job_id)


def recorded_plan(
    config: Config, job: Job, named: str, who: str, record: Record, container_uid: int
) -> Plan:
    """The plan of a job a prolog set up: its recorded trees and owner, who must be the
    container's (host) user, container_uid. `who` (the container or bundle) is for
    messages; `named`: what named the job user (checked against the container's user by
    identity.check_named before)."""
    from jobns.hook import identity
    from jobns.launcher.model.job import User
    from jobns.launcher.model.record import job_of, plan_of

    if record.state != "running":
        raise JobnsError(
            f"{who}: job {job.job_id} is {record.state} on this node "
            "(its prolog did not finish, or its epilog runs); wait, or clean it "
            f"up with jobns teardown --job-id {job.job_id}"
        )
    owner = User(record.user_name, record.uid, record.gid, (record.gid,), "/")
    identity.check_owner(who, container_uid, job.job_id, owner)
    if named and job.user.uid != record.uid:  # (implied by the two checks; kept as a guard)
        raise JobnsError(
            f"{who}: job {job.job_id} was set up for uid {record.uid}, not for "
            f"{job.user.name} (uid {job.user.uid}); fix {named}"
        )
    # The record is the truth about where the trees are, even if the config changed since.
    plan = plan_of(config, record, job_of(record, owner))
    scratch = [t for t in plan.trees if t.extra is None]
    if len(scratch) != 2:
        raise JobnsError(
            f"read job state of {job.job_id}: {len(scratch)} scratch trees recorded, "
            "expected 2 (jobns teardown, then setup)"
        )
    return plan


def check_trees_owner(who: str, container_uid: int, job_id: str, plan: Plan) -> None:
    """A standalone job's directories already on this node are its owner's: a container
    of another user is refused by name here (acquire_tree would refuse the trees too,
    with a message that names neither the container nor the fix). An lstat walk, only
    for the message: acquire_tree verifies, fd by fd."""
    import stat

    from jobns.hook import identity

    for tree in plan.trees:
        path = tree.base.rstrip("/")
        for part in (*tree.parents, tree.name):
            path = f"{path}/{part}"
            try:
                st = os.lstat(path)
            except OSError:
                break
            if not stat.S_ISDIR(st.st_mode):
                break
            if st.st_uid != container_uid:
                identity.check_owner(
                    who, container_uid, job_id, identity.by_ids(st.st_uid, st.st_gid)
                )


def acquire_all(
    plan: Plan,
    uid: int,
    gid: int,
    create: bool,
    lock: bool,
    adopted: Callable[[], bool] | None = None,
) -> list[TreeHandle]:
    from jobns.launcher.backing import fs

    handles: list[TreeHandle] = []
    try:
        for tree in plan.trees:
            handles.append(fs.acquire_tree(tree, uid, gid, create=create, lock=lock))
    except BaseException:
        drop(handles, adopted)
        raise
    return handles


def drop(handles: list[TreeHandle], adopted: Callable[[], bool] | None = None) -> list[str]:
    """Undo acquire_all: remove the trees it made (unless another task joined them
    meanwhile, or a prolog has set the job up since: adopted()), close the others."""
    from jobns.launcher.backing import fs

    errors: list[str] = []
    for h in handles:
        if h.created:
            errors += fs.release_tree(h, adopted)
        else:
            h.close()
    return errors


def poststop(config: Config, bundle: str, cid: str) -> None:
    errors: list[str] = []
    for job_id in holds.find(config.state_dir, cid, bundle):
        errors += holds.release(config.state_dir, job_id, cid, config)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise JobnsError(f"poststop hook of container {cid}: {errors[0]}{more}")
