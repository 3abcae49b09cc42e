"""`jobns helper`: the resident helper that runs the prolog's setup and the epilog's
teardown from an interpreter already started (docs/admin.md "The resident helper").

A `jobns setup` costs ~42 ms here, of which the interpreter's start and jobns's
imports are ~35 ms; the helper pays them once. The packaged prolog and epilog
(jobns/slurm/scripts/) hand it a job when it runs, and fall back to starting jobns themselves
when it does not:

  <state_dir>/helper/          root's, 0700
      pid                      the helper's pid (the scripts' `kill -0`)
      doorbell                 a FIFO: a script writes one byte after each request
      requests/<job>.<verb>    the request: the script's SLURM_* variables,
                               NUL-separated NAME=value, ending with JOBNS_END=1

Each request is taken (unlinked) and run in a forked child exactly as the script would
have run it: `jobns <verb> --background --job-id <job>` (setup: `--user
$SLURM_JOB_USER`) with the request's variables as its whole environment, so a failure
is handled as a background setup's or teardown's (launcher.lifecycle.unattended) and a
crash of one job's child is that job's only. Requests left while no helper ran (the
script then started jobns itself; a request is written only while the helper's pid is
alive) are taken when it starts. A request a script is still writing (no JOBNS_END yet)
waits for its doorbell.

Only root writes there (the directories are root's, 0700); the variables are what
slurmd gave the script, so what a user controls in them (the job comment) reaches setup
as it would from the prolog itself.
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import select
import signal
import stat
import sys
from dataclasses import dataclass

from jobns.launcher.commands import cli
from jobns.launcher.lifecycle.lifecycle import require_root
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import Options
from jobns.launcher.protocol import state
from jobns.launcher.system.errors import JobnsError, warn
from jobns.launcher.system.rootdir import ensure_root_dir

END = "JOBNS_END=1"
EPILOG_AT = "JOBNS_EPILOG_AT"  # launcher.commands.teardown.epilog_time reads it
VERBS = ("setup", "teardown")  # setup first: a job's teardown waits on its lock anyway
_REQUEST_NAME = re.compile(r"([0-9]{1,10})\.(setup|teardown)")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")  # a shell variable's name
MAX_REQUEST = 1 << 20

# What a setup and a teardown import, on every path: imported once, here.
WARM = (
    "jobns.launcher.commands.setup",
    "jobns.launcher.commands.teardown",
    "jobns.launcher.lifecycle.lifecycle",
    "jobns.launcher.lifecycle.release",
    "jobns.launcher.lifecycle.unattended",
    "jobns.launcher.staging.programs",
    "jobns.launcher.staging.steps",
    "jobns.launcher.model.capacity",
    "jobns.launcher.model.directives",
    "jobns.launcher.model.jobsize",
    "jobns.launcher.staging.model",
    "jobns.launcher.mountns.binds",
    "jobns.launcher.mountns.namespace",
    "jobns.launcher.mountns.pins",
    "jobns.launcher.backing.kinds",
    "jobns.launcher.backing.directory",
    "jobns.launcher.backing.tmpfs",
    "jobns.launcher.backing.disk",
    "jobns.launcher.system.log",
    "jobns.launcher.system.jsonfast",
    "jobns.launcher.model.environment",
    "json",
    "pwd",
    "grp",
)


@dataclass(slots=True)
class Request:
    """One job handed over by a script: `jobns <verb>` of job_id with environ."""

    verb: str
    job_id: str
    environ: dict[str, str]

    def argv(self, config: str | None) -> list[str]:
        args = [self.verb, "--background", "--job-id", self.job_id]
        if self.verb == "setup":
            args += ["--user", self.environ.get("SLURM_JOB_USER", "")]
        return args + (["--config", config] if config else [])


def parse_request(name: str, data: bytes) -> Request | None:
    """The request in file `name` with content `data`; None while the script is still
    writing it (no JOBNS_END yet). JobnsError for anything else that is not a request."""
    m = _REQUEST_NAME.fullmatch(name)
    if m is None:
        raise JobnsError(f"not a request name: {name!r} (want <job id>.setup|teardown)")
    fields = data.split(b"\0")
    if fields[-1] != b"" or len(fields) < 2 or fields[-2] != END.encode():
        return None
    environ: dict[str, str] = {}
    for raw in fields[:-2]:
        text = raw.decode("utf-8", "surrogateescape")
        key, eq, value = text.partition("=")
        # `${!SLURM@}` gives no other, and the epilog adds when it ran
        if not eq or not (key.startswith("SLURM") or key == EPILOG_AT):
            raise JobnsError(f"request {name}: not a SLURM* variable: {key[:40]!r}")
        if _VARIABLE.fullmatch(key) is not None:
            environ[key] = value
    if environ.get("SLURM_JOB_ID") != m.group(1):
        raise JobnsError(f"request {name}: SLURM_JOB_ID is {environ.get('SLURM_JOB_ID')!r}")
    return Request(m.group(2), m.group(1), environ)


def order(names: list[str]) -> list[str]:
    """Requests in the order to run them: by job, a setup before its teardown."""

    def key(name: str) -> tuple[int, int, str]:
        job, _, verb = name.partition(".")
        return (int(job) if job.isdigit() else -1, VERBS.index(verb) if verb in VERBS else 2, name)

    return sorted(names, key=key)


def main(opts: Options, _command: list[str]) -> int:
    require_root("helper")  # the command, not the directory
    flag = str(opts["config"]) if opts.get("config") else None
    config = config_mod.load(flag)
    for module in WARM:
        importlib.import_module(module)
    top = f"{config.state_dir}/{state.HELPER}"
    bell = _prepare(config.state_dir, top)
    signal.signal(signal.SIGTERM, lambda *_: _stop(top))
    signal.signal(signal.SIGINT, lambda *_: _stop(top))
    warn(f"helper: taking setups and teardowns from {top} (pid {os.getpid()})")
    while True:
        _take_all(f"{top}/{state.HELPER_REQUESTS}", flag, bell, config.state_dir)
        _reap()
        ready, _, _ = select.select([bell], [], [], 5.0)  # a scan now and then regardless
        if ready:
            try:
                os.read(bell, 4096)
            except BlockingIOError:
                pass


def _prepare(state_dir: str, top: str) -> int:
    """The helper's directories, FIFO and pid file; the doorbell's fd (read and write:
    it never sees an end of file, and a script's write never blocks)."""
    state.ensure_state_dir(state_dir)
    for path in (top, f"{top}/{state.HELPER_REQUESTS}"):
        ensure_root_dir(path, 0o700, 0o077, "helper")
    bell_path = f"{top}/{state.HELPER_DOORBELL}"
    try:
        st = os.lstat(bell_path)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != 0:
            os.unlink(bell_path)  # root's own directory: a stray file of a script's
            raise FileNotFoundError
    except FileNotFoundError:
        os.mkfifo(bell_path, 0o600)
    bell = os.open(bell_path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    state.write_atomic(
        f"{top}/{state.HELPER_PID}", f"{os.getpid()}\n".encode(), None, "helper pid", False
    )
    return bell


def _stop(top: str) -> None:
    """SIGTERM: no new request is taken (the scripts start jobns themselves from now on);
    the children at work go on."""
    try:
        os.unlink(f"{top}/{state.HELPER_PID}")
    except FileNotFoundError:
        pass
    os._exit(0)


def _take_all(requests: str, config: str | None, bell: int, state_dir: str) -> None:
    for name in order(os.listdir(requests)):
        path = f"{requests}/{name}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ENOENT:
                warn(f"helper: open {path}: {e.strerror}; removed")
                _unlink(path)
            continue
        try:
            data = os.read(fd, MAX_REQUEST + 1)
        finally:
            os.close(fd)
        try:
            if len(data) > MAX_REQUEST:
                raise JobnsError(f"request {name}: larger than {MAX_REQUEST} bytes")
            request = parse_request(name, data)
        except JobnsError as e:
            warn(f"helper: {e}; removed")
            _unlink(path)
            continue
        if request is None:
            continue  # still being written: its doorbell comes
        # Taken only once its child exists: a fork that fails leaves the request for the
        # next scan (the doorbell, or the 5 s look), so no job loses its setup or teardown.
        if _run(request, config, bell, state_dir):
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _run(request: Request, config: str | None, bell: int, state_dir: str) -> bool:
    """The request in a child of its own, as the script would have run jobns; False when
    no child could be made (the request stays for the next scan)."""
    try:
        pid = os.fork()
    except OSError as e:
        warn(f"helper: {request.verb} {request.job_id}: fork: {e.strerror}; tried again later")
        return False
    if pid:
        return True
    code = 125
    try:
        os.close(bell)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()  # like the script's background jobns: a session of its own
        os.environ.clear()
        os.environ.update(request.environ)
        # As the script exports it: where a setup that cannot read jobns.toml records why.
        os.environ["JOBNS_STATE_DIR"] = state_dir
        code = cli.dispatch(request.argv(config))
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
