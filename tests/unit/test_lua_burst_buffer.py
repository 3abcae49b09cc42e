"""jobns/slurm/lua/burst_buffer.lua's functions slurmctld calls itself (no root, lua5.1):
slurm_bb_job_process at submission and slurm_bb_pools every 30 s. Both are pure Lua:
they run with a fake global `slurm` table (SUCCESS, ERROR, log_error, log_info), the
file loaded as Slurm loads it, its installed paths (JOBNS_LUA_DIR, POOLS_FILE) replaced
in the text by this checkout's jobns/slurm/lua and a file of the test's.

A refusal is Slurm's (slurm.ERROR, "jobns: ..."), with the message Python's parser gives
for the same script (tests/unit/test_lua_directives.py holds the two checkers together).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobns.launcher.model.directives import (
    DirectiveError,
    comment_directives,
    parse_directives,
    parse_script,
)

REPO = Path(__file__).resolve().parents[2]
LUA_DIR = REPO / "jobns/slurm/lua"
SOURCE = LUA_DIR / "burst_buffer.lua"
INSTALLED_LUA_DIR = '"/usr/share/jobns/slurm/lua"'
INSTALLED_POOLS = '"/run/jobns/bb/pools.json"'
SUCCESS, ERROR = 0, -1

# argv: the burst_buffer.lua to load, then a call:
#   process SCRIPT          22.05: slurm_bb_job_process(SCRIPT)
#   process-info SCRIPT     24.11: (SCRIPT, uid, gid, job_info), job_info.comment on stdin
#   process-nocomment SCRIPT  24.11 with a job_info that has no comment
#   pools                   slurm_bb_pools()
# Prints the return code, a newline and the message; slurm.log_* lines go to stderr.
DRIVER = r"""
local function logger(level)
    return function(fmt, ...)
        io.stderr:write(level .. ": " .. string.format(fmt, ...) .. "\n")
    end
end
slurm = { SUCCESS = 0, ERROR = -1, log_error = logger("error"), log_info = logger("info") }
local path, call, script = arg[1], arg[2], arg[3]
dofile(path)
local rc, msg
if call == "process" then
    rc, msg = slurm_bb_job_process(script)
elseif call == "process-info" then
    rc, msg = slurm_bb_job_process(script, 1001, 1001, { comment = io.read("*a") })
elseif call == "process-nocomment" then
    rc, msg = slurm_bb_job_process(script, 1001, 1001, {})
elseif call == "pools" then
    rc, msg = slurm_bb_pools()
else
    error("unknown call " .. tostring(call))
end
io.write(tostring(rc), "\n", msg == nil and "<nil>" or tostring(msg))
"""


@dataclass
class Answer:
    rc: int
    message: str | None
    log: str


class BurstBufferLua:
    def __init__(self, interpreter: str, top: Path, pools_file: Path) -> None:
        self.interpreter = interpreter
        self.top = top
        self.pools_file = pools_file
        self.driver = top / "driver.lua"
        self.driver.write_text(DRIVER)
        self.lua = top / "burst_buffer.lua"
        self.load(LUA_DIR)

    def load(self, lua_dir: Path) -> None:
        """Write the file as installed at lua_dir, its pools file the test's."""
        text = SOURCE.read_text()
        for old in (INSTALLED_LUA_DIR, INSTALLED_POOLS):
            assert text.count(old) == 1, f"{SOURCE} no longer says {old} once"
        text = text.replace(INSTALLED_LUA_DIR, json.dumps(str(lua_dir)))
        text = text.replace(INSTALLED_POOLS, json.dumps(str(self.pools_file)))
        self.lua.write_text(text)

    def call(self, call: str, script: Path | None = None, stdin: bytes = b"") -> Answer:
        r = subprocess.run(
            [self.interpreter, str(self.driver), str(self.lua), call]
            + ([str(script)] if script is not None else []),
            input=stdin,
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        rc, _, message = r.stdout.decode().partition("\n")
        return Answer(int(rc), None if message == "<nil>" else message, r.stderr.decode())

    def script(self, text: str | bytes, name: str = "script") -> Path:
        path = self.top / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def process(self, text: str | bytes, comment: str | bytes | None = None) -> Answer:
        """At submission: 22.05 style without comment, 24.11 style with one."""
        path = self.script(text)
        if comment is None:
            return self.call("process", path)
        data = comment if isinstance(comment, bytes) else comment.encode()
        return self.call("process-info", path, data)


@pytest.fixture
def bb(tmp_path: Path) -> BurstBufferLua:
    interpreter = shutil.which("lua5.1")
    if interpreter is None:
        reason = "lua5.1 is not installed (ci/install-system installs it: apt-get install lua5.1)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return BurstBufferLua(interpreter, tmp_path, tmp_path / "pools.json")


def accepted(a: Answer) -> None:
    assert (a.rc, a.message) == (SUCCESS, None), a
    assert "error:" not in a.log, a.log


def refused(a: Answer, *needles: str) -> str:
    assert a.rc == ERROR, a
    assert a.message is not None and a.message.startswith("jobns: "), a
    assert "\n" not in a.message, a.message
    for needle in needles:
        assert needle in a.message, a.message
    return a.message


def python_script_error(text: str) -> str:
    with pytest.raises(DirectiveError) as e:
        parse_script(text)
    return str(e.value)


def python_comment_error(comment: str) -> str:
    with pytest.raises(DirectiveError) as e:
        found = comment_directives(comment)
        assert found is not None
        parse_directives(found, source="--comment")
    return str(e.value)


H = "#!/bin/bash\n#SBATCH -N 2\n"
CAPACITY = "#BB_LUA pool=shared capacity=10M\n"


# ------------------------------------------------------------------ at submission


def test_a_plain_script_is_accepted(bb: BurstBufferLua) -> None:
    accepted(bb.process(H + "#BB_LUA pool=shared\n#JOBNS shm capacity=1G\nsrun x\n"))
    accepted(bb.process(H + "srun x\n"))
    accepted(bb.process(""))


@pytest.mark.parametrize(
    "text",
    [
        H + "#JOBNS bogus\nsrun x\n",
        H + "#BB_LUA pool=shared\n#JOBNS tmp capacity=2 GiB\n",
        H + "\n# note\n#JOBNS stage_in source=/a\n",
        H + "  #JOBNS shm capacity=1G\n",
        H + "#JOBNS shared_tmpdir=sometimes\n",
    ],
)
def test_a_bad_jobns_line_is_refused_with_pythons_message(bb: BurstBufferLua, text: str) -> None:
    message = refused(bb.process(text))
    assert message == "jobns: " + python_script_error(text)
    assert "script line " in message


def test_the_refusal_names_the_line(bb: BurstBufferLua) -> None:
    text = H + CAPACITY + "#JOBNS shared_tmpdir\n#JOBNS\n#JOBNS frob x=1\nsrun x\n"
    refused(bb.process(text), "script line 6: ", "frob")


def test_lines_after_the_first_command_are_not_judged(bb: BurstBufferLua) -> None:
    accepted(bb.process(H + "srun x\n#JOBNS bogus\n#BB_LUA capacity=10G\n"))


@pytest.mark.parametrize(
    "text",
    [
        H + CAPACITY + "srun x\n",
        H + CAPACITY + "#JOBNS shm capacity=1G\nsrun x\n",
        H + CAPACITY + "#JOBNS shared_tmpdir=per-node\nsrun x\n",
        H + CAPACITY + "#JOBNS shared_tmpdir=no\nsrun x\n",
        H + "#JOBNS shared_tmpdir=per-node\n" + CAPACITY + "srun x\n",
        H + "#BB_LUA capacity=1G pool=shared\n#JOBNS tmp capacity=1G\n",
        H + "# JOBNS shared_tmpdir\n" + CAPACITY,  # a comment, not a directive
        H + CAPACITY + "srun x\n#JOBNS shared_tmpdir\n",  # after the header: not applied
        # the word inside a path, or in a remark: not the verb
        H + CAPACITY + "#JOBNS stage_in source=/data/shared_tmpdir destination=/tmp/a\n",
        H + CAPACITY + "#JOBNS shared_tmpdir=per-node # not shared_tmpdir\n",
    ],
)
def test_capacity_without_the_shared_layout_is_refused(bb: BurstBufferLua, text: str) -> None:
    refused(bb.process(text), "capacity=", "'#JOBNS shared_tmpdir'")
    refused(bb.process(text, comment=""), "capacity=", "'#JOBNS shared_tmpdir'")


@pytest.mark.parametrize(
    "text",
    [
        H + CAPACITY + "#JOBNS shared_tmpdir\nsrun x\n",
        H + "#JOBNS shared_tmpdir\n" + CAPACITY + "srun x\n",
        H + CAPACITY + "#JOBNS shared_tmpdir=yes\n",
        H + CAPACITY + "#JOBNS shared_tmpdir # the job's space\n#JOBNS no_rm_tmpdir\n",
        H + CAPACITY + "#JOBNS shared_tmpdir\n#JOBNS stage_in source=/a destination=/tmp/a\n",
    ],
)
def test_capacity_with_the_shared_layout_is_accepted(bb: BurstBufferLua, text: str) -> None:
    accepted(bb.process(text))
    accepted(bb.process(text, comment="an ordinary comment"))


def test_a_bb_lua_line_without_capacity_needs_no_shared_layout(bb: BurstBufferLua) -> None:
    accepted(bb.process(H + "#BB_LUA pool=shared\n#JOBNS shared_tmpdir=per-node\n"))


# ------------------------------------------------------------- the comment (24.11 and later)


@pytest.mark.parametrize(
    "comment",
    [
        "jobns: bogus",
        "jobns: tmp capacity=2 GiB",
        "JOBNS: shm capacity=1G",
        "jobns shm capacity=1G",
    ],
)
def test_a_bad_comment_is_refused_with_pythons_message(bb: BurstBufferLua, comment: str) -> None:
    message = refused(bb.process(H + "srun x\n", comment=comment))
    assert message == "jobns: " + python_comment_error(comment)


def test_the_comment_is_not_judged_without_job_info(bb: BurstBufferLua) -> None:
    # 22.05 passes no job_info: the comment is judged by `jobns bb setup` instead.
    accepted(bb.process(H + "srun x\n"))
    accepted(bb.call("process-nocomment", bb.script(H + "srun x\n")))


def test_an_ordinary_comment_is_accepted(bb: BurstBufferLua) -> None:
    accepted(bb.process(H + "#JOBNS shm capacity=1G\n", comment="testing jobns today"))
    accepted(bb.process(H + "srun x\n", comment="jobns: shm capacity=1G"))


def test_the_comment_may_give_the_shared_layout(bb: BurstBufferLua) -> None:
    accepted(bb.process(H + CAPACITY + "srun x\n", comment="jobns: shared_tmpdir"))
    accepted(bb.process(H + CAPACITY + "srun x\n", comment="run 5; jobns: shared_tmpdir=yes"))


def test_the_comment_per_node_layout_is_refused_with_capacity(bb: BurstBufferLua) -> None:
    refused(
        bb.process(H + CAPACITY + "srun x\n", comment="jobns: shared_tmpdir=per-node"),
        "capacity=",
    )


def test_a_bad_comment_is_reported_before_the_script(bb: BurstBufferLua) -> None:
    message = refused(bb.process(H + "#JOBNS bogus\n", comment="jobns: frob"))
    assert "--comment" in message and "frob" in message


def test_an_unreadable_script_is_not_refused(bb: BurstBufferLua) -> None:
    # slurmctld gave a path that is gone: nothing to judge (setup judges in full).
    accepted(bb.call("process", bb.top / "no-such-script"))


def test_a_broken_install_takes_the_job_and_logs(bb: BurstBufferLua) -> None:
    bb.load(bb.top / "not-installed")
    a = bb.process(H + "#JOBNS bogus\n")
    assert (a.rc, a.message) == (SUCCESS, None), a
    assert "error: jobns: cannot load" in a.log and "jobns_directives.lua" in a.log, a.log


# ---------------------------------------------------------------------------- pools


def integers_only(pool: dict[str, object]) -> None:
    for key in ("quantity", "granularity", "free"):
        value = pool[key]
        assert isinstance(value, int) and not isinstance(value, bool), (key, value)


def test_pools_before_the_first_measurement(bb: BurstBufferLua) -> None:
    """No pool yet (never measured, or [burst_buffer] not enabled): Slurm then refuses a
    job that asks for one at sbatch (an unknown pool) rather than keep it waiting."""
    assert not bb.pools_file.exists()
    a = bb.call("pools")
    assert a.rc == SUCCESS and a.message is not None, a
    assert json.loads(a.message) == {"pools": []}


def test_pools_of_an_empty_file(bb: BurstBufferLua) -> None:
    bb.pools_file.write_text("")
    a = bb.call("pools")
    assert a.rc == SUCCESS and a.message is not None
    assert json.loads(a.message) == {"pools": []}


def test_pools_gives_the_measured_file(bb: BurstBufferLua) -> None:
    text = (
        json.dumps(
            {"pools": [{"free": 60, "granularity": 1048576, "id": "shared", "quantity": 100}]},
            sort_keys=True,
        )
        + "\n"
    )
    bb.pools_file.write_text(text)
    a = bb.call("pools")
    assert (a.rc, a.message) == (SUCCESS, text)
    doc = json.loads(text)
    integers_only(doc["pools"][0])
