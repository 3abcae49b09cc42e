"""ci/deb-suffix: the Debian version suffix ci/build-deb gives each release's packages,
so that one apt repository holds them all and a release upgrade upgrades them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "deb-suffix"


def suffix(tmp_path: Path, text: str, **env: str) -> subprocess.CompletedProcess[str]:
    osr = tmp_path / "os-release"
    osr.write_text(text)
    environ = {k: v for k, v in os.environ.items() if k != "JOBNS_DEB_SUFFIX"} | env
    return subprocess.run(
        [str(SCRIPT), str(osr)], capture_output=True, text=True, env=environ, check=False
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n', "~deb12u1"),
        ('ID=debian\nVERSION_ID="13"\nVERSION_CODENAME=trixie\n', "~deb13u1"),
        # testing has no VERSION_ID: the codename says which stable it will be
        (
            'PRETTY_NAME="Debian GNU/Linux forky/sid"\nID=debian\nVERSION_CODENAME=forky\n',
            "~deb14u1",
        ),
        ('ID=ubuntu\nVERSION_ID="24.04"\n', "~ubuntu24.04.1"),
    ],
)
def test_the_release_suffix(tmp_path: Path, text: str, want: str) -> None:
    r = suffix(tmp_path, text)
    assert (r.returncode, r.stdout) == (0, want + "\n"), r.stderr


def test_versions_sort_by_release_and_before_the_bare_version() -> None:
    def older(a: str, b: str) -> bool:
        return (
            subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode == 0
        )

    assert older("0.1.0~deb12u1", "0.1.0~deb13u1")
    assert older("0.1.0~deb13u1", "0.1.0~deb14u1")
    assert older("0.1.0~deb14u1", "0.1.0")


def test_an_unknown_release_must_be_named(tmp_path: Path) -> None:
    r = suffix(tmp_path, "ID=debian\nVERSION_CODENAME=sid\n")
    assert r.returncode == 1 and "set JOBNS_DEB_SUFFIX" in r.stderr
    r = suffix(tmp_path, "ID=debian\nVERSION_CODENAME=sid\n", JOBNS_DEB_SUFFIX="~deb15u1")
    assert r.stdout == "~deb15u1\n"
    r = suffix(tmp_path, "ID=fedora\n")
    assert r.returncode == 1 and "neither Debian nor Ubuntu" in r.stderr
    r = suffix(tmp_path, "ID=fedora\n", JOBNS_DEB_SUFFIX="bad suffix")
    assert r.returncode == 1 and "not a Debian version suffix" in r.stderr
