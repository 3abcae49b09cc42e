"""Fuzz the command line: every subcommand with arbitrary argv (its own options, others',
typos, hostile values), the Slurm variables the job's submitter controls, and the OCI
state on the hook's stdin.

The contract (docs/command-line.md "Exit codes"): exit 0 or 125 (`run` also 126, 127, 128+N and the
command's own status), and on stderr only `jobns: ` lines -- at most one that is not a
warning when it fails -- never a traceback, never "internal error" (cli.dispatch's
boundary says that only for a bug that slipped through).

In process (no root needed): cli.parse for every command, and cli.dispatch for what
touches nothing (help, env, status, run/setup/oci-config --dry-run). The installed
/opt/jobns/venv/bin/jobns in a subprocess, as root and as the ordinary user jobnsbob
(@pytest.mark.root): every subcommand, but only with the sandbox's configs (bases and
state under /var/lib/jobns-fuzz), setup and oci-config only with --dry-run, run only with
--dry-run or `-- true`, and the hook only with pids that cannot exist.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from jobns.launcher.commands import cli
from jobns.launcher.commands.cli import COMMANDS, FLAG, OPTIONAL, VALUE
from jobns.launcher.model import config as config_mod
from jobns.launcher.system.errors import JobnsError
from tests.conftest import JOBNS, OsUser, _ensure_user, require_root
from tests.fuzz.conftest import FuzzBox
from tests.fuzz.support import (
    JOBNS_CODES,
    RUN_CODES,
    check_cli,
    config_text,
    directives_text,
    fuzz,
    hostile_text,
    job_id_text,
    json_bytes,
    mostly,
    outcome,
    path_text,
    script_text,
    skip_if_known_cli,
    slurm_env,
    state_doc,
    to_bytes,
    tried,
    user_spec,
)

KILL_WAITS = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "2.5",
            "86400",
            "86401",
            "-1",
            "nan",
            "inf",
            "1e3",
            "0x10",
            " 3 ",
            "1_0",
            "",
            "\u0663",
            "1e400",
        ]
    ),
    hostile_text(6),
)
ALL_OPTIONS = sorted({name for c in COMMANDS.values() for name in c.opts})
NOISE = [
    ["-h"],
    ["--help"],
    ["-"],
    ["--"],
    ["-x"],
    ["--frob"],
    ["--job-id="],
    ["---"],
    ["--="],
    ["-1"],
    ["--dry-run=1"],
    ["--config"],
    ["--json=x"],
    ["help"],
    ["--version"],
]
# What may run how: hazard() checks every argv, parsed as jobns will, before it runs.
READ_ONLY = {"env", "status"}
DRY_RUN_ONLY = {"setup", "oci-config"}


def values(box: FuzzBox) -> dict[str, st.SearchStrategy[str]]:
    """Option values: plausible, wrong and hostile; paths only inside the box."""
    return {
        "--job-id": job_id_text(),
        "--user": user_spec(),
        "--use-shared-tmpdir": st.one_of(
            st.sampled_from(["", "per-node", "shared", "no", "PER-NODE"]), hostile_text(6)
        ),
        "--kill-wait": KILL_WAITS,
        "--config": mostly(
            st.sampled_from(box.configs),
            st.sampled_from(
                [
                    "",
                    str(box.root / "missing.toml"),
                    str(box.root),
                    "missing.toml",
                    str(box.files / "fuzz.toml"),
                ]
            ),
        ),
        "--net": st.one_of(st.sampled_from(["host", "none", "", "NONE"]), hostile_text(6)),
        "--script": st.one_of(
            st.sampled_from(
                [
                    str(box.files / "cli.sh"),
                    str(box.files / "cli.sh"),
                    str(box.root / "no.sh"),
                    str(box.root),
                    "",
                ]
            ),
            hostile_text(6),
        ),
        "--directives": directives_text().map(lambda t: str(box.place(t))),
        "--session-dir": st.one_of(st.just(f"{box.sessions}/abc"), path_text()),
        "--format": st.one_of(st.sampled_from(["sh", "json", ""]), hostile_text(5)),
    }


def option_tokens(box: FuzzBox, name: str) -> st.SearchStrategy[list[str]]:
    """argv tokens of one option, in every spelling the parser accepts or refuses."""
    cmd = COMMANDS[name]
    vals = values(box)

    def one(opt: str) -> st.SearchStrategy[list[str]]:
        known = cmd.opts.get(opt)
        kind = known.kind if known is not None else VALUE
        value = vals.get(opt, hostile_text(8))
        # Mostly the spellings jobns accepts, so that most argv get past the parser.
        if kind == FLAG:
            return mostly(st.just([opt]), value.map(lambda v: [f"{opt}={v}"]))
        if kind == OPTIONAL:
            return st.one_of(st.just([opt]), value.map(lambda v: [f"{opt}={v}"]))
        return mostly(
            st.one_of(value.map(lambda v: [opt, v]), value.map(lambda v: [f"{opt}={v}"])),
            st.just([opt]),
        )

    own = st.sampled_from(sorted(cmd.opts)).flatmap(one)
    group = mostly(
        own,
        st.one_of(
            st.sampled_from(ALL_OPTIONS).flatmap(one),
            st.sampled_from(NOISE),
            hostile_text(8).map(lambda t: [t]),
        ),
        one_in=10,
    )
    return st.lists(group, max_size=5).map(lambda gs: [t for g in gs for t in g])


def tail(box: FuzzBox, name: str) -> st.SearchStrategy[list[str]]:
    """The positional arguments: run's COMMAND, hook's STAGE, oci-config's BUNDLE."""
    junk = hostile_text(8).map(lambda t: [t])
    if name == "run":
        return mostly(
            st.just(["--", "true"]),
            st.one_of(st.sampled_from([[], ["true"], ["--", "true", "x"], ["--"]]), junk),
        )
    if name == "hook":
        return st.one_of(
            st.sampled_from(
                [
                    [],
                    ["createRuntime"],
                    ["prestart"],
                    ["poststop"],
                    ["startContainer"],
                    ["poststart"],
                    ["a", "b"],
                ]
            ),
            junk,
        )
    if name == "oci-config":
        return st.one_of(
            st.sampled_from(
                [
                    [str(box.bundle)],
                    [str(box.bundle)],
                    [str(box.files / "bundle")],
                    [],
                    [str(box.bundle), "x"],
                    [str(box.root / "missing")],
                ]
            ),
            junk,
        )
    return mostly(st.just([]), st.one_of(junk, st.just(["--", "x"])))


def argv_for(box: FuzzBox, names: list[str]) -> st.SearchStrategy[list[str]]:
    def build(name: str) -> st.SearchStrategy[list[str]]:
        forced = ["--dry-run"] if name in DRY_RUN_ONLY else []
        return st.builds(
            lambda opts, rest: [name, *forced, *opts, *rest],
            option_tokens(box, name),
            tail(box, name),
        )

    junk = st.one_of(
        st.sampled_from(
            [
                [],
                [""],
                ["-h"],
                ["--help"],
                ["help"],
                ["--version"],
                ["RUN"],
                ["--config", str(box.config)],
                ["run="],
            ]
        ),
        st.builds(lambda a, b: [a, *b], hostile_text(8), st.lists(hostile_text(6), max_size=3)),
    )
    return mostly(st.sampled_from(names).flatmap(build), junk, one_in=10)


def hazard(box: FuzzBox, argv: list[str], in_process: bool) -> str | None:
    """Why argv must not run here (None: it is safe): parsed exactly as jobns will."""
    if not argv or argv[0] not in COMMANDS:
        return None
    name = argv[0]
    try:
        opts, command = cli.parse(COMMANDS[name], argv[1:])
    except JobnsError:
        return None  # refused before anything runs
    if opts.get("help"):
        return None
    if name == "helper":
        return "the resident helper runs until SIGTERM"
    config = opts.get("config") or None  # "": $JOBNS_CONFIG, the box's
    foreign = config is not None and config not in box.configs  # bases could be anywhere
    if name in READ_ONLY:
        return None
    if name in DRY_RUN_ONLY:
        return None if opts.get("dry_run") else f"{name} without --dry-run"
    if name == "run" and opts.get("dry_run"):
        return None
    if in_process:
        return f"{name} in process"
    if foreign:
        return f"{name} with config {config!r}"
    if name == "run" and command != ["true"]:
        return f"run {command!r}"
    return None


# ----------------------------------------------------------------------------- in process


@fuzz()
@given(data=st.data())
def test_cli_parse(box: FuzzBox, data: st.DataObject) -> None:
    """The option parser of every subcommand: options as documented, or one clean line."""
    name = data.draw(st.sampled_from(sorted(COMMANDS)))
    argv = data.draw(option_tokens(box, name)) + data.draw(tail(box, name))
    tried("cli.parse")
    cmd = COMMANDS[name]
    got = outcome(cli.parse, cmd, argv)
    if isinstance(got, JobnsError):
        return
    opts, command = got
    known = {o[2:].replace("-", "_") for o in cmd.opts} | {"help"}
    assert set(opts) <= known
    for key, value in opts.items():
        assert value is None or isinstance(value, (str, bool)), (key, value)
    assert isinstance(command, list) and all(isinstance(a, str) for a in command)
    assert not command or cmd.args or argv[argv.index("--") + 1 :] == command


@contextlib.contextmanager
def environment(box: FuzzBox, extra: dict[str, str]) -> Iterator[None]:
    """os.environ as a job's: the box's config and the fuzzed Slurm variables."""
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith(("SLURM_", "PMIX_", "JOBNS_"))]:
            del os.environ[key]
        os.environ["JOBNS_CONFIG"] = str(box.config)
        for k, v in extra.items():
            os.environ[k] = os.fsdecode(to_bytes(v))  # what a real environment can hold
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def private_cache(box: FuzzBox) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config_mod, "CACHE_PATH", str(box.root / "config.cache"))
        yield


@fuzz(2)
@given(data=st.data(), env=slurm_env())
def test_cli_dispatch_in_process(
    box: FuzzBox, private_cache: None, data: st.DataObject, env: dict[str, str]
) -> None:
    """cli.dispatch itself, for everything that touches nothing (any user)."""
    # As the console script gets it: what an exec can pass (no NUL; undecodable bytes
    # as U+DC80..U+DCFF). A NUL or another lone surrogate cannot reach jobns that way.
    argv = [
        os.fsdecode(to_bytes(a))
        for a in data.draw(argv_for(box, ["env", "status", "run", "setup", "oci-config"]))
    ]
    if argv and argv[0] == "run" and "--dry-run" not in argv:
        argv.insert(1, "--dry-run")
    assume(hazard(box, argv, in_process=True) is None)
    tried("cli.dispatch")
    write_inputs(box, data, argv)
    with (
        environment(box, {k: str(box.place(v)) for k, v in env.items()}),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        rc = cli.dispatch(argv)
    stderr = err.getvalue()
    try:
        check_cli(rc, stderr, JOBNS_CODES)
    except AssertionError:
        skip_if_known_cli(stderr)
        raise


def write_inputs(box: FuzzBox, data: st.DataObject, argv: list[str]) -> None:
    """The batch script and the config file argv names, fuzzed (drawn only when named:
    they are the slowest inputs to make)."""
    if any("cli.sh" in a for a in argv):
        box.write("cli.sh", str(box.place(data.draw(script_text()))))
    if any("fuzz.toml" in a for a in argv):
        box.write("fuzz.toml", data.draw(config_text(box.paths())))


# ------------------------------------------------------------------------- the real CLI


def dead_pid() -> int:
    """A pid no process has (above pid_max when it can be): the hook never gets near a
    real process's mount namespace."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    for pid in range(min(pid_max + 1, 4194304), 0, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("no free pid")


def hook_stdin(box: FuzzBox) -> st.SearchStrategy[bytes]:
    bundles = [str(box.bundle), str(box.files / "bundle"), str(box.root / "missing")]
    pid = dead_pid()

    def no_live_pid(doc: object) -> object:
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int) and doc["pid"] > 0:
            doc = {**doc, "pid": pid}
        return doc

    return st.builds(
        lambda doc, how: json_bytes(no_live_pid(doc), how), state_doc(bundles), st.integers(0, 2)
    )


@pytest.fixture(scope="module")
def bob() -> OsUser:
    require_root()
    return _ensure_user("jobnsbob")


def run_cli(
    box: FuzzBox, argv: list[str], env: dict[str, str], stdin: bytes, user: OsUser | None
) -> tuple[int, str]:
    base = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        "JOBNS_CONFIG": str(box.config),
        "HOME": user.home if user else "/root",
        "USER": user.name if user else "root",
    }
    full = {to_bytes(k): to_bytes(v) for k, v in {**base, **env}.items()}
    creds: dict[str, object] = (
        {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}
    )
    r = subprocess.run(
        [os.fsencode(JOBNS), *(to_bytes(a) for a in argv)],
        input=stdin,
        capture_output=True,
        env=full,
        cwd=str(box.cwd),
        timeout=60,
        check=False,
        **creds,
    )  # type: ignore[call-overload]
    return r.returncode, r.stderr.decode("utf-8", "backslashreplace")


def check_real_cli(box: FuzzBox, data: st.DataObject, user: OsUser | None, target: str) -> None:
    # What the child will see: no NUL (exec cannot pass one), surrogates as bytes.
    argv = [os.fsdecode(to_bytes(a)) for a in data.draw(argv_for(box, sorted(COMMANDS)))]
    assume(hazard(box, argv, in_process=False) is None)
    env = {k: str(box.place(v)) for k, v in data.draw(slurm_env()).items()}
    stdin = data.draw(hook_stdin(box)) if argv[:1] == ["hook"] else b""
    write_inputs(box, data, argv)
    tried(target)
    rc, stderr = run_cli(box, argv, env, stdin, user)
    codes = RUN_CODES if argv[:1] == ["run"] else JOBNS_CODES
    try:
        check_cli(rc, stderr, codes)
    except AssertionError:
        skip_if_known_cli(stderr)
        raise


@pytest.mark.root
@fuzz(0.3)
@given(data=st.data())
def test_real_cli_as_root(box: FuzzBox, data: st.DataObject) -> None:
    require_root()
    check_real_cli(box, data, None, "cli.subprocess.root")


@pytest.mark.root
@fuzz(0.3)
@given(data=st.data())
def test_real_cli_as_user(box: FuzzBox, bob: OsUser, data: st.DataObject) -> None:
    require_root()
    check_real_cli(box, data, bob, "cli.subprocess.user")


@pytest.mark.root
@fuzz(0.25)
@given(data=st.data(), user=st.booleans())
def test_real_cli_with_fuzzed_config(
    box: FuzzBox, bob: OsUser, data: st.DataObject, user: bool
) -> None:
    """A site config with typos, read by the commands that only read: one line naming
    the key, never a traceback, as root and as a user."""
    require_root()
    path = box.write("fuzz.toml", data.draw(config_text(box.paths())))
    sub = data.draw(
        st.sampled_from(
            [
                ["env", "--job-id", "7"],
                ["status"],
                ["status", "--json"],
                ["run", "--dry-run", "--job-id", "7"],
                [
                    "setup",
                    "--dry-run",
                    "--job-id",
                    "7",
                    "--directives",
                    "shm capacity=1M; tmp capacity=1M",
                ],
                ["oci-config", "--dry-run", "--job-id", "7", str(box.bundle)],
            ]
        )
    )
    tried("cli.subprocess.config")
    rc, stderr = run_cli(box, [sub[0], "--config", path, *sub[1:]], {}, b"", bob if user else None)
    try:
        check_cli(rc, stderr, JOBNS_CODES)
    except AssertionError:
        skip_if_known_cli(stderr)
        raise


@fuzz(0.25)
@given(data=st.data())
def test_hook_stdin_never_names_a_live_pid(box: FuzzBox, data: st.DataObject) -> None:
    """The guard of the hook's fuzzing: no state it is fed names a live process."""
    raw = data.draw(hook_stdin(box))
    try:
        doc = json.loads(raw.decode("utf-8", "surrogatepass"))
    except ValueError:
        return
    pid = doc.get("pid") if isinstance(doc, dict) else None
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        assert not os.path.exists(f"/proc/{pid}")
