"""`jobns run`: inputs -> job -> plan -> apply (in the task child) -> supervise -> teardown."""

from __future__ import annotations

import errno
import os
import sys

from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import (
    Options,
    Request,
    config_from_run_env,
    job_from,
    kill_wait_from,
    net_from,
)
from jobns.launcher.model.job import Job, made_up_job_id
from jobns.launcher.mountns import namespace
from jobns.launcher.system.errors import JobnsError, warn
from jobns.launcher.system.supervise import Supervisor, arm_child_death_signal
from jobns.launcher.system.user import switch_user

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.backing.fs import TreeHandle
    from jobns.launcher.model.plan import Plan


def enter_workdir(cwd: str) -> None:
    # Re-resolve the working directory in the job's namespace: a cwd under the host's
    # /tmp would otherwise keep the task inside the host's /tmp, outside the job's.
    try:
        os.chdir(cwd)
    except OSError:
        warn(
            f"warning: working directory {cwd} does not exist inside the job (its /tmp, "
            "/var/tmp and /dev/shm are private); starting in /tmp",
            log=None,
        )
        os.chdir("/tmp")


def make_task_dirs(dirs: list[str]) -> None:
    for d in dirs:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise JobnsError(f"create {d} inside the job: {e.strerror}") from None


def joined_env(
    environ: dict[str, str], values: dict[str, str], job: Job, as_user: bool
) -> dict[str, str]:
    """A task's environment in a job set up already: the caller's, with the job's over it
    (from run.env's values) and, when root starts the job user's task (as_user), her
    HOME, USER and LOGNAME."""
    from jobns.launcher.model.environment import job_environment

    env = {**environ, **job_environment(config_from_run_env(values), job)}
    if as_user:
        env.update(HOME=job.user.home, USER=job.user.name, LOGNAME=job.user.name)
    return env


def net_user_and_parent(net_none: bool, become: bool, job: Job, parent: int) -> None:
    """A task's last steps before its command, in the job's namespace: its own network
    (net none), then the job user's credentials (become; after the network: a user of
    the host has no CAP_NET_ADMIN), and its death with its parent."""
    if net_none:
        namespace.unshare_net()
        namespace.loopback_up()
    if become:
        switch_user(job.user.uid, job.user.gid, job.user.groups)
    arm_child_death_signal(parent)


def main(opts: Options, command: list[str]) -> int:
    req = Request.from_options(opts)
    if not command and not req.dry_run:
        raise JobnsError("run: no command given (usage: jobns run [OPTIONS] -- COMMAND)")
    environ = dict(os.environ)
    config = config_mod.load(req.config, environ)
    if req.job_id is None and "SLURM_JOB_ID" not in environ:
        # Outside any batch system: a job of this one command, exactly as if its
        # made-up id had been given with --job-id (docs/users.md "Outside Slurm").
        req = req.with_job_id(made_up_job_id())
    job = job_from(req, environ)
    kill_wait = kill_wait_from(req, config)
    net_none = net_from(req)
    from jobns.launcher.model.enforced import inside_job

    if inside_job(environ, job.job_id):
        if req.dry_run:
            print(
                f"# already inside job {job.job_id}'s namespace (joined by Slurm's jobns "
                "plugin): run the command there"
            )
            return 0
        return run_inside(job, command, environ, kill_wait, net_none)
    from jobns.launcher.protocol import state

    joined = state.read_run_env(config.state_dir, job.job_id)
    if joined is not None:
        if req.dry_run:
            print(f"# job {job.job_id} is set up on this node: join {joined['mnt_pin']}")
            return 0
        if req.shared is not None or req.no_rm_tmpdir:
            warn(
                f"warning: job {job.job_id} is already set up: the options given to jobns "
                "setup apply",
                log=None,
            )
        kw = None if req.kill_wait is None else kill_wait
        named = bool(req.user or environ.get("SLURM_JOB_USER") or environ.get("SLURM_JOB_UID"))
        return run_joined(joined, job, command, environ, kw, net_none, named)
    # Only a job nobody set up needs its trees planned and made (tasks that join do not).
    from jobns.launcher.model.plan import build

    plan = build(config, job)
    if config.dirs:
        from jobns.launcher.mountns.dirs import for_standalone

        plan = for_standalone(plan)
    if req.dry_run:
        print(plan.describe())
        return 0
    return run_standalone(plan, job, command, environ, kill_wait, net_none, config.state_dir)


def run_inside(
    job: Job, command: list[str], environ: dict[str, str], kill_wait: float, net_none: bool
) -> int:
    """Inside a job enforced through Slurm: no namespace to make or join, and the state
    directory is hidden here. Supervise the command with the job environment (the
    plugin set it already; it is computed again here) and make its PMIx directory."""
    from jobns.launcher.model.environment import pmix_dirs

    root_for_user = os.geteuid() == 0 and job.user.uid != 0
    env = joined_env(environ, {}, job, root_for_user)
    task_dirs = pmix_dirs(env)
    me = os.getpid()

    def prepare() -> None:
        # The namespace is root's (the host's user namespace): root may act in it.
        net_user_and_parent(net_none, root_for_user, job, me)
        make_task_dirs(task_dirs)

    sup = Supervisor(kill_wait)
    sup.start(prepare, command, env)
    return sup.wait()


def run_joined(
    values: dict[str, str],
    job: Job,
    command: list[str],
    environ: dict[str, str],
    kill_wait: float | None,
    net_none: bool,
    named: bool,
) -> int:
    """The job was set up by a prolog: join its pinned namespace(s); nothing to make or remove.

    The namespace of a job run by an ordinary user is hers (owned by her user namespace:
    she can mount over /usr/bin/id in it). So root never enters it: a task started by
    root becomes the job's owner first and joins as her (SECURITY.md rule 1).
    """
    from jobns.launcher.model.environment import pmix_dirs
    from jobns.launcher.model.job import lookup_user

    owner = int(values["uid"])
    caller = os.geteuid()
    # Enforced through Slurm: the namespace is root's, so root joins before it becomes
    # the owner, and nobody else can join it (its tasks are put there by the plugin).
    enforced = values.get("enforced") == "1" and owner != 0
    if enforced and caller != 0:
        raise JobnsError(
            f"join job {job.job_id}: the site puts every task of this job in "
            "its namespace through Slurm (the jobns SPANK plugin); start the "
            "task inside the job (srun, or the batch script), not from outside"
        )
    if caller != 0 and caller != owner:
        raise JobnsError(
            f"join job {job.job_id}: it belongs to uid {owner}, not to you (uid {caller})"
        )
    if job.user.uid != owner:
        if caller != 0 or named:
            raise JobnsError(
                f"join job {job.job_id}: it was set up for uid {owner}, so its "
                f"tasks run as uid {owner}, not as {job.user.name} (uid "
                f"{job.user.uid}); drop --user (and SLURM_JOB_USER/UID)"
            )
        # Root without --user: the task runs as the job's owner.
        user = lookup_user(str(owner)) if owner != 0 else job.user
        job = Job(job.job_id, user, job.hostname, job.layout, job.no_rm)
    env = joined_env(environ, values, job, caller == 0 and owner != 0)
    task_dirs = pmix_dirs(env)
    user_pin = values["user_pin"] or None
    mnt_pin = values["mnt_pin"]
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    # In the job's PID namespace the task sees no parent (getppid() is 0: we are outside).
    me = 0 if values.get("pid_pin") else os.getpid()

    def prepare() -> None:
        if net_none:
            # Imported here, in the host's namespace: after the join, an import would
            # read the job's view of the file system.
            import pyroute2  # noqa: F401
        if caller == 0 and owner != 0 and not enforced:
            # First: root never enters a namespace the user owns.
            switch_user(job.user.uid, job.user.gid, job.user.groups)
        # The job user enters through the user namespace she owns (the only way an
        # unprivileged process may setns); a root job's namespace is root's, and so is
        # an enforced job's.
        namespace.join(user_pin, mnt_pin)
        net_user_and_parent(net_none, enforced, job, me)
        enter_workdir(cwd)
        make_task_dirs(task_dirs)

    sup = Supervisor(float(values["kill_wait"]) if kill_wait is None else kill_wait)
    pid_pin = values.get("pid_pin")
    if pid_pin:
        # [namespace] pid: the task is forked into the job's PID namespace. Only root
        # gets here with one (an enforced job's tasks are root's to start), and a PID
        # namespace gives no view of anything: this process stays in the host's.
        namespace.join_pid(pid_pin, job.job_id)
    try:
        sup.start(prepare, command, env)
    except OSError as e:
        if pid_pin and e.errno == errno.ENOMEM:
            raise namespace.pid_namespace_gone(job.job_id) from None
        raise
    return sup.wait()


def run_standalone(
    plan: Plan,
    job: Job,
    command: list[str],
    environ: dict[str, str],
    kill_wait: float,
    net_none: bool,
    state_dir: str,
) -> int:
    """No prolog set this job up: make its namespace for this one task."""
    from jobns.launcher.backing import fs

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
            namespace.apply_binds(plan, handles, expected)
            if net_none:
                namespace.loopback_up()
            if root and job.user.uid != 0:
                switch_user(job.user.uid, job.user.gid, job.user.groups)
            arm_child_death_signal(me)
            enter_workdir(cwd)
            make_task_dirs(plan.task_dirs)

        sup = Supervisor(kill_wait)
        sup.start(prepare, command, env)
        return sup.wait()
    finally:
        from jobns.launcher.protocol.state import is_set_up

        for h in handles:
            for err in fs.release_tree(h, lambda: is_set_up(state_dir, job.job_id)):
                warn(f"warning: {err}", log=None)
        sys.stderr.flush()
