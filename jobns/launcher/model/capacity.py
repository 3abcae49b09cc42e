"""PURE: how large a job's /dev/shm and /tmp may grow (``#JOBNS shm|tmp capacity=``).

A capacity turns the job's tree into a size-limited file system of its own (a tmpfs,
see launcher.backing.sizelimit), so one job cannot fill the node's /dev/shm or /tmp: writing
past it gives the job ENOSPC and touches nothing else. Sizes follow Slurm's burst-buffer units
(parsed by
launcher.model.directives.parse_capacity); the site's ``[capacity]`` section adds:

  granularity   requests are rounded up to a multiple of it (a burst-buffer pool's granularity)
  shm_max       larger shm requests reject the job (after rounding)
  tmp_max       the same for tmp
  shm_default   the capacity of a job that asks for none (default: no limit)
  tmp_default   the same for tmp

``tmp capacity`` covers /tmp and /var/tmp together (they are two directories of one
tree). A disk-backed one (``tmp_backing = "disk"``) is at least the smallest its file
system can be (launcher.model.config.FS_MIN_BYTES): a smaller request is rounded up to it,
like granularity rounds (the job gets at least what it asked, and the node cap counts
what it gets). Directives
reach only ``jobns setup``: a standalone ``jobns run`` never applies a capacity, since
nothing would unmount the file system after its last task.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobns.launcher.model.config import FS_MIN_BYTES, Config, size_bytes
from jobns.launcher.model.directives import DirectiveError, Directives, round_up
from jobns.launcher.system.errors import JobnsError, UserError

ROLES = ("shm", "tmp")
# Which tree a capacity limits: the shm tree, or the local tree holding tmp/ and var_tmp/.
TREE_ROLE = {"shm": "shm", "tmp": "local"}
WHERE = {"shm": "/dev/shm", "tmp": "/tmp and /var/tmp"}  # what a role's tree is bound on


def human(n: int) -> str:
    for unit, size in (
        ("PiB", 1024**5),
        ("TiB", 1024**4),
        ("GiB", 1024**3),
        ("MiB", 1024**2),
        ("KiB", 1024),
    ):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(slots=True)
class Capacities:
    """Bytes per role ('shm', 'tmp'); None: no limit (the node's file system)."""

    shm: int | None = None
    tmp: int | None = None

    def get(self, role: str) -> int | None:
        return self.shm if role == "shm" else self.tmp

    def for_tree(self, tree_role: str) -> int | None:
        """The capacity of the tree with this Tree.role, if any."""
        for role, tr in TREE_ROLE.items():
            if tr == tree_role:
                return self.get(role)
        return None

    def record(self) -> dict[str, int | None]:
        return {"shm": self.shm, "tmp": self.tmp}

    @classmethod
    def from_record(cls, rec: object) -> Capacities:
        if not isinstance(rec, dict):
            return cls()
        shm, tmp = rec.get("shm"), rec.get("tmp")
        return cls(shm if isinstance(shm, int) else None, tmp if isinstance(tmp, int) else None)

    def describe(self) -> list[str]:
        """The roles without a capacity; a sized tree's backing describes its own."""
        return [
            f"# {role}: no capacity ({WHERE[role]} on the node's file system)"
            for role in ROLES
            if self.get(role) is None
        ]


def config_size(config: Config, key: str) -> int | None:
    """A size from [capacity] (int bytes or a capacity string); None when unset or ""."""
    value = config.capacity.get(key)
    if value is None or value == "":
        return None
    where = f"read config {config.source or '(built-in)'}: [capacity] {key} = {value!r}"
    return size_bytes(value, where, "4GiB")


def tmp_backing(config: Config) -> str:
    """[capacity] tmp_backing: what a /tmp capacity is made of on this node."""
    value = config.capacity.get("tmp_backing", "tmpfs")
    if value not in ("tmpfs", "disk"):
        raise JobnsError(
            f"read config {config.source or '(built-in)'}: [capacity] "
            f'tmp_backing = {value!r}: expected "tmpfs" or "disk"'
        )
    return str(value)


def granularity(config: Config) -> int:
    return config_size(config, "granularity") or 1


def disk_minimum(config: Config) -> int:
    """The smallest tmp capacity this node can make: the file system's minimum when tmp
    capacities are disk images, else 1 byte."""
    if config.capacity.get("tmp_backing") != "disk":
        return 1
    return FS_MIN_BYTES.get(str(config.capacity.get("fs_type", "ext4")), 1)


def at_least(size: int, minimum: int, gran: int) -> int:
    """PURE: size raised to minimum (a file system cannot be smaller), kept a multiple of
    the granularity."""
    if size >= minimum:
        return size
    return round_up(minimum, gran)


def plan(
    config: Config,
    directives: Directives | None,
    layout: str,
    scheduler: dict[str, int] | None = None,
) -> Capacities:
    """The capacities of a job: its directives (already rounded by the parser with
    :func:`granularity`), else what it asked of the scheduler (launcher.model.jobsize: Slurm's
    --tmp, a fraction of its memory for shm), else the site defaults; checked against
    the site maxima (a shm size from the memory rule is capped at shm_max instead)."""
    if (
        directives is None
        and not scheduler
        and not any(config.capacity.get(f"{r}_default") for r in ROLES)
    ):
        return Capacities()  # nothing asked, no site default: no limit
    gran = granularity(config)
    out = Capacities()
    for role in ROLES:
        asked = (
            None
            if directives is None
            else (directives.shm_capacity if role == "shm" else directives.tmp_capacity)
        )
        size = asked
        from_scheduler = size is None and bool(scheduler) and role in (scheduler or {})
        if from_scheduler and scheduler is not None:
            size = round_up(scheduler[role], gran)
        if size is None:
            default = config_size(config, f"{role}_default")
            size = None if default is None else round_up(default, gran)
        if size is None:
            continue
        if role == "tmp":
            size = at_least(size, disk_minimum(config), gran)
        limit = config_size(config, f"{role}_max")
        if limit is not None and size > limit and from_scheduler and role == "shm":
            size = limit  # the site's own memory rule: capped, never the job's fault
        if limit is not None and size > limit:
            what = (
                f"#{config.directive_word} {role} capacity"
                if asked is not None
                else "the job's --tmp request"
                if from_scheduler
                else f"[capacity] {role}_default"
            )
            message = (
                f"{what} is {size} bytes ({human(size)}), more than this "
                f"site allows ({role}_max = {limit} bytes, {human(limit)}); "
                "ask for less"
            )
            if from_scheduler:
                # sbatch --tmp is the user's own request: refuse her job, never drain the node
                raise UserError(message)
            raise DirectiveError(message)
        if role == "tmp" and layout != "local":
            if asked is None:
                continue  # a site default or --tmp applies to node-local /tmp only
            raise DirectiveError(
                f"#{config.directive_word} tmp capacity needs the local "
                f"layout, not {layout!r}: a size limit makes /tmp a "
                "node-local file system, which shared_tmpdir contradicts; "
                "drop one of the two"
            )
        setattr(out, role, size)
    return out
