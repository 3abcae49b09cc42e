"""`jobns run`: inputs -> job -> plan -> apply (in the task child) -> supervise -> teardown."""

from __future__ import annotations

import os
import sys

from launcher import config as config_mod
from launcher import namespace
from launcher.errors import JobnsError
from launcher.job import Job, hostname, job_id_from, layout_from, pmix_identity, user_from
from launcher.supervise import Supervisor, arm_child_death_signal, warn

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from launcher.config import Config
    from launcher.fs import TreeHandle
    from launcher.job import User
    from launcher.plan import Plan

Options = dict[str, "str | bool | None"]


def kill_wait_from(opts: Options, config: Config) -> float:
    raw = opts.get("kill_wait")
    if raw is None:
        return config.kill_wait
    try:
        value = float(str(raw))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise JobnsError(f"--kill-wait {raw!r}: expected seconds between 0 and 86400")
    return value


def net_from(opts: Options) -> bool:
    """True for --net none."""
    net = opts.get("net") or "host"
    if net not in ("host", "none"):
        raise JobnsError(f"--net {net!r}: expected host or none")
    return net == "none"


def job_from(opts: Options, environ: dict[str, str]) -> Job:
    raw_id = opts.get("job_id")
    job_id = job_id_from(None if raw_id is None else str(raw_id), environ)
    user = user_from(str(opts["user"]) if opts.get("user") else None, environ)
    shared = opts.get("use_shared_tmpdir")
    nspace, rank = pmix_identity(job_id, environ)
    return Job(job_id, user, hostname(), layout_from(None if shared is None else str(shared)),
               bool(opts.get("no_rm_tmpdir")), nspace, rank)


def switch_user(user: User) -> None:
    """Root launching for someone else: drop to the job user (all groups, then gid, uid)."""
    os.setgroups(list(user.groups))
    os.setgid(user.gid)
    os.setuid(user.uid)


def enter_workdir(cwd: str) -> None:
    # Re-resolve the working directory in the job's namespace: a cwd under the host's
    # /tmp would otherwise keep the task inside the host's /tmp, outside the job's.
    try:
        os.chdir(cwd)
    except OSError:
        warn(f"working directory {cwd} does not exist inside the job (its /tmp, /var/tmp "
             "and /dev/shm are private); starting in /tmp")
        os.chdir("/tmp")


def make_task_dirs(dirs: list[str]) -> None:
    for d in dirs:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise JobnsError(f"create {d} inside the job: {e.strerror}") from None


def main(opts: Options, command: list[str]) -> int:
    if not command and not opts.get("dry_run"):
        raise JobnsError("jobns run: no command given (usage: jobns run [OPTIONS] -- COMMAND)")
    environ = dict(os.environ)
    config = config_mod.load(str(opts["config"]) if opts.get("config") else None, environ)
    job = job_from(opts, environ)
    kill_wait = kill_wait_from(opts, config)
    net_none = net_from(opts)
    from launcher import state

    joined = state.read_run_env(config.state_dir, job.job_id)
    if joined is not None:
        if opts.get("dry_run"):
            print(f"# job {job.job_id} is set up on this node: join {joined['mnt_pin']}")
            return 0
        if opts.get("use_shared_tmpdir") is not None or opts.get("no_rm_tmpdir"):
            warn(f"job {job.job_id} is already set up: the options given to jobns setup apply")
        kw = None if opts.get("kill_wait") is None else kill_wait
        return run_joined(joined, job, command, environ, kw, net_none)
    # Only a job nobody set up needs its trees planned and made (tasks that join do not).
    from launcher.plan import build

    plan = build(config, job)
    if opts.get("dry_run"):
        print(plan.describe())
        return 0
    return run_standalone(plan, job, command, environ, kill_wait, net_none, config.state_dir)


def config_from_run_env(values: dict[str, str]) -> Config:
    raw: dict[str, object] = {}
    if "arc.scratchdir" in values:
        raw["arc"] = {"shared_filesystem": bool(values["arc.shared_filesystem"]),
                      "scratchdir": values["arc.scratchdir"],
                      "movetool": values["arc.movetool"],
                      "shared_scratch": values["arc.shared_scratch"]}
    return config_mod.Config(raw, "jobns setup")


def run_joined(values: dict[str, str], job: Job, command: list[str], environ: dict[str, str],
               kill_wait: float | None, net_none: bool) -> int:
    """The job was set up by a prolog: join its pinned namespace(s); nothing to make or remove."""
    from launcher.environment import job_environment, pmix_dirs

    owner = int(values["uid"])
    caller = os.geteuid()
    if caller != 0 and caller != owner:
        raise JobnsError(f"join job {job.job_id}: it belongs to uid {owner}, not to you "
                         f"(uid {caller})")
    if job.user.uid not in (0, owner):
        raise JobnsError(f"join job {job.job_id}: it was set up for uid {owner}, not for "
                         f"{job.user.name} (uid {job.user.uid})")
    env = {**environ, **job_environment(config_from_run_env(values), job)}
    task_dirs = pmix_dirs(env)
    user_pin = values["user_pin"] or None
    mnt_pin = values["mnt_pin"]
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    me = os.getpid()

    def prepare() -> None:
        # Root may enter the mount namespace directly; the job user enters through the
        # user namespace it owns (the only way an unprivileged process may setns).
        namespace.join(user_pin if caller != 0 else None, mnt_pin)
        if net_none:
            namespace.unshare_net()
            namespace.loopback_up()
        if caller == 0 and job.user.uid != 0:
            switch_user(job.user)
        arm_child_death_signal(me)
        enter_workdir(cwd)
        make_task_dirs(task_dirs)

    sup = Supervisor(float(values["kill_wait"]) if kill_wait is None else kill_wait)
    sup.start(prepare, command, env)
    return sup.wait()


def run_standalone(plan: Plan, job: Job, command: list[str], environ: dict[str, str],
                   kill_wait: float, net_none: bool, state_dir: str) -> int:
    """No prolog set this job up: make its namespace for this one task."""
    from launcher import fs

    root = os.geteuid() == 0
    uid, gid = plan.owner
    handles: list[TreeHandle] = []
    try:
        for tree in plan.trees:
            handles.append(fs.acquire_tree(tree, uid, gid))
        # Identities of the bind sources, checked again after the child reopens them.
        expected = [fs.identity(handles[b.tree], b.child) for b in plan.binds]
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
        me = os.getpid()
        env = {**environ, **plan.env}

        def prepare() -> None:
            namespace.unshare(userns=not root, net_none=net_none)
            # A bind source must belong to our new namespace (else EINVAL), so reopen
            # every source here, all before the first bind, and check each is the very
            # directory the parent verified.
            sources = [fs.reopen(handles[b.tree], b.child, ident)
                       for b, ident in zip(plan.binds, expected, strict=True)]
            for (fd, path), b in zip(sources, plan.binds, strict=True):
                namespace.bind(fd, path, b.target)
            if net_none:
                namespace.loopback_up()
            if root and job.user.uid != 0:
                switch_user(job.user)
            arm_child_death_signal(me)
            enter_workdir(cwd)
            make_task_dirs(plan.task_dirs)

        sup = Supervisor(kill_wait)
        sup.start(prepare, command, env)
        return sup.wait()
    finally:
        from launcher.state import is_set_up

        for h in handles:
            for err in fs.release_tree(h, lambda: is_set_up(state_dir, job.job_id)):
                warn(err)
        sys.stderr.flush()
