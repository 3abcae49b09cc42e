"""PURE planning: config + job -> the directories, binds and environment of a job.

Nothing here touches the system, so every layout is unit-tested without root.
The layouts are the three of docs/design.md "Directory layouts":

  local      <local_base>/job-ID/{tmp,var_tmp}            + <shm_base>/job-ID
  shared     <shared_base>/job-ID/{tmp,var_tmp}           + <shm_base>/job-ID
  per-node   <shared_base>/job-ID/HOST/{tmp,var_tmp}      + <shm_base>/job-ID

plus, in every layout, one node-local tree <base>/job-ID per [[dirs]] entry (an extra
private directory: config.DirConfig), bound over its path with its own options.

A *tree* is one directory jobns makes as a unit (built under a temporary name
and renamed into place, so no half-made tree is ever visible) and later removes
as a unit; the binds point at a tree or at one of its children.
"""

from __future__ import annotations

from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fields import Doc

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.model.config import Config
    from jobns.launcher.model.job import Job

TOP_MODE = 0o700  # a tree root: only the job user may enter it from the host
SCRATCH_MODE = 0o1777  # /tmp and /var/tmp inside the job, like the real ones
TMP_TARGETS = (("tmp", "/tmp"), ("var_tmp", "/var/tmp"))


class Extra:
    """What makes a tree an extra private directory ([[dirs]]): where the job sees it,
    its backing ("directory", "tmpfs", "disk"), that backing's size in bytes and its
    mount options besides nosuid,nodev. Kept in the job record with the tree, so
    everything after setup works from the record, never from a config changed since."""

    __slots__ = ("backing", "options", "size", "target", "templated")

    def __init__(
        self,
        target: str,
        backing: str,
        size: int | None,
        options: tuple[str, ...],
        templated: bool = False,
    ) -> None:
        self.target = target  # with the job's symbols (%j, %u) expanded: launcher.model.dirpath
        self.backing = backing
        self.size = size
        self.options = options
        self.templated = templated  # the target names the job or its user: made per job

    def describe(self) -> list[str]:
        """The tree's heading; its backing says what holds it (backing/kinds.py)."""
        opts = ",".join(("nosuid", "nodev", *self.options))
        return [f"# extra private directory {self.target}: backing {self.backing}, options {opts}"]


class Tree:
    """One directory tree jobns makes for the job and removes with it."""

    __slots__ = ("base", "children", "extra", "name", "parents", "remove", "role")

    def __init__(
        self,
        role: str,
        base: str,
        parents: tuple[str, ...],
        name: str,
        children: tuple[str, ...],
        remove: bool,
        extra: Extra | None = None,
    ) -> None:
        self.role = role  # "local", "shared", "shm" or "dir" (an extra directory)
        self.base = base  # trusted, from the site config
        self.parents = parents  # directories between base and the tree (per-node: job-ID)
        self.name = name
        self.children = children
        self.remove = remove  # False only for shared trees under --no-rm-tmpdir
        self.extra = extra

    @property
    def rel(self) -> str:
        return "/".join((*self.parents, self.name))

    @property
    def path(self) -> str:
        return f"{self.base.rstrip('/')}/{self.rel}"

    def describe(self) -> list[str]:
        lines = [] if self.extra is None else self.extra.describe()
        lines += [
            f"mkdir  {self.base.rstrip('/')}/{'/'.join(self.parents[: i + 1])}"
            f"  mode {TOP_MODE:04o} (kept while another node uses it)"
            for i in range(len(self.parents))
        ]
        lines.append(f"mkdir  {self.path}  mode {TOP_MODE:04o}")
        lines += [f"mkdir  {self.path}/{c}  mode {SCRATCH_MODE:04o}" for c in self.children]
        when = (
            "when the job's last task on this node ends"
            if self.remove
            else "never (--no-rm-tmpdir)"
        )
        lines.append(f"remove {self.path}  {when}")
        return lines


def tree_record(t: Tree, capacity: int | None = None) -> dict[str, object]:
    """A tree as the job record keeps it. "made": this setup created it (a failed setup
    removes only what it made)."""
    out: dict[str, object] = {
        "role": t.role,
        "base": t.base,
        "parents": list(t.parents),
        "name": t.name,
        "children": list(t.children),
        "remove": t.remove,
        "capacity": capacity,
        "made": False,
    }
    if t.extra is not None:
        out.update(target=t.extra.target, options=list(t.extra.options), backing=t.extra.backing)
    return out


def tree_from_record(r: dict[str, object] | Doc, where: str = "job record") -> Tree:
    """A recorded tree (tree_record's form), each field checked as it is read."""
    d = r if isinstance(r, Doc) else Doc(r, where, "tree.")
    extra = None
    target = d.string("target", required=False)
    options = d.strings("options", required=False) or []
    if any(o not in ("noexec", "ro") for o in options):
        raise JobnsError(f"{d.where}: '{d.path}options' must name only noexec and ro")
    backing = d.string("backing", required=False, choices=BACKINGS)
    if target is not None:
        if not target.startswith("/") or len(target) < 2:
            raise JobnsError(f"{d.where}: '{d.path}target' must be an absolute path")
        extra = Extra(
            target,
            backing or "directory",
            d.integer("capacity", required=False, minimum=1, null=True),
            tuple(options),
        )
    return Tree(
        str(d.string("role", choices=TREE_ROLES)),
        str(d.string("base", nonempty=True)),
        tuple(d.strings("parents") or ()),
        str(d.string("name", nonempty=True)),
        tuple(d.strings("children") or ()),
        bool(d.boolean("remove")),
        extra,
    )


# What a recorded tree may be (jobns/schemas/job-state.schema.json "$defs/tree").
TREE_ROLES = ("local", "shared", "shm", "scratch", "dir")
BACKINGS = ("directory", "tmpfs", "disk")


class Bind:
    __slots__ = ("child", "options", "target", "tree")

    def __init__(self, tree: int, child: str, target: str, options: tuple[str, ...] = ()) -> None:
        self.tree = tree  # index into Plan.trees
        self.child = child  # "" binds the tree root itself
        self.target = target
        self.options = options  # besides nosuid,nodev: "noexec", "ro"

    @property
    def mount_options(self) -> list[str]:
        """Every option of the bind, as an OCI or CDI mount entry spells them."""
        return ["nosuid", "nodev", *self.options]

    def describe(self, plan: Plan) -> str:
        src = plan.trees[self.tree].path + (f"/{self.child}" if self.child else "")
        return (
            f"bind   {src} -> {self.target}  ({','.join(self.mount_options)}; a slave "
            "of the host's mounts: later host mounts appear if / is shared)"
        )


class Plan:
    __slots__ = ("binds", "env", "owner", "task_dirs", "trees")

    def __init__(
        self,
        trees: list[Tree],
        binds: list[Bind],
        env: dict[str, str],
        task_dirs: list[str],
        owner: tuple[int, int],
    ) -> None:
        self.trees = trees
        self.binds = binds
        self.env = env
        self.task_dirs = task_dirs  # made by the task itself, as the job user, before exec
        self.owner = owner

    def describe(self) -> str:
        uid, gid = self.owner
        out = [f"# owner of every directory: uid {uid} gid {gid}"]
        for t in self.trees:
            out += t.describe()
        out += [b.describe(self) for b in self.binds]
        out += [f"mkdir  {d}  (inside the job, as the job user)" for d in self.task_dirs]
        out += [f"env    {k}={v}" for k, v in sorted(self.env.items())]
        return "\n".join(out)


def build(config: Config, job: Job, dirs: bool = True) -> Plan:
    """dirs=False: without the [[dirs]] entries (launcher.model.record adds the recorded ones)."""
    from jobns.launcher.model.environment import job_environment, pmix_dirs

    top = f"job-{job.job_id}"
    scratch_children = tuple(c for c, _ in TMP_TARGETS)
    if job.layout == "local":
        scratch = Tree("local", config.local_base, (), top, scratch_children, True)
    else:
        if not config.shared_base:
            raise JobnsError(
                "--use-shared-tmpdir needs shared_base in the config "
                f"({config.source or 'no config file read'}); set it to a "
                "directory on the cluster file system"
            )
        keep = job.no_rm
        if job.layout == "shared":
            scratch = Tree("shared", config.shared_base, (), top, scratch_children, not keep)
        else:
            scratch = Tree(
                "shared", config.shared_base, (top,), job.hostname, scratch_children, not keep
            )
    shm = Tree("shm", config.shm_base, (), top, (), True)
    trees = [scratch, shm]
    binds = [Bind(0, child, target) for child, target in TMP_TARGETS]
    binds.append(Bind(1, "", "/dev/shm"))
    for d in config.dirs if dirs else ():
        target, templated = d.path, False
        if "%" in target:
            from jobns.launcher.model.dirpath import expand, has_symbols

            target, templated = expand(target, job.job_id, job.user.name), has_symbols(target)
        extra = Extra(target, d.backing, d.size, d.options, templated)
        binds.append(Bind(len(trees), "", target, d.options))
        trees.append(Tree("dir", d.base, (), top, (), True, extra))
    env = job_environment(config, job)
    return Plan(trees, binds, env, pmix_dirs(env), (job.user.uid, job.user.gid))
