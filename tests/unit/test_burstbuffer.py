"""The burst buffer's pure parts (no root): its record, the script header it hands the
prolog, the staging it takes from the prolog, its settings and config checks, and the
`jobns bb` options (launcher.burstbuffer, commands.bb, commands.setup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobns.launcher.burstbuffer import pools
from jobns.launcher.burstbuffer.record import (
    COPY_KEYS,
    FIELDS,
    STAGE_OUT_FAILED,
    STATES,
    VERSION,
    BbRecord,
    file_name,
)
from jobns.launcher.commands import bb
from jobns.launcher.commands.cli import COMMANDS, parse
from jobns.launcher.commands.setup import _without_the_burst_buffers
from jobns.launcher.model.config import Config
from jobns.launcher.model.config import parse as parse_config
from jobns.launcher.model.directives import DirectiveError, parse_script, script_header
from jobns.launcher.model.request import Options
from jobns.launcher.staging.model import Copy, Staging
from jobns.launcher.system.errors import JobnsError

WHERE = "/s/.jobns-bb/job-5.json"
IN_A = "#JOBNS stage_in source=/stage/a destination=/tmp/a"
IN_B = "#JOBNS stage_in source=/stage/b destination=/dev/shm/b"
OUT_C = "#JOBNS stage_out source=/tmp/c destination=/stage/c"
OUT_D = "#JOBNS stage_out source=/dev/shm/d destination=/stage/d"


def full_record() -> BbRecord:
    """A record with every field set to something other than its default."""
    return BbRecord(
        job_id="5",
        uid=1001,
        gid=1002,
        user="alice",
        state=STAGE_OUT_FAILED,
        layout="shared",
        no_rm_tmpdir=True,
        size=10 << 20,
        script_header="#!/bin/sh\n#JOBNS shared_tmpdir\n"
        "#JOBNS stage_in source=/s/é destination=/tmp/x",
        comment="jobns: shm capacity=1G; ünïcode",
        work_dir="/home/alice/w",
        job_name="name with spaces",
        array_job_id="4",
        array_task_id="7",
        tmp_mib=2048,
        tree_path="/lustre/jobs/job-5",
        stage_in=[{"source": "/stage/a", "destination": "/lustre/jobs/job-5/tmp/a", "line": IN_A}],
        stage_out=[
            {"source": "/lustre/jobs/job-5/tmp/c", "destination": "/stage/c", "line": OUT_C}
        ],
        stage_in_done=[IN_A],
        stage_out_done=[],
        errors=["'#JOBNS stage_out ...': permission denied"],
    )


def one_line_error(data: bytes, *needles: str) -> str:
    with pytest.raises(JobnsError) as e:
        BbRecord.from_json(data, WHERE)
    text = str(e.value)
    assert "\n" not in text and "\r" not in text, text
    assert WHERE in text, text
    for needle in needles:
        assert needle in text, text
    return text


def record_doc() -> dict[str, object]:
    doc: dict[str, object] = json.loads(full_record().to_json())
    return doc


# ------------------------------------------------------------------------------ record


def test_record_round_trip() -> None:
    record = full_record()
    data = record.to_json()
    assert data.endswith(b"\n")
    doc = json.loads(data)
    assert doc["version"] == VERSION
    assert set(doc) == {"version", *FIELDS}
    again = BbRecord.from_json(data, WHERE)
    assert again == record
    assert again.to_json() == data


def test_defaults_round_trip() -> None:
    record = BbRecord(job_id="9", uid=1000, gid=1000, user="u")
    again = BbRecord.from_json(record.to_json(), WHERE)
    assert again == record
    assert again.state == "set-up" and again.layout == "local" and again.tmp_mib is None
    assert again.stage_in == [] and again.stage_in_done == [] and again.errors == []


def test_every_state_round_trips() -> None:
    for state in STATES:
        record = BbRecord(job_id="1", uid=1, gid=1, user="u", state=state)
        assert BbRecord.from_json(record.to_json(), WHERE).state == state


def test_file_name() -> None:
    assert file_name("77") == "job-77.json"


def test_unknown_field_refused() -> None:
    doc = record_doc()
    doc["frobnicate"] = 1
    one_line_error(json.dumps(doc).encode(), "frobnicate", "not a known field")


def test_unknown_copy_field_refused() -> None:
    doc = record_doc()
    copies = doc["stage_in"]
    assert isinstance(copies, list)
    copies[0]["mode"] = "move"
    one_line_error(json.dumps(doc).encode(), "mode", "not a known field")


def test_copy_without_a_key_refused() -> None:
    for key in COPY_KEYS:
        doc = record_doc()
        copies = doc["stage_out"]
        assert isinstance(copies, list)
        del copies[0][key]
        one_line_error(json.dumps(doc).encode(), key)


@pytest.mark.parametrize("version", [0, 2, "1", None, True])
def test_wrong_version_refused(version: object) -> None:
    doc = record_doc()
    doc["version"] = version
    one_line_error(json.dumps(doc).encode(), "version")


def test_missing_version_refused() -> None:
    doc = record_doc()
    del doc["version"]
    one_line_error(json.dumps(doc).encode(), "version")


def test_newer_version_says_so() -> None:
    doc = record_doc()
    doc["version"] = VERSION + 1
    one_line_error(json.dumps(doc).encode(), f"{VERSION + 1}", "another jobns release")


@pytest.mark.parametrize("state", ["running", "", "SET-UP", "staged-in\nforged line"])
def test_unknown_state_refused(state: str) -> None:
    doc = record_doc()
    doc["state"] = state
    one_line_error(json.dumps(doc).encode(), "unknown state")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("uid", "1001"),
        ("uid", 1.5),
        ("gid", None),
        ("size", "10M"),
        ("tmp_mib", 0),
        ("tmp_mib", "2048"),
        ("job_id", 5),
        ("user", None),
        ("no_rm_tmpdir", "yes"),
        ("stage_in_done", "line"),
        ("stage_in", {"source": "a"}),
        ("errors", [1]),
    ],
)
def test_wrong_types_refused(key: str, value: object) -> None:
    doc = record_doc()
    doc[key] = value
    one_line_error(json.dumps(doc).encode(), key)


def test_missing_field_refused() -> None:
    for key in FIELDS:
        doc = record_doc()
        del doc[key]
        one_line_error(json.dumps(doc).encode(), key)


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"version": 1}'],
)
def test_not_a_record_refused(data: bytes) -> None:
    one_line_error(data)


def test_lines() -> None:
    record = full_record()
    record.stage_in.append({"source": "/x", "destination": "/y", "line": IN_B})
    assert record.lines("stage_in") == frozenset({IN_A, IN_B})
    assert record.lines("stage_out") == frozenset({OUT_C})
    assert BbRecord(job_id="1", uid=1, gid=1, user="u").lines("stage_in") == frozenset()


# ------------------------------------------------------------------------ script header

SCRIPTS = [
    "#!/bin/bash\n#SBATCH -N 2\n#BB_LUA pool=shared capacity=10M\n#JOBNS shared_tmpdir\n"
    f"\n# a comment\n{IN_A}\n{OUT_C}\nsrun hostname\n#JOBNS bogus after the header\necho\n",
    f"#!/bin/sh\n#JOBNS shm capacity=1G\n   \n\t\n{IN_A}\n",  # no command, no final newline
    "#JOBNS no_rm_tmpdir\n#JOBNS tmp capacity=1G\nexit 0\n#JOBNS shm capacity=2G\n",
    "echo first\n#JOBNS shared_tmpdir\n",  # no header at all
    "",
]


@pytest.mark.parametrize("text", SCRIPTS)
def test_script_header_keeps_the_directives(text: str) -> None:
    header = script_header(text)
    assert text.startswith(header)
    full, short = parse_script(text), parse_script(header)
    assert short.present == full.present
    assert short.layout == full.layout and short.no_rm_tmpdir == full.no_rm_tmpdir
    assert (short.shm_capacity, short.tmp_capacity) == (full.shm_capacity, full.tmp_capacity)
    assert short.stage_in == full.stage_in and short.stage_out == full.stage_out
    # The line numbers the header keeps are the script's.
    assert [s.lineno for s in short.stage_in + short.stage_out] == [
        s.lineno for s in full.stage_in + full.stage_out
    ]
    # Warnings about lines after the header stay with the script, never in the header.
    assert all("after the first command" not in w for w in short.warnings)


def test_script_header_stops_at_the_first_command() -> None:
    text = SCRIPTS[0]
    header = script_header(text)
    assert header.endswith(OUT_C)
    assert "srun" not in header and "bogus" not in header
    assert script_header("echo hi\n#JOBNS shared_tmpdir\n") == ""


@pytest.mark.parametrize(
    "text",
    [
        "#!/bin/sh\n#SBATCH -N 1\n\n# note\n#JOBNS bogus\necho\n",
        "#!/bin/sh\n#JOBNS shared_tmpdir\n#JOBNS tmp capacity=2 GiB\nsrun x\n",
        "#!/bin/sh\n#JOBNS\n\n\n\n  #JOBNS tmp capacity=1G\n",
        "#!/bin/sh\n#JOBNS shared_tmpdir\r\n#JOBNS shm capacity=1G\n",
        "#!/bin/sh\n#JOBNS stage_in source=/a\necho\n",
        "\n\n\n\n\n\n\n\n\n#JOBNS shm capacity=1G #JOBNS tmp capacity=1G\n",
    ],
)
def test_script_header_errors_name_the_same_line(text: str) -> None:
    with pytest.raises(DirectiveError) as full:
        parse_script(text)
    with pytest.raises(DirectiveError) as short:
        parse_script(script_header(text))
    assert full.value.lineno is not None
    assert short.value.lineno == full.value.lineno
    assert str(short.value) == str(full.value)
    assert f"script line {full.value.lineno}: " in str(short.value)


# ------------------------------------------------------------- the prolog's staging left


def staging(ins: list[str], outs: list[str], session: str | None = None) -> Staging:
    return Staging(
        session_dir=session,
        stage_in=[Copy(f"/src/{i}", f"/dst/{i}", line) for i, line in enumerate(ins)],
        stage_out=[Copy(f"/src/{i}", f"/dst/{i}", line) for i, line in enumerate(outs)],
    )


def bb_record(ins: list[str], outs: list[str]) -> BbRecord:
    record = BbRecord(job_id="5", uid=1001, gid=1001, user="alice", layout="shared")
    record.stage_in = [{"source": "s", "destination": "d", "line": line} for line in ins]
    record.stage_out = [{"source": "s", "destination": "d", "line": line} for line in outs]
    return record


def test_without_the_burst_buffers_keeps_the_prologs_copies() -> None:
    stg = staging([IN_A, IN_B], [OUT_C, OUT_D])
    left = _without_the_burst_buffers(stg, bb_record([IN_A], [OUT_C]))
    assert left is not None
    assert [c.line for c in left.stage_in] == [IN_B]
    assert [c.line for c in left.stage_out] == [OUT_D]


def test_without_the_burst_buffers_nothing_left() -> None:
    assert _without_the_burst_buffers(staging([IN_A], [OUT_C]), bb_record([IN_A], [OUT_C])) is None


def test_without_the_burst_buffers_keeps_a_session_dir() -> None:
    left = _without_the_burst_buffers(
        staging([IN_A], [OUT_C], session="/sessions/abc"), bb_record([IN_A], [OUT_C])
    )
    assert left is not None and left.session_dir == "/sessions/abc"
    assert left.stage_in == [] and left.stage_out == []


def test_without_the_burst_buffers_matches_lines_by_kind() -> None:
    # A stage_in line is never taken for a stage_out copy of the same text, and back.
    stg = staging([IN_A], [OUT_C])
    left = _without_the_burst_buffers(stg, bb_record([OUT_C], [IN_A]))
    assert left is not None
    assert [c.line for c in left.stage_in] == [IN_A]
    assert [c.line for c in left.stage_out] == [OUT_C]


def test_without_a_record_of_copies_all_is_left() -> None:
    left = _without_the_burst_buffers(staging([IN_A, IN_B], [OUT_C]), bb_record([], []))
    assert left is not None and len(left.stage_in) == 2 and len(left.stage_out) == 1


# ------------------------------------------------------------------------ settings, pools


def test_settings_defaults() -> None:
    s = pools.Settings(Config({}, None))
    assert s.enabled is False
    assert s.granularity == pools.DEFAULT_GRANULARITY == 1 << 20
    assert s.size is None


@pytest.mark.parametrize(
    ("raw", "enabled", "granularity", "size"),
    [
        ({"enabled": True}, True, 1 << 20, None),
        ({"enabled": False, "granularity": "4MiB"}, False, 4 << 20, None),
        ({"granularity": 4096, "size": 1 << 30}, False, 4096, 1 << 30),
        ({"granularity": "1GiB", "size": "10TiB"}, False, 1 << 30, 10 << 40),
        ({"granularity": "1MB", "size": "2.5GiB"}, False, 10**6, 5 << 29),
    ],
)
def test_settings_sizes(
    raw: dict[str, object], enabled: bool, granularity: int, size: int | None
) -> None:
    s = pools.Settings(Config({"shared_base": "/s", "burst_buffer": raw}, "/f"))
    assert (s.enabled, s.granularity, s.size) == (enabled, granularity, size)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"granularity": "1 GiB"}, "[burst_buffer] granularity"),
        ({"granularity": "1gib"}, "[burst_buffer] granularity"),
        ({"granularity": 0}, "[burst_buffer] granularity"),
        ({"granularity": True}, "[burst_buffer] granularity"),
        ({"size": "2N"}, "[burst_buffer] size"),
        ({"size": -1}, "[burst_buffer] size"),
    ],
)
def test_settings_refuse_bad_sizes(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(JobnsError, match="read config /f") as e:
        pools.Settings(Config({"shared_base": "/s", "burst_buffer": raw}, "/f"))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_measure_gives_integers_within_the_size(tmp_path: Path) -> None:
    config = Config(
        {
            "shared_base": str(tmp_path),
            "burst_buffer": {"enabled": True, "granularity": "1MiB", "size": "3MiB"},
        },
        "/f",
    )
    pool = pools.measure(config)
    assert pool["id"] == "shared"
    assert all(isinstance(pool[k], int) for k in ("quantity", "granularity", "free"))
    assert pool["granularity"] == 1 << 20
    assert pool["quantity"] == 3  # the file system is larger than 3 MiB
    free = pool["free"]
    assert isinstance(free, int) and 0 <= free <= 3


def test_measure_without_a_size_is_the_file_system(tmp_path: Path) -> None:
    config = Config({"shared_base": str(tmp_path), "burst_buffer": {"granularity": 4096}}, "/f")
    pool = pools.measure(config)
    quantity, free = pool["quantity"], pool["free"]
    assert isinstance(quantity, int) and isinstance(free, int)
    assert quantity > 0 and 0 <= free <= quantity


def test_measure_names_a_missing_base(tmp_path: Path) -> None:
    config = Config({"shared_base": str(tmp_path / "gone"), "burst_buffer": {}}, "/f")
    with pytest.raises(JobnsError, match="measure shared_base"):
        pools.measure(config)


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[burst_buffer]\nenabled = true\n", "enabled needs shared_base"),
        ('shared_base = ""\n[burst_buffer]\nenabled = true\n', "enabled needs shared_base"),
        ('shared_base = "/s"\n[burst_buffer]\ngranularity = "1gib"\n', "granularity"),
        ('shared_base = "/s"\n[burst_buffer]\ngranularity = "1 GiB"\n', "granularity"),
        ('shared_base = "/s"\n[burst_buffer]\ngranularity = "lots"\n', "granularity"),
        ('shared_base = "/s"\n[burst_buffer]\ngranularity = 0\n', "granularity"),
        ('shared_base = "/s"\n[burst_buffer]\ngranularity = "2N"\n', "granularity"),
        ('shared_base = "/s"\n[burst_buffer]\nsize = "10 TiB"\n', "size"),
        ('shared_base = "/s"\n[burst_buffer]\nsize = true\n', "size"),
        ('shared_base = "/s"\n[burst_buffer]\nenabled = "yes"\n', "enabled"),
        ('shared_base = "/s"\n[burst_buffer]\npool = "x"\n', "pool"),
    ],
)
def test_config_refusals(text: str, needle: str) -> None:
    with pytest.raises(JobnsError, match="read config /f") as e:
        parse_config(text, "/f")
    assert needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_config_accepts_a_burst_buffer() -> None:
    doc = parse_config(
        'shared_base = "/lustre/jobs"\n[burst_buffer]\nenabled = true\n'
        'granularity = "1MiB"\nsize = "100MiB"\n',
        "/f",
    )
    config = Config(doc, "/f")
    assert config.burst_buffer == {"enabled": True, "granularity": "1MiB", "size": "100MiB"}
    s = pools.Settings(config)
    assert (s.enabled, s.granularity, s.size) == (True, 1 << 20, 100 << 20)


def test_config_without_the_section_is_disabled() -> None:
    config = Config(parse_config('shared_base = "/s"\n', "/f"), "/f")
    assert config.burst_buffer == {}
    assert pools.Settings(config).enabled is False


# ------------------------------------------------------------------------------- cli

BB = COMMANDS["bb"]


def test_bb_options_before_the_step() -> None:
    opts, command = parse(
        BB,
        [
            "--job-id",
            "77",
            "--uid=1001",
            "--gid",
            "1002",
            "--script",
            "/var/spool/slurm/hash.7/job.77/script",
            "--size",
            "10485760",
            "--comment",
            "",
            "--work-dir",
            "/home/a",
            "--job-name",
            "x y",
            "--tmp-mib",
            "2048",
            "--array-job-id",
            "70",
            "--array-task-id",
            "7",
            "setup",
        ],
    )
    assert command == ["setup"]
    assert opts["job_id"] == "77" and opts["uid"] == "1001" and opts["gid"] == "1002"
    assert opts["script"] == "/var/spool/slurm/hash.7/job.77/script"
    assert opts["size"] == "10485760" and opts["comment"] == "" and opts["job_name"] == "x y"
    assert opts["work_dir"] == "/home/a" and opts["tmp_mib"] == "2048"
    assert (opts["array_job_id"], opts["array_task_id"]) == ("70", "7")
    assert opts["hurry"] is None and opts["ask_slurm"] is None


def test_bb_flags() -> None:
    opts, command = parse(BB, ["--job-id", "5", "--hurry", "teardown"])
    assert command == ["teardown"] and opts["hurry"] is True
    opts, command = parse(BB, ["--job-id", "5", "--uid", "1", "--ask-slurm", "setup"])
    assert command == ["setup"] and opts["ask_slurm"] is True


def test_bb_options_after_the_step_are_the_command() -> None:
    # Options go before STEP: what follows it is not parsed (commands.bb refuses it).
    _opts, command = parse(BB, ["setup", "--job-id", "5"])
    assert command == ["setup", "--job-id", "5"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--job-id"], "needs a value"),
        (["--hurry=yes", "teardown"], "takes no value"),
        (["--size-bytes", "1", "setup"], "unknown option"),
        (["--directives", "x", "setup"], "unknown option"),
    ],
)
def test_bb_usage_errors(argv: list[str], needle: str) -> None:
    with pytest.raises(JobnsError, match=needle):
        parse(BB, argv)


def test_bb_steps() -> None:
    assert bb.STEPS == ("setup", "data-in", "data-out", "teardown", "pools", "status")


def opts_of(**kw: str | bool | None) -> Options:
    opts, _ = parse(BB, ["status"])
    opts.update(kw)
    return opts


@pytest.mark.parametrize("value", ["5", "0", "4294967295"])
def test_job_id_numbers(value: str) -> None:
    assert bb._job_id(opts_of(job_id=value)) == value


def test_job_id_is_normalised() -> None:
    assert bb._job_id(opts_of(job_id="007")) == "7"


@pytest.mark.parametrize(
    "value",
    ["../x", "1;rm", "1/../2", "-1", "1 ", " 1", "1e3", "0x10", "4294967296", "١٢", "", "5\n"],
)
def test_job_id_refused(value: str) -> None:
    with pytest.raises(JobnsError) as e:
        bb._job_id(opts_of(job_id=value))
    assert "job-id" in str(e.value) and "\n" not in str(e.value)


def test_job_id_required() -> None:
    with pytest.raises(JobnsError, match="--job-id is required"):
        bb._job_id(opts_of())


@pytest.mark.parametrize(("value", "size"), [(None, 0), ("", 0), ("0", 0), ("10485760", 10 << 20)])
def test_size(value: str | None, size: int) -> None:
    assert bb._size(opts_of(size=value)) == size


@pytest.mark.parametrize("value", ["10M", "-1", "1.5", str(1 << 63)])
def test_size_refused(value: str) -> None:
    with pytest.raises(JobnsError, match="--size"):
        bb._size(opts_of(size=value))


def test_info_from_the_options() -> None:
    config = Config({}, None)
    info = bb._info(
        opts_of(
            comment="jobns: shared_tmpdir",
            work_dir="/w",
            job_name="n",
            tmp_mib="2048",
            array_job_id="70",
            array_task_id="3",
        ),
        "77",
        config,
    )
    assert info.comment == "jobns: shared_tmpdir" and info.work_dir == "/w"
    assert info.job_name == "n" and info.tmp_mib == 2048
    assert (info.array_job_id, info.array_task_id) == ("70", "3")


@pytest.mark.parametrize(
    ("job", "task"),
    [("0", "0"), ("70", "4294967294"), ("70", "4294967295"), ("70", ""), (None, None)],
)
def test_info_not_an_array_task(job: str | None, task: str | None) -> None:
    info = bb._info(opts_of(array_job_id=job, array_task_id=task), "77", Config({}, None))
    assert info.array_job_id is None and info.array_task_id is None


@pytest.mark.parametrize("tmp", [None, "", "0"])
def test_info_without_tmp(tmp: str | None) -> None:
    info = bb._info(opts_of(tmp_mib=tmp), "77", Config({}, None))
    assert info.tmp_mib is None and info.comment is None and info.work_dir is None


def test_unknown_field_with_a_line_break_is_one_line() -> None:
    doc = record_doc()
    doc["forged\njobns: all is well"] = 1
    one_line_error(json.dumps(doc).encode(), "not a known field")


@pytest.mark.parametrize("size", [10_000, 2 << 20])
def test_a_huge_word_makes_a_message_of_bounded_size(size: int) -> None:
    """A 2 MiB verb is quoted in the problem: the message stays one short line (it
    becomes a log line, Slurm's job reason, what `jobns bb` writes into a pipe), and keeps
    its end, which says what to do."""
    from jobns.launcher.model.directives import DirectiveError, parse_script

    with pytest.raises(DirectiveError) as caught:
        parse_script("#!/bin/sh\n#JOBNS " + "x" * size + "\n")
    message = str(caught.value)
    assert len(message) < 1000 and "\n" not in message, len(message)
    assert message.startswith("script line 2: '#JOBNS xxx")
    assert message.endswith("known: shm, tmp, shared_tmpdir, no_rm_tmpdir, stage_in, stage_out")
