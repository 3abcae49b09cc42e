"""PURE: what a job stages, from where to where, as host paths (docs/users.md "Staging").

Two kinds of staging, both decided here at setup and recorded with the job, so that a
crash or restart (``jobns recover``) replays exactly the same operations:

* **Session staging** (ARC, the NorduGrid middleware): the job's *session directory*
  ``<session root>/<arc-job-id>`` is moved into its *scratch directory* on the node,
  ``<scratchdir>/<arc-job-id>`` (or ``<scratchdir>/<lrms-job-id>/<arc-job-id>`` with
  ``[staging] dynamic_scratch``), before the job runs; ``stdout`` and ``stderr`` (``[staging]
  stdio``) stay in the session directory and are symlinked into scratch when the session
  directory is shared with the node (``[arc] shared_filesystem``). After the job everything
  in scratch is moved back. Which session directory: ``setup --session-dir``, else the
  ``[staging] session_dir`` template (e.g. ``%d``, the job's working directory, which is how
  ARC submits), in both cases confined to ``[staging] session_roots``; a template that
  leads outside them means "not an ARC job": no session staging.
* **Directives** ``#JOBNS stage_in|stage_out source=... destination=...`` copy a file or a
  directory in before the job and out after it. Paths take Slurm's filename symbols (%j, %u, %d,
  ...). The
  *job side* (stage_in destination, stage_out source) is a path as the job sees it, below
  /tmp, /var/tmp, /dev/shm or its scratch directory; the *host side* (stage_in source,
  stage_out destination) must lie below ``[staging] stage_roots`` or the job's session
  directory. Confinement is lexical; the copies themselves run as the job user (see
  launcher.staging.transfer), so a symlink inside a root reaches only what the user could reach,
  never through a /proc magic link and never onto a file system the path itself does not pass
  through (launcher.staging.transfer.stage_confined); each staging worker has a deadline,
  ``[staging] timeout`` (Staging.deadline).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from jobns.launcher.model.config import STAGE_TIMEOUT, Config
from jobns.launcher.model.directives import (
    DirectiveError,
    Directives,
    Stage,
    Symbols,
    confine,
    normalise,
    substitute,
)
from jobns.launcher.model.job import Job, safe_component
from jobns.launcher.model.plan import Plan, Tree, tree_from_record, tree_record
from jobns.launcher.system.errors import JobnsError

JOB_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(slots=True)
class Copy:
    """One stage_in/stage_out directive, resolved to host paths."""

    source: str
    destination: str
    line: str

    def record(self) -> dict[str, str]:
        return {"source": self.source, "destination": self.destination, "line": self.line}


@dataclass(slots=True)
class Staging:
    """Everything a job stages; recorded as the job record's "staging" object."""

    session_dir: str | None = None
    scratch_tree: Tree | None = None
    runtime_scratchdir: str = ""
    stdio: list[str] = field(default_factory=list)
    link_stdio: bool = True
    movetool: str = ""
    timeout: float = 0.0
    stage_in: list[Copy] = field(default_factory=list)
    stage_out: list[Copy] = field(default_factory=list)
    scratch_dir: str | None = field(init=False)  # the scratch tree's path

    def __post_init__(self) -> None:
        self.scratch_dir = self.scratch_tree.path if self.scratch_tree is not None else None

    @property
    def deadline(self) -> float:
        """Seconds each staging worker may run ([staging] timeout); a record of a version
        that had no such bound says 0, which gets the default: no worker is unbounded."""
        return self.timeout if self.timeout > 0 else STAGE_TIMEOUT

    def record(self) -> dict[str, object]:
        return {
            "session_dir": self.session_dir,
            "scratch_dir": self.scratch_dir,
            "scratch_tree": None if self.scratch_tree is None else tree_record(self.scratch_tree),
            "runtime_scratchdir": self.runtime_scratchdir,
            "stdio": list(self.stdio),
            "link_stdio": self.link_stdio,
            "movetool": self.movetool,
            "timeout": self.timeout,
            "stage_in": [c.record() for c in self.stage_in],
            "stage_out": [c.record() for c in self.stage_out],
        }

    @classmethod
    def from_record(cls, rec: object) -> Staging | None:
        if not isinstance(rec, dict):
            return None
        tree = rec.get("scratch_tree")
        timeout = rec.get("timeout", 0.0)

        def copies(key: str) -> list[Copy]:
            items = rec.get(key)
            return [
                Copy(str(c["source"]), str(c["destination"]), str(c["line"]))
                for c in (items if isinstance(items, list) else [])
            ]

        session = rec.get("session_dir")
        stdio = rec.get("stdio")
        return cls(
            str(session) if isinstance(session, str) else None,
            tree_from_record(tree) if isinstance(tree, dict) else None,
            str(rec.get("runtime_scratchdir", "")),
            [str(n) for n in stdio] if isinstance(stdio, list) else [],
            bool(rec.get("link_stdio", True)),
            str(rec.get("movetool", "")),
            float(timeout) if isinstance(timeout, (int, float)) else 0.0,
            copies("stage_in"),
            copies("stage_out"),
        )

    def describe(self) -> list[str]:
        out = []
        if self.session_dir and self.scratch_dir:
            how = f"movetool {self.movetool!r}" if self.movetool else "built-in copy"
            kept = ", ".join(self.stdio) or "nothing"
            out.append(
                f"stage  move {self.session_dir}/* -> {self.scratch_dir}/  (rename on "
                f"one file system, else {how}; as the job user)"
            )
            if self.link_stdio:
                out.append(
                    f"stage  keep {kept} in {self.session_dir}, symlinked into {self.scratch_dir}"
                )
            out.append(f"stage  after the job: move {self.scratch_dir}/* -> {self.session_dir}/")
        out += [f"stage  copy in  {c.source} -> {c.destination}  ({c.line})" for c in self.stage_in]
        out += [
            f"stage  copy out {c.source} -> {c.destination}  ({c.line})" for c in self.stage_out
        ]
        return out


def symbols_for(job: Job, environ: Mapping[str, str]) -> Symbols:
    """Slurm's filename symbols for this job: jobns's job id and user win over the environment;
    the rest comes from Slurm's prolog variables. %d is unknown outside Slurm (the
    prolog's own working directory means nothing)."""

    def numeric(name: str) -> str | None:
        value = environ.get(name) or None
        if value is not None and not (value.isascii() and value.isdigit()):
            raise JobnsError(f"{name}={value!r} is not a number; is this a Slurm job?")
        return value

    workdir = environ.get("SLURM_JOB_WORK_DIR") or environ.get("SLURM_SUBMIT_DIR") or None
    return Symbols(
        job_id=job.job_id,
        array_job_id=numeric("SLURM_ARRAY_JOB_ID"),
        array_task_id=numeric("SLURM_ARRAY_TASK_ID"),
        workdir=workdir,
        user=job.user.name,
        job_name=environ.get("SLURM_JOB_NAME"),
    )


def session_dir_from(
    flag: str | None, config: Config, symbols: Symbols
) -> tuple[str | None, str | None]:
    """(session directory, note): from --session-dir (errors are errors) or the
    [staging] session_dir template (a path outside session_roots: not an ARC job)."""
    roots = config.staging.session_roots
    if flag:
        return _session_dir(flag, roots, "--session-dir"), None
    template = config.staging.session_dir
    if not template:
        return None, None
    try:
        path = normalise(substitute(template, symbols))
        return _session_dir(path, roots, "[staging] session_dir"), None
    except (DirectiveError, JobnsError) as e:
        return None, f"no session staging: {e}"


def _session_dir(path: str, roots: list[str], what: str) -> str:
    if not roots:
        raise JobnsError(
            f"{what} {path!r}: no [staging] session_roots are configured; ask the administrator"
        )
    try:
        normal = confine(path, roots)
    except DirectiveError as e:
        raise JobnsError(f"{what}: {e.problem}") from None
    parent, _, name = normal.rpartition("/")
    if (parent or "/") not in roots:
        raise JobnsError(
            f"{what} {path!r}: a session directory is <root>/<arc-job-id>, "
            f"directly below one of {', '.join(roots)}"
        )
    safe_component(name, f"{what}: ARC job id", "session directories are named by it")
    return normal


def job_to_host(path: str, plan: Plan, scratch_dir: str | None) -> str:
    """A confined path as the job sees it -> where it is on the host."""
    if scratch_dir and (path == scratch_dir or path.startswith(scratch_dir + "/")):
        return path
    for b in sorted(plan.binds, key=lambda b: -len(b.target)):
        if path == b.target or path.startswith(b.target + "/"):
            tree = plan.trees[b.tree]
            source = tree.path + (f"/{b.child}" if b.child else "")
            return source + path[len(b.target) :]
    raise JobnsError(f"internal error: {path} is not below a job directory")


def build(
    config: Config,
    job: Job,
    plan: Plan,
    directives: Directives | None,
    session_flag: str | None,
    symbols: Symbols,
) -> tuple[Staging | None, list[str]]:
    """The job's staging, or None when it stages nothing; and notes for the operator."""
    notes: list[str] = []
    session, note = session_dir_from(session_flag, config, symbols)
    if note:
        notes.append(note)
    arc = config.arc
    scratch_tree = None
    runtime = arc.scratchdir if arc is not None else ""
    if session is not None:
        if arc is None or not arc.scratchdir:
            raise JobnsError(
                f"stage session directory {session}: [arc] scratchdir is not "
                "set, so there is no scratch directory to move it to (with a "
                "shared session directory and no scratchdir the job computes "
                "in place: drop --session-dir)"
            )
        arc_id = session.rsplit("/", 1)[1]
        parents: tuple[str, ...] = ()
        if config.staging.dynamic_scratch:
            parents = (job.job_id,)  # <scratchdir>/<lrms-job-id>/<arc-job-id>
            runtime = f"{arc.scratchdir}/{job.job_id}"
        scratch_tree = Tree("scratch", arc.scratchdir, parents, arc_id, (), True)
    scratch_dir = scratch_tree.path if scratch_tree is not None else None
    host_roots = list(config.staging.stage_roots) + ([session] if session else [])
    job_roots = list(JOB_ROOTS) + ([scratch_dir] if scratch_dir else [])
    stage_in = [
        _copy(s, symbols, host_roots, job_roots, plan, scratch_dir, inward=True)
        for s in (directives.stage_in if directives else [])
    ]
    stage_out = [
        _copy(s, symbols, job_roots, host_roots, plan, scratch_dir, inward=False)
        for s in (directives.stage_out if directives else [])
    ]
    if session is None and not stage_in and not stage_out:
        return None, notes
    link = arc.shared_filesystem if arc is not None else True
    movetool = arc.movetool if arc is not None and session is not None else ""
    _check_movetool(movetool)
    return Staging(
        session,
        scratch_tree,
        runtime,
        list(config.staging.stdio),
        link,
        movetool,
        config.staging.timeout,
        stage_in,
        stage_out,
    ), notes


def _check_movetool(movetool: str) -> None:
    """jobns deletes a source only once its copy is durable; a tool that deletes sources
    itself would break that, so refuse the two usual ones."""
    if not movetool:
        return
    argv = shlex.split(movetool)
    if argv and (argv[0].rsplit("/", 1)[-1] == "mv" or "--remove-source-files" in argv):
        raise JobnsError(
            f"[arc] movetool = {movetool!r} deletes its sources itself, so a "
            "crash could lose a half-moved file; jobns moves by itself (rename "
            "on one file system, copy then delete across): give a copying tool "
            "such as 'cp -a' or 'rsync -a', or leave movetool unset"
        )


def _copy(
    stage: Stage,
    symbols: Symbols,
    source_roots: list[str],
    dest_roots: list[str],
    plan: Plan,
    scratch_dir: str | None,
    inward: bool,
) -> Copy:
    source, destination = stage.resolve(symbols, source_roots, dest_roots)
    if inward:
        destination = job_to_host(destination, plan, scratch_dir)
    else:
        source = job_to_host(source, plan, scratch_dir)
    return Copy(source, destination, stage.line)
