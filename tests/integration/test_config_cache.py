"""The parsed-config cache that keeps tomllib off the task-launch path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from jobns.launcher.model.config import CACHE_PATH
from tests.conftest import JOBNS, OsUser, Sandbox

pytestmark = pytest.mark.root


def imports_of_run(box: Sandbox, user: OsUser | None) -> str:
    """`-X importtime` of a real `jobns run` (stderr lists every module imported)."""
    cmd = [
        str(Path(JOBNS).parent / "python"),
        "-X",
        "importtime",
        JOBNS,
        "run",
        "--config",
        str(box.config),
        "--job-id",
        "cache",
        "--",
        "true",
    ]
    creds = box.creds(user)
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd="/",
        env=box.env(user, None),
        timeout=60,
        check=False,
        **creds,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return str(r.stderr)


def test_users_task_reads_roots_cache_not_toml(sandbox: Sandbox, users: list[OsUser]) -> None:
    Path(CACHE_PATH).unlink(missing_ok=True)
    assert "tomllib" in imports_of_run(sandbox, None)  # root parses once and caches
    st = os.stat(CACHE_PATH)
    assert st.st_uid == 0 and st.st_mode & 0o022 == 0
    assert "tomllib" not in imports_of_run(sandbox, users[0])  # the user's task does not


def test_changed_file_is_parsed_again(sandbox: Sandbox) -> None:
    imports_of_run(sandbox, None)
    sandbox.config.write_text(sandbox.config.read_text().replace("kill_wait = 2", "kill_wait = -2"))
    r = sandbox.run(["run", "--job-id", "c2", "--", "true"])
    assert r.returncode == 125 and "kill_wait" in r.stderr  # not served from the cache


def test_cache_not_owned_by_root_is_ignored(sandbox: Sandbox, users: list[OsUser]) -> None:
    imports_of_run(sandbox, None)
    os.chown(CACHE_PATH, users[0].uid, users[0].gid)
    try:
        assert "tomllib" in imports_of_run(sandbox, users[0])
    finally:
        Path(CACHE_PATH).unlink(missing_ok=True)
