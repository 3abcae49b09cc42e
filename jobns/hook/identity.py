"""Which job a container belongs to, and its options, from annotations and its environment.

  annotation                value                         fallback
  org.jobns.job-id          the job id                    SLURM_JOB_ID in process.env,
                                                          else the container id
  org.jobns.user            user name or uid (host's)     SLURM_JOB_USER, SLURM_JOB_UID in
                                                          process.env, else process.user
                                                          (mapped through the container's
                                                          user namespace to the host uid)
  org.jobns.shared-tmpdir   "" or "shared" | "per-node"   unset: node-local directories
  org.jobns.no-rm-tmpdir    "true" | "false"              false

`jobns oci-config` flags (--job-id, --user, --use-shared-tmpdir, --no-rm-tmpdir)
take precedence over all of these. Every value is validated here, before it
becomes a path component or an owner (root runs this).

Whose directories a container gets (DESIGN.md rule 7): a job id or a user name is
anybody's to write into an annotation or process.env, so neither proves anything.
The container's own user does: process.user, mapped to the host through the
container's user namespace, must be the job's owner (the user a prolog recorded,
the user who owns the job's directories on this node, and a user named here), or
the container is refused (check_named, check_owner). Root in a container is no
exception: only a job owned by root is given to it.
"""

from __future__ import annotations

from jobns.launcher.model.job import (
    Job,
    User,
    hostname,
    layout_from,
    lookup_user,
    safe_component,
)
from jobns.launcher.model.request import Request
from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.hook.bundle import Bundle

JOB_ID = "org.jobns.job-id"
USER = "org.jobns.user"
SHARED = "org.jobns.shared-tmpdir"
NO_RM = "org.jobns.no-rm-tmpdir"
ALL = (JOB_ID, USER, SHARED, NO_RM)
SAFE_FIX = "use letters, digits, '.', '_', '-'"


def job_id_of(
    annotations: dict[str, str],
    env: dict[str, str],
    container_id: str | None,
    flag: str | None = None,
) -> str:
    for value, what in (
        (flag, "--job-id"),
        (annotations.get(JOB_ID), f"annotation {JOB_ID}"),
        (env.get("SLURM_JOB_ID"), "SLURM_JOB_ID in the container's process.env"),
        (container_id, "container id (no job id given)"),
    ):
        if value is not None:
            return safe_component(value, what, f"{SAFE_FIX}, or set annotation {JOB_ID}")
    raise JobnsError(
        f"no job id: pass --job-id, or set annotation {JOB_ID} or SLURM_JOB_ID in "
        "the bundle's process.env"
    )


def user_of(
    annotations: dict[str, str], env: dict[str, str], ids: tuple[int, int], flag: str | None = None
) -> tuple[User, str]:
    """The job user, and what named it ("" when it is the container's own: ids, the host
    uid and gid of process.user)."""
    for value, what in (
        (flag, "--user"),
        (annotations.get(USER), f"annotation {USER}"),
        (env.get("SLURM_JOB_USER"), "SLURM_JOB_USER in process.env"),
        (env.get("SLURM_JOB_UID"), "SLURM_JOB_UID in process.env"),
    ):
        if value:
            try:
                return lookup_user(value), what
            except JobnsError:
                raise JobnsError(
                    f"look up user {value!r} from {what}: no such user on this "
                    "host; name a user (or uid) known here"
                ) from None
    return by_ids(*ids), ""


def by_ids(uid: int, gid: int) -> User:
    """A user by host ids. The container's uid need not exist in the host's passwd: only
    ids are needed (jobns does not switch to this user; the runtime does)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return User(name, uid, gid, (gid,), "/")


def layout_of(annotations: dict[str, str], flag: str | None = None) -> str:
    if flag is not None:
        return layout_from(flag)
    value = annotations.get(SHARED)
    try:
        return layout_from(value)
    except JobnsError:
        raise JobnsError(
            f"annotation {SHARED}={value!r}: expected '', 'shared' or "
            "'per-node' (or no annotation for node-local directories)"
        ) from None


def no_rm_of(annotations: dict[str, str], flag: bool = False) -> bool:
    value = annotations.get(NO_RM, "false")
    if value not in ("true", "false"):
        raise JobnsError(f"annotation {NO_RM}={value!r}: expected 'true' or 'false'")
    return flag or value == "true"


def job_of(
    annotations: dict[str, str],
    bundle: Bundle,
    container_id: str | None,
    req: Request | None = None,
    ids: tuple[int, int] | None = None,
) -> tuple[Job, str]:
    """(the container's job, what named its user: "" if it is the container's own);
    req: oci-config's request (its flags). ids: the host uid and gid the container runs as
    (default: process.user mapped by config.json's linux.uidMappings).
    """
    req = req or Request()
    env = bundle.env
    job_id = job_id_of(annotations, env, container_id, req.job_id)
    user, named = user_of(annotations, env, ids or bundle.process_ids(), req.user)
    job = Job(
        job_id,
        user,
        hostname(),
        layout_of(annotations, req.shared),
        no_rm_of(annotations, req.no_rm_tmpdir),
    )
    return job, named


def _fix(uid: int, gid: int, container_uid: int) -> str:
    root = " (root in a container is not the job's user)" if container_uid == 0 else ""
    return (
        f"jobns gives a job's directories only to containers of the job's user{root}: "
        f"run the container as uid {uid} (process.user in config.json, podman --user "
        f"{uid}:{gid})"
    )


def check_named(who: str, container_uid: int, user: User, named: str) -> None:
    """A job user named by an annotation, process.env or --user must be the container's
    own (host) user: anybody can write a name."""
    if named and user.uid != container_uid:
        raise JobnsError(
            f"{who} runs as uid {container_uid} (process.user, mapped to the "
            f"host), but {named} names {user.name} (uid {user.uid}) as the job "
            f"user; {_fix(user.uid, user.gid, container_uid)}"
        )


def check_owner(who: str, container_uid: int, job_id: str, owner: User) -> None:
    """The container's (host) user must be the job's owner."""
    if owner.uid != container_uid:
        raise JobnsError(
            f"{who} runs as uid {container_uid} (process.user, mapped to the "
            f"host), but job {job_id} belongs to {owner.name} (uid {owner.uid}); "
            f"{_fix(owner.uid, owner.gid, container_uid)}"
        )
