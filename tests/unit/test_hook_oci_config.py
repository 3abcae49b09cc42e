"""`jobns oci-config`'s rewrite and the shipped hooks.d files (no root)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from jobns.hook.oci_config import MOUNT_OPTIONS, hook_entries, rewrite
from tests.conftest import REPO
from tests.schemas import SCHEMAS, first_error

HOOKS_D = REPO / "jobns" / "hook" / "hooks.d"
BINDS = [("/tmp", "/b/job-1/tmp"), ("/var/tmp", "/b/job-1/var_tmp"), ("/dev/shm", "/s/job-1")]
ENV = {"TMPDIR": "/tmp", "JOBNS_JOB_ID": "1"}


def spec() -> dict[str, Any]:
    """What `runc spec` writes, abridged, plus a mount under /tmp."""
    return {
        "process": {"args": ["sh"], "env": ["PATH=/bin", "TMPDIR=/elsewhere"]},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
            {"destination": "/tmp/.X11-unix", "type": "bind", "source": "/tmp/.X11-unix"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        ],
    }


def test_rewrite_replaces_mounts_env_and_adds_hooks() -> None:
    hooks = hook_entries("/opt/jobns/venv/bin/jobns", "/etc/x.toml")
    doc = spec()
    new: Any = rewrite(doc, BINDS, ENV, {"org.jobns.job-id": "1"}, hooks)
    assert doc == spec()  # pure: the input is untouched
    dests = [m["destination"] for m in new["mounts"]]
    # runc's own /dev/shm tmpfs is gone; /tmp comes before the mount beneath it.
    assert dests == ["/proc", "/dev", "/tmp", "/tmp/.X11-unix", "/sys", "/var/tmp", "/dev/shm"]
    ours = {
        m["destination"]: m
        for m in new["mounts"]
        if m["type"] == "bind" and m["destination"] != "/tmp/.X11-unix"
    }
    assert ours["/dev/shm"] == {
        "destination": "/dev/shm",
        "type": "bind",
        "source": "/s/job-1",
        "options": MOUNT_OPTIONS,
    }
    assert new["process"]["env"] == ["PATH=/bin", "TMPDIR=/tmp", "JOBNS_JOB_ID=1"]
    assert new["annotations"] == {"org.jobns.job-id": "1"}
    assert new["hooks"]["createRuntime"] == [
        {
            "path": "/opt/jobns/venv/bin/jobns",
            "args": ["jobns", "hook", "--config", "/etc/x.toml", "createRuntime"],
        }
    ]
    assert "poststop" not in new["hooks"]  # one stage: the holder notices the exit
    # Idempotent: a second run changes nothing.
    assert rewrite(new, BINDS, ENV, {"org.jobns.job-id": "1"}, hooks) == new


def test_rewrite_without_hooks_for_prolog_jobs() -> None:
    new = rewrite(spec(), BINDS, ENV, {}, None)
    assert "hooks" not in new


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"mounts": {}}, "mounts is not a list"),
        ({"hooks": []}, "hooks is not an object"),
        ({"hooks": {"createRuntime": {}}}, "hooks.createRuntime is not a list"),
    ],
)
def test_rewrite_refuses_malformed_bundles(doc: dict[str, Any], needle: str) -> None:
    from jobns.launcher.system.errors import JobnsError

    with pytest.raises(JobnsError, match=needle):
        rewrite(doc, BINDS, ENV, {}, hook_entries("/j", None))


@pytest.mark.parametrize("path", sorted(HOOKS_D.glob("*.json")), ids=lambda p: p.name)
def test_shipped_hooks_d_files_are_valid(path: Path) -> None:
    doc = json.loads(path.read_text())
    schema = SCHEMAS["hooks-d.schema.json"]
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert first_error(doc, schema) is None
    # The stage is passed in args too (a runtime's status alone is ambiguous: crun says
    # "created" where runc says "creating").
    assert doc["hook"]["args"][:2] == ["jobns", "hook"]
    assert doc["hook"]["args"][-1:] == doc["stages"]
    assert doc["hook"]["path"] == "/opt/jobns/venv/bin/jobns"


def test_hooks_d_is_one_stage() -> None:
    """createRuntime only: the holder notices the container's exit (poststop is still
    accepted from an older hooks.d file, tests/integration/test_hook.py)."""
    stages = sorted(s for p in HOOKS_D.glob("*.json") for s in json.loads(p.read_text())["stages"])
    assert stages == ["createRuntime"]


@pytest.mark.parametrize(
    ("doc", "ok"),
    [
        (
            {
                "version": "1.0.0",
                "hook": {"path": "/x"},
                "when": {"always": True},
                "stages": ["prestart"],
            },
            True,
        ),
        ({"version": "1.0.0", "hook": {"path": "x"}, "when": {}, "stages": ["prestart"]}, False),
        ({"version": "1.0.0", "hook": {"path": "/x"}, "when": {}, "stages": []}, False),
        ({"version": "1.0.0", "hook": {"path": "/x"}, "when": {}, "stages": ["later"]}, False),
        ({"version": "2", "hook": {"path": "/x"}, "when": {}, "stages": ["poststop"]}, False),
        (
            {
                "version": "1.0.0",
                "hook": {"path": "/x", "argv": []},
                "when": {},
                "stages": ["poststop"],
            },
            False,
        ),
    ],
)
def test_hooks_d_schema(doc: dict[str, Any], ok: bool) -> None:
    schema = SCHEMAS["hooks-d.schema.json"]
    assert jsonschema.Draft202012Validator(schema).is_valid(doc) == ok
    assert (first_error(doc, schema) is None) == ok
