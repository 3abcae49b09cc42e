"""`jobns env` and `jobns status`: what a job's tasks see, and what jobns holds on this node."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import sys
import time

from jobns.launcher.backing import fs, kinds
from jobns.launcher.backing.kinds import held_line
from jobns.launcher.commands import doctor
from jobns.launcher.lifecycle.metrics import (
    fill_capacity_bytes,
    stale_disk_text,
    status_text,
    write_textfile,
)
from jobns.launcher.model import config as config_mod
from jobns.launcher.model import record as records
from jobns.launcher.model.enforced import inside_job
from jobns.launcher.model.environment import job_environment, pmix_dirs
from jobns.launcher.model.inputs import Options, Request, config_from_run_env, job_from
from jobns.launcher.model.job import Job, hostname, job_id_from, lookup_user
from jobns.launcher.model.plan import TMP_TARGETS, Tree
from jobns.launcher.protocol import state
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.mountinfo import propagation_warning
from jobns.launcher.system.removal import O_DIR, O_LOOK, open_here


def env_main(opts: Options, _command: list[str]) -> int:
    req = Request.from_options(opts)
    environ = dict(os.environ)
    config = config_mod.load(req.config, environ)
    job_id = job_id_from(req.job_id, environ)
    fmt = str(opts.get("format") or "sh")
    if fmt not in ("sh", "json", "slurm"):
        raise JobnsError(f"--format {fmt!r}: expected sh, json or slurm")
    inside = inside_job(environ, job_id)
    # Inside a job enforced through Slurm the state is hidden: the plugin has set the
    # job's variables already; these are the ones that need no state (all but ARC's).
    values = None if inside else state.read_run_env(config.state_dir, job_id)
    if inside:
        env = job_environment(config_from_run_env({}), job_from(req, environ))
    elif values is not None:
        user = lookup_user(values["uid"])
        job = Job(job_id, user, hostname(), values["layout"], False)
        env = job_environment(config_from_run_env(values), job)
    else:
        # Not a list of defaults: a TaskProlog must not hand a task variables of a job
        # that has no directories here.
        raise JobnsError(
            f"env: job {job_id} is not set up on this node (jobns setup did not "
            "run here, or the job ended); `jobns run --dry-run` shows what a "
            "standalone task would get"
        )
    if fmt == "json":
        print(json.dumps(env, indent=2, sort_keys=True))
    elif fmt == "slurm":
        # A Slurm TaskProlog: slurmstepd takes `export NAME=value` verbatim (no quoting,
        # one line each), and the task runs as the job user in the job's namespace, so
        # its PMIx directory (/tmp/pmix) is made here, as `jobns run` makes it.
        if inside:
            from jobns.launcher.commands.run import make_task_dirs

            make_task_dirs(pmix_dirs(env))
        for k, v in sorted(env.items()):
            if "\n" not in v:
                print(f"export {k}={v}")
    else:
        # For a shell (`eval "$(jobns env)"`): quoted. A Slurm TaskProlog is taken
        # verbatim, quotes and all: that is --format slurm.
        for k, v in sorted(env.items()):
            print(f"export {k}={shlex.quote(v)}")
    return 0


def tree_bytes(tree: Tree) -> int | None:
    """Disk use (st_blocks) below a tree root, None if it cannot be read or something is
    mounted on the root itself (a capacity: metrics.fill_capacity_bytes asks its file
    system). Nothing mounted below it is counted, entered or even looked at (a user's
    FUSE mount, made before or during the walk, whose stalled server would hang status):
    every directory is opened, and every entry looked at, relative to its parent's fd
    and within its parent's mount (launcher.system.removal.open_here: EXDEV instead), never
    through a symlink. One directory fd is open at a time: each is reopened from the tree
    root's parent by its relative path, under the same rules."""
    rel = "/".join((*tree.parents, tree.name))
    try:
        base = fs.open_base(tree.base, f"{tree.role} base")
    except JobnsError:
        return None
    total = 0
    try:
        todo = [rel]
        while todo:
            here = todo.pop()
            try:
                fd = open_here(base, here, O_DIR)
            except FileNotFoundError:
                if here == rel:
                    return 0  # no tree (any more)
                continue  # removed during the walk
            try:
                for name in os.listdir(fd):
                    try:
                        look = open_here(fd, name, O_LOOK)
                    except OSError:
                        continue  # gone, or something mounted on it: never looked into
                    try:
                        st = os.fstat(look)
                    finally:
                        os.close(look)
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(f"{here}/{name}")
            finally:
                os.close(fd)
    except OSError:
        return None
    finally:
        os.close(base)
    return total


def collect(state_dir: str, config: config_mod.Config | None = None) -> list[dict[str, object]]:
    """Every job jobns holds on this node: the set-up ones (their records) and, with
    config, the standalone ones (`jobns run` without a prolog: trees in the bases that no
    record names). Root sees every job; an ordinary user her own (job state is private)."""
    root = os.geteuid() == 0
    jobs: list[dict[str, object]] = []
    recorded: set[str] = set()
    for job_id in state.list_jobs(state_dir):
        if not root and not os.access(state.job_dir(state_dir, job_id), os.X_OK):
            continue  # another user's job
        try:
            record = records.load(state_dir, job_id)
        except JobnsError as e:
            jobs.append({"job_id": job_id, "state": "unreadable", "error": str(e)})
            continue
        if record is None:
            continue
        rec = record.to_dict()
        paths = [t.tree.path for t in record.trees]
        recorded.update(paths)
        sizes = [tree_bytes(t.tree) for t in record.trees]
        trees = rec["trees"]
        assert isinstance(trees, list)
        for t, size in zip(trees, sizes, strict=True):
            if size is not None and "target" in t:
                t["used"] = size  # an extra directory's own use, for the table
        rec["paths"] = paths
        rec["bytes"] = None if None in sizes else sum(s or 0 for s in sizes)
        jobs.append(rec)
    if config is not None:
        jobs += standalone(config, recorded, root)
    return jobs


def standalone(
    config: config_mod.Config, recorded: set[str], root: bool
) -> list[dict[str, object]]:
    """Trees of jobs no prolog set up: `jobns run` tasks holding them (state standalone),
    or what a crashed task left (leftover: `jobns gc` removes it)."""
    found: dict[str, dict[str, object]] = {}
    children = tuple(c for c, _ in TMP_TARGETS)
    dirs = [("dir", d.base, ()) for d in config.dirs]
    for role, base, kids in (
        ("local", config.local_base, children),
        ("shm", config.shm_base, ()),
        *dirs,
    ):
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            tree = Tree(role, base, (), name, kids, True)
            if not name.startswith("job-") or tree.path in recorded or "~" in name:
                continue
            # Never entering a mount on it (a user's: it could hang us), nor following a link.
            seen = fs.lookalike(tree)
            if seen is None:
                continue
            st, held = seen
            if not root and st.st_uid != os.geteuid():
                continue
            try:
                user = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                user = str(st.st_uid)
            job = found.setdefault(
                name[4:],
                {
                    "job_id": name[4:],
                    "state": "leftover",
                    "paths": [],
                    "bytes": 0,
                    "user": {"name": user, "uid": st.st_uid},
                    "created": st.st_mtime,
                },
            )
            if held:
                job["state"] = "standalone"
            size = tree_bytes(tree)
            paths, used = job["paths"], job["bytes"]
            assert isinstance(paths, list)
            paths.append(tree.path)
            job["bytes"] = None if size is None or used is None else int(str(used)) + size
    return list(found.values())


def per_user(jobs: list[dict[str, object]]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for j in jobs:
        user = j.get("user")
        name = str(user.get("name")) if isinstance(user, dict) else "?"
        t = totals.setdefault(name, {"jobs": 0, "bytes": 0})
        t["jobs"] += 1
        b = j.get("bytes")
        t["bytes"] += b if isinstance(b, int) else 0
    return totals


def human(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{n}B"


def capacities(job: dict[str, object]) -> str:
    """A job's capacities and their backing for the table: "tmp 64M disk, shm 1M", and
    each extra directory's backing and use: "/scratch/local disk 1.2MiB/8.0MiB"."""
    out = []
    trees = job.get("trees")
    for t in trees if isinstance(trees, list) else []:
        if isinstance(t, dict) and isinstance(t.get("target"), str):
            cap = t.get("capacity")
            limit = f"/{human(cap)}" if isinstance(cap, int) else ""
            used = human(t["used"]) if isinstance(t.get("used"), int) else "?"
            out.append(f"{t['target']} {t.get('backing', 'directory')} {used}{limit}")
        elif isinstance(t, dict) and isinstance(t.get("capacity"), int):
            role = "tmp" if t.get("role") == "local" else str(t.get("role"))
            out.append(f"{role} {human(t['capacity'])} {records.recorded_backing(t)}")
    return ", ".join(out) or "-"


def status_main(opts: Options, _command: list[str]) -> int:
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None)
    fmt = str(opts.get("format") or ("json" if opts.get("json") else "table"))
    if fmt not in ("table", "json", "prometheus"):
        raise JobnsError(f"status: --format {fmt!r}: expected table, json or prometheus")
    if opts.get("output") and fmt != "prometheus":
        raise JobnsError("status: --output needs --format prometheus")
    jobs = collect(config.state_dir, config)
    totals = per_user(jobs)
    held = kinds.held(config)  # disk capacities a process outside a finished job still holds
    warning = propagation_warning()
    if fmt == "prometheus":  # for node_exporter's textfile collector (launcher.lifecycle.metrics)
        text = status_text(config.state_dir, jobs, warning, tree_bytes) + stale_disk_text(held)
        if opts.get("output"):
            write_textfile(str(opts["output"]), text)
        else:
            sys.stdout.write(text)
        return 0
    if warning:
        sys.stderr.write(f"jobns: warning: {warning}\n")
    if config.enforce:  # a node that promises enforcement and cannot keep it says so
        for problem in doctor.enforcement_problems(doctor.slurm_conf_path()):
            sys.stderr.write(f"jobns: warning: jobs are not enforced: {problem}\n")
    if fmt == "json":
        doc = {"jobs": jobs, "users": totals, "stale_disks": held}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    fill_capacity_bytes(jobs, tree_bytes)  # a capacity's use from its own file system
    print(
        f"{'JOB':<14} {'USER':<12} {'STATE':<13} {'CREATED':<20} {'USED':>9}  "
        f"{'CAPACITY':<22} PATHS"
    )
    for j in jobs:
        user = j.get("user")
        name = str(user.get("name")) if isinstance(user, dict) else "?"
        created = j.get("created")
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
            if isinstance(created, (int, float))
            else "?"
        )
        paths = j.get("paths") or [j.get("error", "")]
        assert isinstance(paths, list)
        print(
            f"{j['job_id']!s:<14} {name:<12} {j['state']!s:<13} {when:<20} "
            f"{human(j.get('bytes')):>9}  {capacities(j):<22} {' '.join(map(str, paths))}"
        )
    if totals:
        print("\nPER USER")
        for name, t in sorted(totals.items()):
            print(f"  {name:<12} {t['jobs']} job(s) {human(t['bytes']):>9}")
    print_stale(held)
    return 0


def print_stale(held: list[dict[str, object]]) -> None:
    """The table's section on stale capacities (launcher.backing.kinds.held_line)."""
    if held:
        print("\nSTALE DISK CAPACITIES (held after their job ended; counted in the node cap)")
        for entry in held:
            print(f"  {held_line(entry)}")
