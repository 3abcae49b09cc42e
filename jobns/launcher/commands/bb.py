"""`jobns bb STEP` (root, on the controller): the burst buffer's steps, which jobns's
burst_buffer.lua runs from slurmscriptd (launcher.burstbuffer.steps). A failure prints
one line (`jobns: bb STEP job ID: why`) and exits 125: the Lua hands the line to Slurm,
which holds the job with it (a stage-in) or shows it in the job's reason."""

from __future__ import annotations

import os

from jobns.launcher.burstbuffer import pools, steps
from jobns.launcher.lifecycle.lifecycle import require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import Options
from jobns.launcher.system.errors import EXIT_OK, JobnsError, UserError

STEPS = ("setup", "data-in", "data-out", "teardown", "pools", "status")
MAX_JOB_ID = 0xFFFFFFFF


def main(opts: Options, command: list[str]) -> int:
    require_root("bb")
    if len(command) != 1 or command[0] not in STEPS:
        raise JobnsError(f"bb: give one STEP of {', '.join(STEPS)} (see jobns bb --help)")
    step = command[0]
    config = config_mod.load(_text(opts, "config"), dict(os.environ))
    if step == "pools":
        print(pools.publish(config), end="")
        return EXIT_OK
    if step == "status":
        print("\n".join(steps.status(config)))
        return EXIT_OK
    job_id = _job_id(opts)
    try:
        if step == "setup":
            info = _info(opts, job_id, config)
            steps.setup(
                config,
                job_id,
                _number(opts, "uid"),
                _number(opts, "gid"),
                _required(opts, "script"),
                _size(opts),
                info,
            )
        elif step == "data-in":
            steps.data_in(config, job_id)
        elif step == "data-out":
            steps.data_out(config, job_id)
        else:
            steps.teardown(config, job_id, opts.get("hurry") is True)
    except UserError as e:
        raise UserError(f"bb {step} job {job_id}: {e}") from None
    except JobnsError as e:
        raise JobnsError(f"bb {step} job {job_id}: {e}") from None
    return EXIT_OK


def _text(opts: Options, key: str) -> str | None:
    value = opts.get(key)
    return value if isinstance(value, str) else None


def _required(opts: Options, key: str) -> str:
    value = _text(opts, key)
    if not value:
        raise JobnsError(f"bb: --{key.replace('_', '-')} is required for this step")
    return value


def _number(opts: Options, key: str, maximum: int = MAX_JOB_ID) -> int:
    value = _required(opts, key)
    if not (value.isascii() and value.isdigit()) or int(value) > maximum:
        raise JobnsError(f"bb: --{key.replace('_', '-')} {value[:40]!r} is not a number")
    return int(value)


def _job_id(opts: Options) -> str:
    """Slurm's job ids are numbers: one becomes a file name below shared_base."""
    return str(_number(opts, "job_id"))


def _size(opts: Options) -> int:
    """Slurm's bb_size: bytes reserved in the pool (0: no capacity= asked)."""
    value = _text(opts, "size")
    if value in (None, "", "0"):
        return 0
    return _number(opts, "size", 1 << 62)


def _info(opts: Options, job_id: str, config: config_mod.Config) -> steps.JobInfo:
    """The job's fields as slurmctld gave them (24.11 and later), else from squeue."""
    if opts.get("ask_slurm") is True:
        return steps.job_info_from_slurm(job_id, config)
    tmp = _text(opts, "tmp_mib")
    array_job, array_task = _text(opts, "array_job_id"), _text(opts, "array_task_id")
    if not (array_task and array_task.isdigit() and int(array_task) < 0xFFFFFFFE):
        array_job = array_task = None  # Slurm's NO_VAL: not an array task
    return steps.JobInfo(
        comment=_text(opts, "comment"),
        work_dir=_text(opts, "work_dir") or None,
        job_name=_text(opts, "job_name"),
        tmp_mib=_number(opts, "tmp_mib") or None if tmp not in (None, "", "0") else None,
        array_job_id=array_job if array_job and array_job != "0" else None,
        array_task_id=array_task if array_job and array_job != "0" else None,
    )
