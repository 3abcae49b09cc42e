"""The persisted job record (jobns/schemas/job-state.schema.json) and its conversions.

record <-> job <-> plan live here and nowhere else: a new record from a job and its
plan, the job and the plan a record describes (the record is the truth about where
the trees are, even if the config changed since), the host paths of the job's
directories, and the few values a joining task reads from run.env.
"""

from __future__ import annotations

import time

from jobns.launcher.model.job import LAYOUTS
from jobns.launcher.model.plan import TMP_TARGETS, Bind, build, tree_from_record, tree_record
from jobns.launcher.protocol import state as state_mod
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fields import Doc
from jobns.launcher.system.mountinfo import Identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from jobns.launcher.model.capacity import Capacities
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import Job, User
    from jobns.launcher.model.plan import Plan, Tree

NO_CAPACITIES: dict[str, object] = {"shm": None, "tmp": None}
# A recorded tree's fields (jobns/schemas/job-state.schema.json "$defs/tree").
TREE_FIELDS = (
    "role",
    "base",
    "parents",
    "name",
    "children",
    "remove",
    "capacity",
    "image",
    "cover",
    "made",
    "mount",
    "target",
    "options",
    "backing",
)


class TreeRecord:
    """One recorded tree: where it is, whether it is removed, its capacity and backing
    (launcher/backing/kinds.py: chosen at setup, choose_backing), whether this
    setup made it (a failed setup removes only what it made), its cover (launcher.mountns.dirs),
    and the identity of the capacity's mount (launcher.system.mountinfo.Identity: how teardown,
    recover and gc know it from a user's mount named like it)."""

    __slots__ = ("backing", "capacity", "cover", "image", "made", "mount", "tree")

    def __init__(
        self,
        tree: Tree,
        capacity: int | None = None,
        made: bool = False,
        image: str | None = None,
        cover: str | None = None,
        mount: Identity | None = None,
        backing: str = "directory",
    ) -> None:
        self.tree = tree
        self.capacity = capacity
        self.backing = backing
        self.made = made
        self.image = image  # a disk capacity's image file (launcher.backing.diskimage), if any
        self.cover = cover  # the mount id of an extra directory's cover (launcher.mountns.dirs)
        self.mount = mount  # None: not mounted yet, or a record of the previous version

    @classmethod
    def from_dict(cls, d: dict[str, object] | Doc, where: str = "job record") -> TreeRecord:
        t = d if isinstance(d, Doc) else Doc(d, where, "tree.")
        t.closed(TREE_FIELDS)
        mount = t.obj("mount", required=False)
        if mount is not None:
            mount.closed(("id", "dev", "fstype"))
            mount.integer("id", minimum=1), mount.integer("dev", minimum=0)
            mount.string("fstype", nonempty=True)
        return cls(
            tree_from_record(t),
            t.integer("capacity", required=False, minimum=1, null=True),
            t.boolean("made", required=False) is not False,
            t.string("image", required=False, nonempty=True),
            _cover(t),
            mount=None if mount is None else Identity.from_dict(mount.d),
            backing=recorded_backing(t.d),
        )

    def to_dict(self) -> dict[str, object]:
        out = tree_record(self.tree, self.capacity)
        out["backing"] = self.backing
        out["made"] = self.made
        return _known(
            out,
            image=self.image,
            cover=self.cover,
            mount=None if self.mount is None else self.mount.to_dict(),
        )


def _known(out: dict[str, object], **optional: object) -> dict[str, object]:
    """out with each optional field that has a value: the record leaves out, rather than
    writes null for, what it does not know."""
    out.update((k, v) for k, v in optional.items() if v is not None)
    return out


def _cover(t: Doc) -> str | None:
    cover = t.string("cover", required=False)
    if cover is not None and not (cover.isascii() and cover.isdigit()):
        raise JobnsError(f"{t.where}: '{t.path}cover' must be a mount id (digits)")
    return cover


class Pins:
    """The pin files of a set-up job and the identity of the mount namespace pinned
    (pid: the job's PID namespace, with [namespace] pid)."""

    __slots__ = ("mnt", "mnt_dev", "mnt_ino", "pid", "user")

    def __init__(
        self,
        user: str | None = None,
        mnt: str | None = None,
        mnt_dev: int | None = None,
        mnt_ino: int | None = None,
        pid: str | None = None,
    ) -> None:
        self.user = user
        self.mnt = mnt
        self.mnt_dev = mnt_dev
        self.mnt_ino = mnt_ino
        self.pid = pid

    @classmethod
    def from_dict(cls, d: Doc) -> Pins:
        d.closed(("user", "mnt", "mnt_dev", "mnt_ino", "pid"))
        return cls(
            d.string("user", required=False, null=True),
            d.string("mnt", required=False, null=True),
            d.integer("mnt_dev", required=False, null=True),
            d.integer("mnt_ino", required=False, null=True),
            d.string("pid", required=False),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "user": self.user,
            "mnt": self.mnt,
            "mnt_dev": self.mnt_dev,
            "mnt_ino": self.mnt_ino,
            **({"pid": self.pid} if self.pid is not None else {}),
        }


class Record:
    """A job's persisted record (jobns/schemas/job-state.schema.json), typed.

    from_dict checks each field as it reads it (a damaged record is an error, never a
    guess); to_dict gives the document state.write_record writes."""

    __slots__ = (
        "arc",
        "capacities",
        "created",
        "errors",
        "gid",
        "history",
        "hostname",
        "job_id",
        "kill_wait",
        "layout",
        "no_rm_tmpdir",
        "options",
        "pins",
        "prolog_at",
        "ran",
        "run",
        "staging",
        "state",
        "teardown_failures",
        "trees",
        "uid",
        "updated",
        "user_name",
        "version",
    )

    def __init__(
        self,
        job_id: str,
        user_name: str,
        uid: int,
        gid: int,
        hostname: str,
        layout: str,
        no_rm_tmpdir: bool,
        state: str,
        kill_wait: float,
    ) -> None:
        now = time.time()
        self.version = 1
        self.job_id = job_id
        self.user_name, self.uid, self.gid = user_name, uid, gid
        self.hostname = hostname
        self.layout = layout
        self.no_rm_tmpdir = no_rm_tmpdir
        self.state = state
        self.created = self.updated = now
        self.trees: list[TreeRecord] = []
        self.pins = Pins()
        self.kill_wait = kill_wait
        self.arc: dict[str, object] | None = None
        self.teardown_failures = 0
        self.errors: list[str] = []
        self.history: list[dict[str, object]] = [{"state": state, "at": now}]
        self.options: dict[str, object] | None = None
        self.ran: bool | None = False  # None: an old record; the state decides
        self.run: str | None = None  # which run of the job (launcher.protocol.state marks)
        self.prolog_at: float | None = None  # when that run's prolog left its mark
        self.capacities: dict[str, int | None] | dict[str, object] = dict(NO_CAPACITIES)
        self.staging: dict[str, object] | None = None

    @classmethod
    def from_dict(cls, d: object, where: str = "job record") -> Record:
        """The record document d (named `where` in messages), each field checked as it
        is read: a damaged record is an error, never a guess."""
        doc = Doc(d, where)
        if doc.integer("version") != 1:
            raise JobnsError(f"{where}: 'version' must be 1 (a record of another jobns)")
        user = doc.obj("user")
        assert user is not None
        user.closed(("name", "uid", "gid"))
        r = cls(
            str(doc.string("job_id", nonempty=True)),
            str(user.string("name")),
            int(user.integer("uid", minimum=0) or 0),
            int(user.integer("gid", minimum=0) or 0),
            str(doc.string("hostname")),
            str(doc.string("layout", choices=LAYOUTS)),
            bool(doc.boolean("no_rm_tmpdir")),
            str(doc.string("state", choices=state_mod.STATES)),
            float(doc.number("kill_wait", minimum=0) or 0.0),
        )
        r.created = float(doc.number("created") or 0.0)
        r.updated = float(doc.number("updated") or 0.0)
        r.trees = [TreeRecord.from_dict(t) for t in doc.objects("trees")]
        pins = doc.obj("pins")
        assert pins is not None
        r.pins = Pins.from_dict(pins)
        r.arc = doc.raw_obj("arc")
        r.teardown_failures = int(doc.integer("teardown_failures", minimum=0) or 0)
        r.errors = doc.strings("errors", required=False) or []
        r.history = []
        for h in doc.objects("history"):
            h.string("state")
            h.number("at")
            r.history.append(h.d)
        r.options = doc.raw_obj("options")
        r.ran = doc.boolean("ran", required=False)
        r.run = doc.string("run", required=False)
        r.prolog_at = doc.number("prolog_at", required=False)
        caps = doc.raw_obj("capacities")
        r.capacities = caps if caps is not None else dict(NO_CAPACITIES)
        r.staging = doc.raw_obj("staging")
        return r

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "version": self.version,
            "job_id": self.job_id,
            "user": {"name": self.user_name, "uid": self.uid, "gid": self.gid},
            "hostname": self.hostname,
            "layout": self.layout,
            "no_rm_tmpdir": self.no_rm_tmpdir,
            "state": self.state,
            "created": self.created,
            "updated": self.updated,
            "trees": [t.to_dict() for t in self.trees],
            "pins": self.pins.to_dict(),
            "kill_wait": self.kill_wait,
            "arc": self.arc,
            "teardown_failures": self.teardown_failures,
            "errors": list(self.errors),
            "history": list(self.history),
            "capacities": self.capacities,
            "staging": self.staging,
        }
        return _known(
            out, options=self.options, ran=self.ran, run=self.run, prolog_at=self.prolog_at
        )

    def copy(self) -> Record:
        import copy

        return Record.from_dict(copy.deepcopy(self.to_dict()))

    def set_state(self, new: str) -> None:
        assert new in state_mod.STATES, new
        now = time.time()
        self.state = new
        self.updated = now
        self.history.append({"state": new, "at": now})

    def has_run(self, default: bool) -> bool:
        """Did the job reach `running`? (old records without the field: `default`)"""
        return default if self.ran is None else self.ran

    def scratch_record(self) -> dict[str, object] | None:
        """The staging scratch tree's record, if the job has one."""
        tree = self.staging.get("scratch_tree") if isinstance(self.staging, dict) else None
        return tree if isinstance(tree, dict) else None


def options_of(
    job: Job, caps: Capacities | None = None, session_dir: str | None = None
) -> dict[str, object]:
    """What must match for a repeated setup to be the same setup (session_dir: the
    staging's, launcher.staging.model)."""
    return {
        "user": job.user.uid,
        "layout": job.layout,
        "no_rm_tmpdir": job.no_rm,
        "capacities": caps.record() if caps is not None else dict(NO_CAPACITIES),
        "session_dir": session_dir,
    }


def new_record(
    job: Job,
    plan: Plan | None,
    kill_wait: float,
    config: Config,
    caps: Capacities | None = None,
    staging: dict[str, object] | None = None,
    session_dir: str | None = None,
    state: str = "pending",
    run: str | None = None,
) -> Record:
    """A fresh record; plan None for a refused job (it has no trees); `run` is the job's
    run (launcher.model.job.run_from); staging and session_dir: the job's staging's record
    and session directory (launcher.staging.model), if it stages."""
    r = Record(
        job.job_id,
        job.user.name,
        job.user.uid,
        job.user.gid,
        job.hostname,
        job.layout,
        job.no_rm,
        state,
        kill_wait,
    )
    if plan is not None:
        r.trees = []
        for t in plan.trees:
            size = size_of(t, caps)
            r.trees.append(TreeRecord(t, size, backing=choose_backing(config, t, size)))
    arc = config.raw.get("arc")
    r.arc = arc if isinstance(arc, dict) else None
    r.options = options_of(job, caps, session_dir)
    r.run = run
    if caps is not None:
        r.capacities = caps.record()
    r.staging = staging
    return r


def size_of(tree: Tree, caps: Capacities | None) -> int | None:
    """The size enforced on a tree: its capacity, or an extra directory's sized backing."""
    if tree.extra is not None:
        return tree.extra.size if tree.extra.backing != "directory" else None
    return caps.for_tree(tree.role) if caps is not None else None


def choose_backing(config: Config, tree: Tree, size: int | None) -> str:
    """The backing of a tree (launcher/backing/kinds.py), decided once, at setup: an extra
    directory's is its [[dirs]] entry's; a /tmp capacity's the node's [capacity]
    tmp_backing; /dev/shm's a tmpfs; a tree without a size a plain directory."""
    if tree.extra is not None:
        return tree.extra.backing
    if size is None:
        return "directory"
    if tree.role == "local":
        from jobns.launcher.model.capacity import tmp_backing

        return tmp_backing(config)
    return "tmpfs"


def recorded_backing(d: Mapping[str, object]) -> str:
    """A recorded tree's backing. Records of earlier versions name it only for an extra
    directory: there a disk image was the only disk, a capacity the only tmpfs."""
    name = d.get("backing")
    if isinstance(name, str):
        return name
    if isinstance(d.get("image"), str):
        return "disk"
    return "tmpfs" if isinstance(d.get("capacity"), int) else "directory"


def user_of(record: Record) -> User:
    """The record's user, looked up again for the groups (else only its ids)."""
    from jobns.launcher.model.job import User, lookup_user

    try:
        return lookup_user(str(record.uid))
    except JobnsError:
        return User(record.user_name, record.uid, record.gid, (record.gid,), "/")


def job_of(record: Record, user: User | None = None) -> Job:
    """The job a record describes (its user looked up again, unless given)."""
    from jobns.launcher.model.job import Job

    return Job(
        record.job_id, user or user_of(record), record.hostname, record.layout, record.no_rm_tmpdir
    )


def plan_of(config: Config, record: Record, job: Job) -> Plan:
    """The job's plan with the recorded trees; the binds of its extra directories come
    from the record too (the [[dirs]] of today's config may differ from setup's)."""
    plan = build(config, job, dirs=False)
    plan.trees = [t.tree for t in record.trees]
    plan.binds += [
        Bind(i, "", t.tree.extra.target, t.tree.extra.options)
        for i, t in enumerate(record.trees)
        if t.tree.extra is not None
    ]
    return plan


def host_dirs(record: Record) -> dict[str, str]:
    """Where the job's /tmp, /var/tmp and /dev/shm are on the host."""
    out: dict[str, str] = {}
    for t in record.trees:
        tree = t.tree
        if tree.extra is not None:
            out[tree.extra.target] = tree.path
        elif tree.role == "shm":
            out["/dev/shm"] = tree.path
        else:
            out.update({target: f"{tree.path}/{child}" for child, target in TMP_TARGETS})
    return out


def user_ids(record: Record) -> tuple[int, int, list[int]]:
    from jobns.launcher.model.job import user_ids as ids

    return ids(record.uid, record.gid)


def run_env_values(record: Record, config: Config) -> dict[str, str]:
    values = {
        "job_id": record.job_id,
        "uid": str(record.uid),
        "gid": str(record.gid),
        "user": record.user_name,
        "layout": record.layout,
        "user_pin": record.pins.user or "",
        "mnt_pin": str(record.pins.mnt),
        # The namespace's identity (its nsfs device and inode, as stat of
        # /proc/self/ns/mnt shows them): a process the job_container plugin put in the
        # job's namespace already, where the pins are not visible, knows it is inside.
        **(
            {"mnt_ns": f"{record.pins.mnt_dev}:{record.pins.mnt_ino}"}
            if record.pins.mnt_dev is not None and record.pins.mnt_ino is not None
            else {}
        ),
        **({"pid_pin": record.pins.pid} if record.pins.pid else {}),
        "kill_wait": repr(record.kill_wait),
    }
    # The job environment as setup saw the config: later runs use exactly this.
    arc = config.arc
    if arc is not None:
        scratchdir = arc.scratchdir
        staging = record.staging
        if isinstance(staging, dict) and staging.get("runtime_scratchdir"):
            # Dynamic scratch: ARC's wrapper appends <arc-job-id> to this (ARC's ENV/LRMS-SCRATCH).
            scratchdir = str(staging["runtime_scratchdir"])
        values.update(
            {
                "arc.shared_filesystem": "1" if arc.shared_filesystem else "",
                "arc.scratchdir": scratchdir,
                "arc.movetool": arc.movetool,
                "arc.shared_scratch": arc.shared_scratch,
            }
        )
    return values


def load(state_dir: str, job_id: str) -> Record | None:
    """A job's record on this node, or None; JobnsError if it is damaged."""
    doc = state_mod.read_record(state_dir, job_id)
    if doc is None:
        return None
    where = f"read job state {state_mod.job_dir(state_dir, job_id)}/{state_mod.STATE}"
    try:
        return Record.from_dict(doc, where)
    except JobnsError as e:
        raise JobnsError(f"{e}; `jobns teardown --force` removes a broken record") from None


def save(state_dir: str, record: Record) -> None:
    state_mod.write_record(state_dir, record.job_id, record.to_dict(), record.uid)


def enter(state_dir: str, record: Record, new: str) -> None:
    """Move the job to a new state and persist it before any of that state's work."""
    record.set_state(new)
    save(state_dir, record)
    from jobns.launcher.system.log import log

    log(f"state {new}", record.job_id, record.user_name)
    state_mod.pause_point(new)
