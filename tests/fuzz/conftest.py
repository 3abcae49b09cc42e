"""The fuzz campaign's sandbox (bases, state and bundles of its own) and its tally."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import overload

import pytest

from tests.fuzz.support import EXAMPLES, LONG, SESSION_ROOT, STAGE_ROOT, TRIED

FUZZ_ROOT = Path("/var/lib/jobns-fuzz")


class FuzzBox:
    """Bases, a state directory, configs, scripts and an OCI bundle in one directory of
    this session, so that nothing the fuzzed commands do reaches /tmp or /run/jobns."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.local = root / "local"
        self.shared = root / "shared"
        self.shm = root / "shm"
        self.state = root / "state"
        self.stage = root / "stage"
        self.sessions = root / "sessions"
        # [arc] scratchdir may not lie under /tmp (config.py refuses it), where a non-root
        # run's box is: then it names a directory that is never made (only setup --dry-run
        # and pure planning read it).
        self.scratch = FUZZ_ROOT / root.name / "scratch"
        self.cwd = root / "cwd"  # the fuzzed commands' working directory (empty)
        self.files = root / "files"  # scripts and configs written per example
        self.bundle = root / "bundle"
        made = [self.scratch] if self.scratch.is_relative_to(root) else []
        for d in (
            self.local,
            self.shared,
            self.shm,
            self.stage,
            self.sessions,
            *made,
            self.cwd,
            self.files,
        ):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o1777)
        self.state.mkdir(mode=0o755, exist_ok=True)
        (self.bundle / "rootfs").mkdir(parents=True, exist_ok=True)
        self.bundle.chmod(0o755)
        (self.bundle / "config.json").write_text(
            json.dumps(
                {
                    "ociVersion": "1.0.2",
                    "root": {"path": "rootfs"},
                    "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin"]},
                }
            )
        )
        self.config = root / "jobns.toml"
        self.config.write_text(
            f'local_base = "{self.local}"\nshm_base = "{self.shm}"\n'
            f'shared_base = "{self.shared}"\nstate_dir = "{self.state}"\nkill_wait = 1\n'
        )
        self.rich = root / "rich.toml"  # staging, capacities and ARC: more code reached
        self.rich.write_text(
            self.config.read_text()
            + f'[arc]\nscratchdir = "{self.scratch}"\nshared_filesystem = true\n'
            f'[capacity]\ngranularity = "1MiB"\nshm_max = "1GiB"\ntmp_max = "4GiB"\n'
            f'[directives]\nword = "JOBNS"\n'
            f'[staging]\nstage_roots = ["{self.stage}"]\nsession_roots = ["{self.sessions}"]\n'
            f'session_dir = "%d"\n'
        )
        for f in (self.config, self.rich):
            f.chmod(0o644)
        root.chmod(0o755)

    @property
    def configs(self) -> list[str]:
        """The configs every command may use, side effects included (all in the box)."""
        return [str(self.config), str(self.rich)]

    def paths(self) -> list[str]:
        return [
            str(p)
            for p in (
                self.local,
                self.shared,
                self.shm,
                self.state,
                self.stage,
                self.sessions,
                self.scratch,
            )
        ]

    @overload
    def place(self, text: str) -> str: ...

    @overload
    def place(self, text: None) -> None: ...

    def place(self, text: str | None) -> str | None:
        """text with the strategies' placeholder roots replaced by this box's."""
        if text is None:
            return None
        return text.replace(STAGE_ROOT, str(self.stage)).replace(SESSION_ROOT, str(self.sessions))

    def write(self, name: str, data: bytes | str) -> str:
        path = self.files / name
        path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
        path.chmod(0o644)
        return str(path)


@pytest.fixture(scope="session")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzBox]:
    if os.geteuid() == 0:
        # Not under /tmp (a job's /tmp hides it) and readable by the test user.
        FUZZ_ROOT.mkdir(mode=0o755, exist_ok=True)
        FUZZ_ROOT.chmod(0o755)
        root = FUZZ_ROOT / uuid.uuid4().hex[:12]
        root.mkdir()
    else:
        root = tmp_path_factory.mktemp("jobns-fuzz")
    fb = FuzzBox(root)
    yield fb
    if os.geteuid() == 0:
        # setup/teardown/gc/hook make state_dir a private bind mount of itself.
        subprocess.run(["umount", "-R", "-l", str(fb.state)], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    profile = "long" if LONG else "ci"
    terminalreporter.write_sep(
        "-",
        f"jobns fuzz: inputs tried per target ({profile} "
        f"profile, {EXAMPLES} examples per property)",
    )
    for target, n in sorted(TRIED.items()):
        terminalreporter.write_line(f"fuzz {target}: {n} inputs")
    terminalreporter.write_line(f"fuzz total: {sum(TRIED.values())} inputs")


def pytest_sessionfinish(session: pytest.Session) -> None:
    report = os.environ.get("JOBNS_FUZZ_REPORT")
    if report and TRIED:
        with open(report, "w") as f:
            json.dump(dict(TRIED), f)
