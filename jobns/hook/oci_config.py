"""`jobns oci-config BUNDLE`: let the runtime itself make the job's mounts.

For launchers that prepare bundles (Slurm's oci.conf RunTimeCreate, a site's
wrapper): config.json gets
- bind mounts of the job's directories at /tmp, /var/tmp and /dev/shm
  (rbind,nosuid,nodev) and at the paths of its extra private directories (with their
  options: noexec, ro), replacing the bundle's own mounts there (runc spec's
  /dev/shm tmpfs) and placed before any mount beneath them; for a prolog's job
  prepared by root, their sources are root's own mount points of the verified trees,
  <state_dir>/mounts/JOB/oci/N-TARGET (launcher.mountns.cdi.mount_points, as a CDI spec's), so
  a runtime run as root follows nothing the job user can swap (she could rename her
  tree root in its sticky base and put a link to another job's tree in its place); run
  as the user, the trees' own paths (her runtime then runs as her, and gets nothing
  she could not open herself);
- the job environment (TMPDIR, JOBNS_JOB_ID, PMIx, ARC RUNTIME_*) in process.env;
- the org.jobns.* annotations, so the hooks find the same job whatever named it;
- unless a prolog (jobns setup) prepared the job on this node: jobns hook as a
  createRuntime hook (it registers the container's hold; the directories are
  already bound by the runtime, which it checks; its holder releases the hold when
  the container's init exits, and the job's last user removes the directories). A
  prolog's job needs no hook:
  its epilog removes the directories, and without hooks the bundle also suits a
  rootless runtime.
The directories are made now (a runtime's bind mount needs its source), owned by
the job user. The rewrite is atomic and idempotent.

Refused before anything is made, written or printed (DESIGN.md rule 7): a bundle
whose process user (process.user through linux.uidMappings) is not the job's owner
(the prolog's recorded user, the owner of the job's directories here, a user named
by --user, org.jobns.user or SLURM_JOB_USER/UID), and a rootfs with a symbolic link
(or a non-directory) at or on the way to /tmp, /var/tmp or /dev/shm, or reached
through a user's link (jobns/hook/rootfs.py check).
"""

from __future__ import annotations

import copy
import json
import os
import sys

from jobns.hook import bundle as bundle_mod
from jobns.hook import holds, identity, rootfs
from jobns.hook.hook import acquire_all, check_trees_owner, drop, recorded, recorded_plan
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.inputs import Options
from jobns.launcher.model.job import Job
from jobns.launcher.model.plan import Bind, Plan, build
from jobns.launcher.model.request import Request
from jobns.launcher.mountns.cdi import mount_points, point_paths
from jobns.launcher.system.errors import JobnsError

MOUNT_OPTIONS = ["rbind", "nosuid", "nodev"]
OCI = "oci"  # the sub-directory of the job's area (mountns.binds) with the bundles' sources


def main(opts: Options, command: list[str]) -> int:
    if len(command) != 1:
        raise JobnsError(
            "oci-config: expected one BUNDLE directory (usage: jobns oci-config [OPTIONS] BUNDLE)"
        )
    req = Request.from_options(opts)
    path = os.path.abspath(command[0])
    b = bundle_mod.load(path)
    environ = dict(os.environ)
    config_flag = req.config
    config = config_mod.load(config_flag, environ)
    who = f"bundle {path}"
    # The host user the bundle's process runs as (config.json's maps: no process yet).
    ids = b.process_ids()
    job, named = identity.job_of(b.annotations, b, None, req, ids=ids)
    if os.geteuid() != 0 and job.user.uid != os.geteuid():
        raise JobnsError(
            f"oci-config: the job user is {job.user.name} (uid "
            f"{job.user.uid}); only root may prepare a bundle for another user"
        )
    identity.check_named(who, ids[0], job.user, named)
    record = recorded(config.state_dir, job.job_id)
    if record:
        plan = recorded_plan(config, job, named, who, record, ids[0])
    else:
        plan = build(config, job)
        check_trees_owner(who, ids[0], job.job_id, plan)
    # Before anything is made or written: the runtime mounts the job's directories at
    # these targets, so none may have a link (or a non-directory) on its way.
    rootfs.check(b.rootfs, [bd.target for bd in plan.binds if plan.trees[bd.tree].extra is None])
    full = Plan(plan.trees, plan.binds, plan.env, plan.task_dirs, plan.owner)
    # Root prepares the bundle of a prolog's job for a runtime that may run as root: it
    # names root's own mount points of the verified trees, never the trees' paths (she
    # could swap her tree for a link to another job's between now and the runtime's
    # bind). Named after the full plan, so every bundle of the job shares them.
    points = {}
    if record and os.geteuid() == 0:
        points = dict(point_paths(config.state_dir, job.job_id, full, OCI))
    plan.binds = [bd for bd in plan.binds if usable(b.rootfs, plan, bd)]
    hooks = None if record else hook_entries(jobns_program(), config_file(config_flag, environ))
    new = rewrite(
        b.doc,
        [(target, points.get(target, src)) for target, src in binds_of(plan)],
        job_environment(config, job),
        annotations_of(job, named),
        hooks,
        options_of(plan),
    )
    if req.dry_run:
        print(json.dumps(new, indent=2))
        return 0
    uid, gid = plan.owner
    adopted = holds.adopted(config.state_dir, job.job_id)
    handles = acquire_all(plan, uid, gid, create=record is None, lock=False, adopted=adopted)
    try:
        if points:
            mount_points(config.state_dir, job.job_id, full, handles, OCI, f"oci-config {path}")
        bundle_mod.write_doc(path, new)
    except BaseException:
        drop(handles, adopted)
        raise
    for h in handles:
        h.close()
    return 0


def usable(root: str, plan: Plan, bind: Bind) -> bool:
    """An extra private directory is optional in a container, as in the hook: one whose
    mount point has a link or a non-directory on its way in this rootfs is left out of
    the bundle with a warning (the container sees its image's own directory there)."""
    if plan.trees[bind.tree].extra is None:
        return True
    try:
        rootfs.check(root, [bind.target])
    except JobnsError as e:
        sys.stderr.write(f"jobns: warning: {bind.target} left out of the bundle: {e}\n")
        return False
    return True


def binds_of(plan: Plan) -> list[tuple[str, str]]:
    """(target inside the container, host source) of each bind, in the plan's order."""
    return [
        (b.target, plan.trees[b.tree].path + (f"/{b.child}" if b.child else "")) for b in plan.binds
    ]


def options_of(plan: Plan) -> dict[str, tuple[str, ...]]:
    """The mount options of each bind target besides nosuid,nodev (extra directories)."""
    return {b.target: b.options for b in plan.binds if b.options}


def annotations_of(job: Job, named: str) -> dict[str, str]:
    out = {identity.JOB_ID: job.job_id}
    if named:
        out[identity.USER] = job.user.name
    if job.layout != "local":
        out[identity.SHARED] = "per-node" if job.layout == "per-node" else "shared"
    if job.no_rm:
        out[identity.NO_RM] = "true"
    return out


def jobns_program() -> str:
    """The jobns console script of this installation (next to its interpreter)."""
    path = os.path.join(os.path.dirname(sys.executable), "jobns")
    if not os.access(path, os.X_OK):
        raise JobnsError(
            f"oci-config: no executable {path} to name as the hook; install "
            "jobns into a virtual environment (ci/install-python)"
        )
    return path


def config_file(flag: str | None, environ: dict[str, str]) -> str | None:
    """The config the hooks must read too, when one was named (flag or JOBNS_CONFIG)."""
    named = flag or environ.get("JOBNS_CONFIG")
    return os.path.abspath(named) if named else None


def hook_entries(program: str, config: str | None) -> dict[str, dict[str, object]]:
    opts = ["--config", config] if config else []
    # createRuntime only: the holder it forks notices the container's exit itself, so a
    # poststop hook (a second Python start per container) is not needed.
    return {"createRuntime": {"path": program, "args": ["jobns", "hook", *opts, "createRuntime"]}}


def rewrite(
    doc: dict[str, object],
    binds: list[tuple[str, str]],
    env: dict[str, str],
    annotations: dict[str, str],
    hooks: dict[str, dict[str, object]] | None,
    options: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, object]:
    """PURE: config.json with the job's mounts, environment, annotations and hooks.
    options: a target's mount options besides rbind,nosuid,nodev (noexec, ro)."""
    new = copy.deepcopy(doc)
    old_mounts = new.get("mounts", [])
    if not isinstance(old_mounts, list):
        raise JobnsError("read config.json: mounts is not a list; fix the bundle")
    targets = {t for t, _ in binds}

    def dest(m: object) -> str:
        d = m.get("destination") if isinstance(m, dict) else None
        return os.path.normpath(d) if isinstance(d, str) and d else ""

    mounts = [m for m in old_mounts if dest(m) not in targets]
    for target, source in binds:
        entry: dict[str, object] = {
            "destination": target,
            "type": "bind",
            "source": source,
            "options": [*MOUNT_OPTIONS, *(options or {}).get(target, ())],
        }
        # A mount beneath the target (say /tmp/.X11-unix) must come after ours, or ours
        # would hide it.
        at = next(
            (i for i, m in enumerate(mounts) if dest(m).startswith(target + "/")), len(mounts)
        )
        mounts.insert(at, entry)
    new["mounts"] = mounts

    process = new.setdefault("process", {})
    if not isinstance(process, dict):
        raise JobnsError("read config.json: process is not an object; fix the bundle")
    old_env = process.get("env") or []  # null: no variables (as Bundle reads it)
    assert isinstance(old_env, list)  # checked by Bundle
    process["env"] = [e for e in old_env if str(e).partition("=")[0] not in env] + [
        f"{k}={v}" for k, v in env.items()
    ]

    ann = new.setdefault("annotations", {})
    if not isinstance(ann, dict):
        raise JobnsError("read config.json: annotations is not an object; fix the bundle")
    ann.update(annotations)

    if hooks:
        all_hooks = new.setdefault("hooks", {})
        if not isinstance(all_hooks, dict):
            raise JobnsError("read config.json: hooks is not an object; fix the bundle")
        for stage, entry in hooks.items():
            stage_hooks = all_hooks.setdefault(stage, [])
            if not isinstance(stage_hooks, list):
                raise JobnsError(f"read config.json: hooks.{stage} is not a list; fix the bundle")
            if entry not in stage_hooks:
                stage_hooks.append(entry)
    return new
