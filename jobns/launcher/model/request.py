"""What a job-making command was asked (setup, run, env, oci-config), typed: read once
from cli's options by from_options(), then the job's #JOBNS directives folded in by
with_directives() (flags on the command line win). Everything below the commands takes a
Request; the batch system's variables (SLURM_*) are read where they are resolved
(model.inputs, model.job).

A plain class with __slots__: `jobns run` builds one per task (no dataclasses on the
task-launch path: commands/bytecode.py says what that path may import).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.model.directives import Directives

# cli's parse: {option name without dashes, '-' -> '_': value}, what the commands receive.
Options = dict[str, "str | bool | None"]


def _text(opts: Options, key: str) -> str | None:
    value = opts.get(key)
    return None if value is None or value is False else str(value)


class Request:
    """One command's request. None means "not given" (the config or Slurm decides);
    shared is --use-shared-tmpdir's value ("" for plain, "per-node"), None when absent."""

    __slots__ = (
        "config",
        "directives",
        "dry_run",
        "job_id",
        "kill_wait",
        "net",
        "no_rm_tmpdir",
        "script",
        "session_dir",
        "shared",
        "user",
    )

    def __init__(
        self,
        job_id: str | None = None,
        user: str | None = None,
        config: str | None = None,
        shared: str | None = None,
        no_rm_tmpdir: bool = False,
        kill_wait: str | None = None,
        net: str | None = None,
        script: str | None = None,
        directives: str | None = None,
        session_dir: str | None = None,
        dry_run: bool = False,
    ) -> None:
        self.job_id = job_id
        self.user = user
        self.config = config
        self.shared = shared
        self.no_rm_tmpdir = no_rm_tmpdir
        self.kill_wait = kill_wait
        self.net = net
        self.script = script
        self.directives = directives
        self.session_dir = session_dir
        self.dry_run = dry_run

    @classmethod
    def from_options(cls, opts: Options) -> Request:
        """cli's options (a flag's value, True for a bare switch, absent when not given)."""
        return cls(
            job_id=_text(opts, "job_id"),
            user=_text(opts, "user") or None,
            config=_text(opts, "config") or None,
            shared=_text(opts, "use_shared_tmpdir"),
            no_rm_tmpdir=bool(opts.get("no_rm_tmpdir")),
            kill_wait=_text(opts, "kill_wait"),
            net=_text(opts, "net") or None,
            script=_text(opts, "script") or None,
            directives=_text(opts, "directives") or None,
            session_dir=_text(opts, "session_dir") or None,
            dry_run=bool(opts.get("dry_run")),
        )

    def with_job_id(self, job_id: str) -> Request:
        new = self.copy()
        new.job_id = job_id
        return new

    def with_directives(self, d: Directives | None) -> Request:
        """The request with the job's directives folded in: flags given on the command
        line win over directives."""
        if d is None:
            return self
        new = self.copy()
        if new.shared is None and d.layout in ("shared", "per-node"):
            new.shared = "" if d.layout == "shared" else "per-node"
        new.no_rm_tmpdir = new.no_rm_tmpdir or d.no_rm_tmpdir
        return new

    def copy(self) -> Request:
        new = Request.__new__(Request)
        for name in Request.__slots__:
            setattr(new, name, getattr(self, name))
        return new
