"""The node's file protocol, golden (issue 33): what jobns/launcher/protocol/state.py writes
under state_dir is what the C modules read (jobns/slurm/jobns_node.h, in the SPANK plugin,
the job_container plugin and the PAM module).

tests/unit/protocol_reader.c, built here against the header, prints what the C side
understands of one job (run.env, the marks, the lock, the pins); each test writes a job's
files as jobns does (run.env and the lock through state.py's own functions, the pins as
launcher.mountns.pins makes them, the marks as the packaged prolog and epilog write them)
and holds the two against each other, field by field. As root (pytest.mark.root: ci/run's
root phase; ci/check leaves it out): the header trusts only root's files
(jobns_open_root_owned), and ensure_state_dir mounts.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.mountns import pins
from jobns.launcher.protocol import state
from jobns.launcher.system import libc
from jobns.launcher.system.errors import JobnsError
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "jobns/slurm/jobns_node.h"
READER = Path(__file__).with_name("protocol_reader.c")
MODULES = (REPO / "jobns/slurm/spank/jobns_spank.c", REPO / "jobns/slurm/pam/pam_jobns.c")
# The buffer of one env. line's NAME=VALUE (with its NUL), the header's, which every
# module parses run.env's env. lines with (checked below).
ENV_MAX = int(re.findall(r"^#define JOBNS_ENV_MAX (\d+)", HEADER.read_text(), re.M)[0])
JOB = "4242"


def test_the_protocol_version_is_the_same_on_both_sides() -> None:
    found = re.findall(r'^#define JOBNS_RUN_ENV_VERSION "([^"]*)"', HEADER.read_text(), re.M)
    assert found == [state.RUN_ENV_VERSION]


def test_every_module_parses_env_lines_with_the_header() -> None:
    for module in (*MODULES, READER):
        text = module.read_text()
        assert "char buf[JOBNS_ENV_MAX];" in text and "jobns_next_env(" in text, module
        assert '"env."' not in text, module  # no parser of its own


def test_the_python_side_under_test_is_this_checkout() -> None:
    assert Path(state.__file__).resolve().is_relative_to(REPO)


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(os.geteuid() == 0, "needs root: the C side trusts only root's files")
    cc = shutil.which("cc") or shutil.which("gcc")
    require(cc is not None, "no C compiler (cc) on PATH to build tests/unit/protocol_reader.c")
    assert cc is not None
    exe = tmp_path_factory.mktemp("reader") / "protocol_reader"
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", f"-I{HEADER.parent}"]
    built = subprocess.run(
        [cc, *flags, "-o", str(exe), str(READER)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    return exe


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[str]:
    """A state directory as every jobns makes it (root's, a private mount of itself)."""
    require(
        os.geteuid() == 0,
        "needs root: ensure_state_dir mounts, and the C side trusts only root's files",
    )
    path = str(tmp_path / "state")
    state.ensure_state_dir(path)
    try:
        yield path
    finally:
        libc.umount2(path, libc.MNT_DETACH)  # and every pin mounted under it


def read_c(reader: Path, state_dir: str, job_id: str = JOB) -> dict[str, str]:
    out = subprocess.run(
        [str(reader), state_dir, job_id], capture_output=True, text=True, check=True
    ).stdout
    seen: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        assert sep and key not in seen, line
        seen[key] = value
    return seen


def read_py(state_dir: str, job_id: str = JOB) -> dict[str, str] | str | None:
    """state.read_run_env's answer: the values, or why no task may join."""
    try:
        return state.read_run_env(state_dir, job_id)
    except JobnsError as e:
        return str(e)


def check_open(c: dict[str, str]) -> tuple[int, str]:
    rc, _, err = c["check_open"].partition(" ")
    return int(rc), err


def make_job_dir(state_dir: str, job_id: str = JOB) -> str:
    """The job's directory, as write_record makes it before run.env is first written."""
    path = state.job_dir(state_dir, job_id)
    state.private_dir(path, None)
    return path


def env_of(c: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("env."): v for k, v in c.items() if k.startswith("env.")}


@pytest.mark.root
def test_an_open_job_is_read_alike(reader: Path, state_dir: str) -> None:
    job = make_job_dir(state_dir)
    me = os.stat("/proc/self/ns/mnt")
    long_prefix = "env.JOBNS_LONG="
    env = {
        "TMPDIR": "/tmp",
        "JOBNS_EQUALS": "a=b==c=",
        "EMPTY": "",
        # The longest NAME=VALUE the modules take (one byte less than their buffer).
        "JOBNS_LONG": "x" * (ENV_MAX - 1 - len(long_prefix) + len("env.")),
    }
    # The keys launcher.model.record.run_env_values and lifecycle.enforced_values write.
    values = {
        "job_id": JOB,
        "uid": "1000",
        "gid": "1000",
        "user": "alice",
        "layout": "local",
        "user_pin": "",
        "mnt_pin": state.pin_paths(state_dir, JOB)[1],
        # This process's own namespace: the C side is "inside" (put there by Slurm).
        "mnt_ns": f"{me.st_dev}:{me.st_ino}",
        "kill_wait": "2.0",
        "arc.scratchdir": "/scratch/a=b",
        "enforced": "1",
        **{f"env.{k}": v for k, v in env.items()},
    }
    state.write_run_env(state_dir, JOB, values, uid=None)
    text = Path(f"{job}/{state.RUN_ENV}").read_text()
    assert f"{long_prefix}{env['JOBNS_LONG']}\n" in text
    assert len("JOBNS_LONG=") + len(env["JOBNS_LONG"]) == ENV_MAX - 1

    c = read_c(reader, state_dir)
    assert c["jobs"] == "ok"
    assert c["open"] == "0"
    assert c["bytes"] == str(len(text.encode()))  # the whole file, nothing cut
    assert c["version"] == state.RUN_ENV_VERSION
    assert "closed" not in c and "reason" not in c
    assert check_open(c) == (0, "")
    assert c["mnt_ns"] == values["mnt_ns"]
    assert c["inside"] == "1"
    assert c["has_pidns"] == "0"
    assert c["pin.pid"] == f"open {job}/ns/pid: {os.strerror(errno.ENOENT)}"
    assert "env_refused" not in c
    assert env_of(c) == env
    # The Python reader agrees: the same job, open, with the same values.
    assert read_py(state_dir) == {"version": state.RUN_ENV_VERSION, **values}


@pytest.mark.root
def test_a_variable_longer_than_the_modules_take_is_refused_not_cut(
    reader: Path, state_dir: str
) -> None:
    make_job_dir(state_dir)
    too_long = "y" * (ENV_MAX - len("JOBNS_LONG="))
    state.write_run_env(state_dir, JOB, {"env.JOBNS_LONG": too_long, "env.A": "1"}, uid=None)
    c = read_c(reader, state_dir)
    assert check_open(c) == (0, "")
    assert c["env_refused"] == "JOBNS_LONG=" + "y" * (64 - len("JOBNS_LONG="))
    assert env_of(c) == {"A": "1"}


@pytest.mark.root
def test_a_refused_job_is_read_alike(reader: Path, state_dir: str) -> None:
    make_job_dir(state_dir)
    reason = "bad  directive:\n\t--tmp  " + "z" * 3 * state.MAX_REASON
    state.close_run_env(state_dir, JOB, state.REFUSED, None, reason=reason)
    meant = " ".join(reason.split())[: state.MAX_REASON]  # one line, bounded
    c = read_c(reader, state_dir)
    assert c["closed"] == state.REFUSED
    assert c["reason"] == meant  # whole: the modules' buffer holds MAX_REASON
    assert check_open(c) == (-2, f"job {JOB} was refused by jobns setup on this node: {meant}")
    said = read_py(state_dir)
    assert isinstance(said, str) and said.endswith(f"on this node: {meant}")
    assert env_of(c) == {}


@pytest.mark.root
@pytest.mark.parametrize("closed", [s for s in state.STATES if s != state.REFUSED])
def test_every_closed_state_is_read_alike(reader: Path, state_dir: str, closed: str) -> None:
    make_job_dir(state_dir)
    state.close_run_env(state_dir, JOB, closed, None)
    c = read_c(reader, state_dir)
    assert c["closed"] == closed
    rc, err = check_open(c)
    said = read_py(state_dir)
    assert rc == -2 and isinstance(said, str)
    assert f"(state {closed})" in err and f"(state {closed})" in said
    # Both sides call the same states "ending" (the rest: "still being set up").
    assert ("is ending" in err) == ("is ending" in said)
    assert ("still being set up" in err) == ("still being set up" in said)


@pytest.mark.root
def test_a_job_being_torn_down_is_read_alike(reader: Path, state_dir: str) -> None:
    make_job_dir(state_dir)
    state.write_run_env(state_dir, JOB, {"uid": "0", "env.A": "1"}, uid=None)
    assert env_of(read_c(reader, state_dir)) == {"A": "1"}
    state.close_run_env(state_dir, JOB, "teardown", None)  # as lifecycle.finish does
    c = read_c(reader, state_dir)
    assert c["closed"] == "teardown"
    rc, err = check_open(c)
    assert rc == -2 and f"job {JOB} is ending on this node (state teardown)" in err
    assert env_of(c) == {} and "mnt_ns" not in c  # closing rewrote run.env whole
    said = read_py(state_dir)
    assert isinstance(said, str) and "is ending on this node (state teardown)" in said


@pytest.mark.root
@pytest.mark.parametrize(
    "body",
    [b"version=0\n", b"closed=teardown\n", f"version={state.RUN_ENV_VERSION}0\n".encode()],
)
def test_another_version_is_refused_by_both(reader: Path, state_dir: str, body: bytes) -> None:
    job = make_job_dir(state_dir)
    state.write_atomic(f"{job}/{state.RUN_ENV}", body, None, "join record", False)
    rc, err = check_open(read_c(reader, state_dir))
    assert rc == -1 and "unknown version" in err
    said = read_py(state_dir)
    assert isinstance(said, str) and "unknown version" in said


@pytest.mark.root
@pytest.mark.parametrize("pid", [True, False])
def test_the_pins_are_where_the_python_side_puts_them(
    reader: Path, state_dir: str, pid: bool
) -> None:
    job = make_job_dir(state_dir)
    _, mnt_pin = state.pin_paths(state_dir, JOB)
    pid_pin = state.pid_pin_path(state_dir, JOB)
    # Pin files as launcher.mountns.pins makes them: the mount pin stays a plain file
    # (the C side finds it and says it is no namespace), the PID pin is a real one.
    pins._make_pin(mnt_pin, 0)
    if pid:
        pins._make_pin(pid_pin, 0)
        libc.mount("/proc/self/ns/pid", pid_pin, None, libc.MS_BIND)
    values = {"uid": "0", "mnt_pin": mnt_pin, **({"pid_pin": pid_pin} if pid else {})}
    state.write_run_env(state_dir, JOB, values, uid=None)
    c = read_c(reader, state_dir)
    assert check_open(c) == (0, "")
    assert c["inside"] == "0" and "mnt_ns" not in c
    assert c["pin.mnt"] == f"{job}/ns/mnt is not a pinned mount namespace"
    assert mnt_pin == f"{job}/ns/mnt" and pid_pin == f"{job}/ns/pid"
    assert c["has_pidns"] == str(int(pid))
    joined = read_py(state_dir)
    assert isinstance(joined, dict) and bool(joined.get("pid_pin")) is pid  # commands.run
    if pid:
        assert c["pin.pid"] == "ok"
    else:
        assert c["pin.pid"] == f"open {job}/ns/pid: {os.strerror(errno.ENOENT)}"


T = 1_700_000_000_123_456_789  # ns since the epoch


@pytest.mark.root
@pytest.mark.parametrize(
    ("setup_at", "ending_at", "over"),
    [
        pytest.param(None, None, False, id="no-marks"),
        pytest.param(T, None, False, id="prolog-only"),  # a setup is on its way
        pytest.param(None, T, True, id="epilog-only"),
        pytest.param(T, T + 1_000, True, id="prolog-then-epilog"),  # 1 µs later
        pytest.param(T, T, True, id="same-time"),  # not older: this run's
        pytest.param(T, T - 1_000, False, id="epilog-older"),  # an earlier job's
        pytest.param(T, T - 1_000_000_000, False, id="epilog-a-second-older"),
    ],
)
def test_the_marks_are_read_alike(
    reader: Path, state_dir: str, setup_at: int | None, ending_at: int | None, over: bool
) -> None:
    for suffix, at, run in ((state.SETUP_MARK, setup_at, "3"), (state.ENDING, ending_at, "")):
        if at is None:
            continue
        # As the packaged prolog and epilog write them (jobns/slurm/scripts/).
        path = state.mark_path(state_dir, JOB, suffix)
        Path(path).write_text(f"{run}\n")
        os.utime(path, ns=(at, at))
        assert state.read_mark(state_dir, JOB, suffix) == run
    c = read_c(reader, state_dir)
    assert c["jobs"] == "ok"
    for suffix, at in ((state.SETUP_MARK, setup_at), (state.ENDING, ending_at)):
        assert state.mark_time(state_dir, JOB, suffix) == at
        assert c.get(f"mark{suffix}") == (None if at is None else str(at))
    assert c["run_is_over"] == str(int(over))
    # The Python side's rule (setup drops an epilog's mark older than its prolog's): the
    # run is over when an epilog's mark is left.
    if setup_at is not None:
        state.drop_stale_ending(state_dir, JOB, setup_at)
    assert (state.mark_time(state_dir, JOB, state.ENDING) is not None) is over
    # No job directory: neither side finds a job to join.
    assert c["open"] == f"-1 {os.strerror(errno.ENOENT)}"
    assert read_py(state_dir) is None


@pytest.mark.root
def test_the_job_lock_is_seen_by_the_c_side(reader: Path, state_dir: str) -> None:
    with state.JobLock(state_dir, JOB):
        assert read_c(reader, state_dir)["setup_under_way"] == "1"
    assert read_c(reader, state_dir)["setup_under_way"] == "0"
    other = read_c(reader, state_dir, "4243")
    assert other["setup_under_way"] == "0"
