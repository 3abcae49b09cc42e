"""launcher.system.fork: the one fork helper (no root).

Each child reports once through its own pipe (nothing: success), keeps its JobnsError's
exit code, reports anything else as an internal error with 125, and holds only the fds it
was given: with inherit=False exactly `keep` plus stdin/out/err (/dev/null unless kept),
with inherit=True everything but the close-on-exec fds.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator

import pytest

from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fork import Child, spawn


def exit_status(child: Child) -> int:
    return os.waitstatus_to_exitcode(child.wait())


# ------------------------------------------------------------------------- reports


def test_success_reports_nothing_and_exits_0() -> None:
    child = spawn(lambda: None)
    assert child.report() is None
    assert child.wait() == 0


def test_finish_of_a_successful_child_returns() -> None:
    spawn(lambda: None).finish("noop")


def test_a_jobns_error_keeps_its_message_and_exit_code() -> None:
    def work() -> None:
        raise JobnsError("x", 7)

    child = spawn(work)
    assert child.report() == (7, "x")
    assert exit_status(child) == 7


def test_a_message_with_spaces_newlines_and_non_ascii_survives() -> None:
    msg = "make /tmp/a b: no space left\nsecond line é ✓"

    def work() -> None:
        raise JobnsError(msg, 3)

    child = spawn(work)
    assert child.report() == (3, msg)
    assert exit_status(child) == 3


def test_a_long_message_is_read_whole() -> None:
    msg = "m" * 300_000  # more than a pipe holds: the parent reads while the child writes

    def work() -> None:
        raise JobnsError(msg, 4)

    child = spawn(work)
    assert child.report() == (4, msg)
    assert exit_status(child) == 4


def test_any_other_exception_is_an_internal_error_with_125() -> None:
    def work() -> None:
        raise ValueError("bad value")

    child = spawn(work)
    failure = child.report()
    assert failure is not None
    code, msg = failure
    assert code == 125
    assert "internal error" in msg and "ValueError" in msg and "bad value" in msg
    assert "Traceback" not in msg
    assert exit_status(child) == 125


def test_an_oserror_is_an_internal_error_naming_it() -> None:
    def work() -> None:
        os.open("/nonexistent/jobns-test", os.O_RDONLY)

    child = spawn(work)
    failure = child.report()
    assert failure is not None and failure[0] == 125
    assert "internal error" in failure[1] and "/nonexistent/jobns-test" in failure[1]
    assert exit_status(child) == 125


@pytest.mark.parametrize("exc", [SystemExit(0), SystemExit(3), KeyboardInterrupt()])
def test_the_child_never_unwinds_into_the_caller(exc: BaseException) -> None:
    """Even SystemExit and KeyboardInterrupt end in the child's os._exit with 125."""

    def work() -> None:
        raise exc

    child = spawn(work)
    failure = child.report()
    assert failure is not None and failure[0] == 125
    assert "internal error" in failure[1] and type(exc).__name__ in failure[1]
    assert exit_status(child) == 125


def test_finish_raises_the_childs_error() -> None:
    def work() -> None:
        raise JobnsError("it failed", 9)

    with pytest.raises(JobnsError, match=r"^it failed$") as info:
        spawn(work).finish("helper")
    assert info.value.code == 9


def test_finish_notices_a_child_that_died_without_a_report() -> None:
    def work() -> None:
        os._exit(3)

    with pytest.raises(JobnsError, match=r"^helper: the helper process died \(wait status 0x300\)"):
        spawn(work).finish("helper")


def test_before_runs_in_the_child_before_the_fds_are_closed() -> None:
    r, w = os.pipe()

    def before() -> None:
        os.write(w, str(os.getpid()).encode())

    try:
        child = spawn(lambda: None, before=before)
        os.close(w)
        w = -1
        assert child.report() is None
        assert child.wait() == 0
        assert int(os.read(r, 100)) == child.pid
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


# ------------------------------------------------------------------------- fds


FdInfo = dict[str, "tuple[str, bool] | None"]
Pipe = tuple[int, int]


def fds_seen_by_child(keep: tuple[int, ...], inherit: bool, result: Pipe) -> FdInfo:
    """Spawn a child that lists its fds and writes, for each, (readlink, close-on-exec)
    or None for one closed meanwhile (the listing's own directory fd) to result."""
    result_r, result_w = result

    def work() -> None:
        info: dict[str, list[object] | None] = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{name}")
                cloexec = bool(fcntl.fcntl(int(name), fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
                info[name] = [link, cloexec]
            except OSError:
                info[name] = None
        os.write(result_w, json.dumps(info).encode())

    child = spawn(work, keep, inherit=inherit)
    failure = child.report()
    assert child.wait() == 0 and failure is None, failure
    os.set_blocking(result_r, False)
    raw: dict[str, list[object] | None] = json.loads(os.read(result_r, 1 << 20))
    return {k: None if v is None else (str(v[0]), bool(v[1])) for k, v in raw.items()}


@pytest.fixture
def result() -> Iterator[Pipe]:
    """A pipe the child writes its findings to: (read end, write end to keep)."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


@pytest.fixture
def two_fds() -> Iterator[tuple[int, int]]:
    """(an fd without close-on-exec, one with it)."""
    plain = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(plain, True)
    cloexec = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    assert not fcntl.fcntl(plain, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert fcntl.fcntl(cloexec, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    yield plain, cloexec
    os.close(plain)
    os.close(cloexec)


def assert_only_the_report_pipe(extra: FdInfo, result: Pipe) -> None:
    """What is left besides the expected fds: the child's own report pipe (a pipe,
    close-on-exec, not the result pipe) and at most the listing's closed directory fd."""
    live = {k: v for k, v in extra.items() if v is not None}
    assert len(extra) - len(live) <= 1, extra
    assert len(live) == 1, extra
    ((_, (link, cloexec)),) = live.items()
    assert link.startswith("pipe:") and cloexec, extra
    assert link != os.readlink(f"/proc/self/fd/{result[1]}")


def test_without_inherit_the_child_holds_only_what_it_was_given(
    result: Pipe, two_fds: tuple[int, int]
) -> None:
    fds = fds_seen_by_child((result[1],), False, result)
    assert str(result[1]) in fds
    for fd in two_fds:
        assert str(fd) not in fds
    for std in ("0", "1", "2"):
        assert fds[std] == ("/dev/null", False), fds
    extra = {k: v for k, v in fds.items() if k not in ("0", "1", "2", str(result[1]))}
    assert_only_the_report_pipe(extra, result)


def test_without_inherit_a_kept_fd_survives_even_if_close_on_exec(
    result: Pipe, two_fds: tuple[int, int]
) -> None:
    plain, cloexec = two_fds
    fds = fds_seen_by_child((result[1], cloexec), False, result)
    assert fds[str(cloexec)] == ("/dev/null", True)
    assert str(plain) not in fds


def test_a_kept_stdout_is_not_replaced(result: Pipe) -> None:
    parent_stdout = os.readlink("/proc/self/fd/1")
    fds = fds_seen_by_child((result[1], 1), False, result)
    assert fds["1"] is not None and fds["1"][0] == parent_stdout
    assert fds["0"] == ("/dev/null", False) and fds["2"] == ("/dev/null", False)


def test_with_inherit_only_close_on_exec_fds_are_closed(
    result: Pipe, two_fds: tuple[int, int]
) -> None:
    plain, cloexec = two_fds
    fds = fds_seen_by_child((result[1],), True, result)
    assert fds[str(plain)] == ("/dev/null", False)
    assert str(cloexec) not in fds
    assert str(result[1]) in fds  # kept although close-on-exec
    # Every close-on-exec fd left, but for the kept one, is the child's report pipe.
    extra = {k: v for k, v in fds.items() if v is None or (v[1] and k != str(result[1]))}
    assert_only_the_report_pipe(extra, result)
    # stdin/out/err are the caller's own (inherited, not /dev/null).
    for fd in (0, 1, 2):
        try:
            parent = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if os.get_inheritable(fd):
            assert fds[str(fd)] == (parent, False)


def test_with_inherit_a_kept_close_on_exec_fd_survives(
    result: Pipe, two_fds: tuple[int, int]
) -> None:
    plain, cloexec = two_fds
    fds = fds_seen_by_child((result[1], cloexec), True, result)
    assert fds[str(cloexec)] == ("/dev/null", True)
    assert fds[str(plain)] == ("/dev/null", False)


def test_spawn_leaves_the_parents_fds_alone(result: Pipe) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    child = spawn(lambda: None)
    assert child.report() is None
    assert child.wait() == 0
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert child.report_fd == -1
