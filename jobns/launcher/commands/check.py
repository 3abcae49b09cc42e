"""`jobns check`: would `jobns setup` take these directives? For a job's user, before she
submits: no root, no state_dir, nothing made.

The directives go through the prolog's own code: lifecycle.gather_directives (the same
parser, the same messages naming `--comment item N`, `script line N` or `--directives
item N`), then the capacity plan against this node's [capacity] caps and the staging
plan against its roots. What only the prolog can know (the job's Slurm --tmp and memory
for tmp_from_slurm and shm_memory_fraction, whether a stage-in source exists and is
hers) is left out. Exit 0 with one line saying what the job would get; else the reason
setup would refuse the job, and 125, the status each task of a refused job exits with.

A separate command rather than `jobns setup --dry-run` for users: setup is the prolog's
(root, a job id, the node's state) and its dry run prints the node's plan; this one
needs no job and answers the user's one question.
"""

from __future__ import annotations

import os
import shlex

from jobns.launcher.lifecycle.lifecycle import gather_directives
from jobns.launcher.model import capacity
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.capacity import WHERE, human
from jobns.launcher.model.directives import Directives
from jobns.launcher.model.inputs import Options, Request
from jobns.launcher.model.job import Job, current_user, hostname, layout_from
from jobns.launcher.model.plan import build
from jobns.launcher.staging import model as staging
from jobns.launcher.system.errors import JobnsError, UserError, printable_path

# The job id shown in place of the one Slurm will give (stage paths with %j).
PLACEHOLDER_JOB_ID = "JOBID"


def sbatch_comment(text: str) -> str | None:
    """The `--comment` of the #SBATCH lines of a batch script, as sbatch reads them: in
    the header (up to the first line that is neither blank nor a comment), the last one
    given; None if there is none."""
    found = None
    for n, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if n == 0 and line.startswith("#!"):
            continue
        if line and not line.startswith("#"):
            break
        if not raw.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(raw[len("#SBATCH") :], comments=False)
        except ValueError:
            continue  # sbatch would refuse the script itself
        for i, word in enumerate(words):
            if word.startswith("--comment="):
                found = word[len("--comment=") :]
            elif word == "--comment" and i + 1 < len(words):
                found = words[i + 1]
    return found


def main(opts: Options, _command: list[str]) -> int:
    req = Request.from_options(opts)
    comment = opts.get("comment")
    comment = comment if isinstance(comment, str) else None
    if not (req.script or req.directives or comment is not None):
        raise JobnsError(
            "check: nothing to check: give --script FILE, --comment TEXT or --directives "
            "TEXT (see jobns check --help)"
        )
    config = config_mod.load(req.config)
    environ = {"SLURM_SUBMIT_DIR": os.getcwd()}  # %d: sbatch's working directory
    sources = []
    if req.script:
        printable_path(req.script, "read batch script")
        try:
            with open(req.script, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise JobnsError(f"read batch script {req.script}: {e.strerror}") from None
        environ["SLURM_JOB_NAME"] = os.path.basename(req.script)  # sbatch's default name
        sources.append(f"script {os.path.basename(req.script)}")
        if comment is None:
            comment = sbatch_comment(text)  # as sbatch: --comment on its command line wins
            if comment is not None:
                sources.append("its #SBATCH --comment")
    if comment is not None:
        environ["SLURM_JOB_COMMENT"] = comment
        if "its #SBATCH --comment" not in sources:
            sources.append("--comment")
    if req.directives:
        sources.append("--directives")
    try:
        summary = _plan(req, environ, config)
    except JobnsError as e:
        # Where directives are given, setup refuses the job for any failure of its
        # request (commands/setup.py), and each of its tasks exits 125 with the reason.
        raise UserError(f"check: jobns setup would refuse the job: {e}") from None
    print(f"jobns check: ok ({', '.join(sources)}): {summary}")
    return 0


def _plan(req: Request, environ: dict[str, str], config: config_mod.Config) -> str:
    """What setup would give the job, as one line; JobnsError where it would refuse."""
    # The prolog's own function: the same parser, warnings and messages.
    directives = gather_directives(req, environ, config)
    req = req.with_directives(directives)
    layout = layout_from(req.shared)
    job = Job(PLACEHOLDER_JOB_ID, current_user(), hostname(), layout, req.no_rm_tmpdir)
    plan = build(config, job)
    caps = capacity.plan(config, directives, job.layout, {})
    stage_in = stage_out = 0
    if directives is not None and (directives.stage_in or directives.stage_out):
        stg, _notes = staging.build(
            config, job, plan, directives, None, staging.symbols_for(job, environ)
        )
        if stg is not None:
            stage_in, stage_out = len(stg.stage_in), len(stg.stage_out)
    return _summary(config, layout, req.no_rm_tmpdir, caps, stage_in, stage_out, directives)


def _summary(
    config: config_mod.Config,
    layout: str,
    keep: bool,
    caps: object,
    stage_in: int,
    stage_out: int,
    directives: Directives | None,
) -> str:
    where = {"local": "on this node", "shared": "on shared_base", "per-node": "per node"}
    parts = [f"{layout} layout (/tmp and /var/tmp {where.get(layout, layout)})"]
    for role in ("shm", "tmp"):
        size = getattr(caps, role, None)
        parts.append(
            f"{WHERE[role]} {human(size)}" if size is not None else f"{WHERE[role]} unlimited"
        )
    if config.capacity.get("tmp_from_slurm") not in (None, "none") or (
        config.capacity.get("shm_memory_fraction") is not None
    ):
        parts.append("(a size the job asks of Slurm may apply instead where none is given)")
    if stage_in or stage_out:
        parts.append(f"stage in {stage_in}, stage out {stage_out}")
    if keep:
        parts.append("directories kept after the job")
    if directives is None:
        parts.append(f"no #{config.directive_word} directives found")
    return "; ".join(parts)
