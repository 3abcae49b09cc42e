"""launcher.mountns.cdi's pure parts: the spec of a job, device names, settings."""

from __future__ import annotations

from typing import Any

import pytest

from jobns.launcher.model.config import Config
from jobns.launcher.mountns import cdi


def test_build_one_device_of_our_kind() -> None:
    c = cdi.CdiConfig(Config({"cdi": {"dir": "/var/run/cdi"}}, None))
    doc = cdi.build(
        c,
        "42",
        [("/tmp", "/tmp/job-42/tmp"), ("/dev/shm", "/dev/shm/job-42")],
        {"TMPDIR": "/tmp"},
        ["/opt/j/bin/jobns", "hook", "--job-id", "42", "createRuntime"],
    )
    assert doc == {
        "cdiVersion": "0.5.0",
        "kind": "jobns.dev/job",
        "devices": [
            {
                "name": "42",
                "containerEdits": {
                    "env": ["TMPDIR=/tmp"],
                    "mounts": [
                        {
                            "hostPath": "/tmp/job-42/tmp",
                            "containerPath": "/tmp",
                            "type": "bind",
                            "options": ["rbind", "nosuid", "nodev"],
                        },
                        {
                            "hostPath": "/dev/shm/job-42",
                            "containerPath": "/dev/shm",
                            "type": "bind",
                            "options": ["rbind", "nosuid", "nodev"],
                        },
                    ],
                    "hooks": [
                        {
                            "hookName": "createRuntime",
                            "path": "/opt/j/bin/jobns",
                            "args": ["jobns", "hook", "--job-id", "42", "createRuntime"],
                        }
                    ],
                },
            }
        ],
    }
    bare: Any = cdi.build(c, "42", [], {}, None)
    assert "hooks" not in bare["devices"][0]["containerEdits"]


def test_settings() -> None:
    assert cdi.settings(Config({}, None)) is None  # off unless a directory is configured
    c = cdi.settings(
        Config({"cdi": {"dir": "/etc/cdi/", "version": "1.0.0", "owner_check": False}}, None)
    )
    assert c is not None and (c.dir, c.version, c.owner_check) == ("/etc/cdi", "1.0.0", False)


@pytest.mark.parametrize(
    ("job_id", "ok"),
    [
        ("42", True),
        ("42_1.array:3-x", True),
        ("a", True),
        ("", False),
        ("_x", False),
        (".x", False),
        ("-x", False),
        ("a/b", False),
        ("é", False),
    ],
)
def test_device_names(job_id: str, ok: bool) -> None:
    assert cdi.device_name_ok(job_id) is ok
