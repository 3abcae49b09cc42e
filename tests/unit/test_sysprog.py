"""launcher.system.sysprog: root finds its programs in a fixed list of directories, never
through PATH, and runs them with a fixed environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobns.launcher.system import sysprog


def test_a_program_in_usr_sbin_is_found_with_no_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding: mkfs.ext4 lives in /usr/sbin, which a PATH-less search never sees."""
    monkeypatch.delenv("PATH", raising=False)
    found = sysprog.find("mkfs.ext4")
    assert found.startswith(("/usr/sbin/", "/sbin/")) and found.endswith("/mkfs.ext4")
    # The name is kept (mke2fs picks the file system type from it), not its link target.
    assert sysprog.argv(["mkfs.ext4", "-q", "x"]) == [found, "-q", "x"]


def test_path_is_never_searched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "sh"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sysprog.find("sh") in ("/usr/bin/sh", "/bin/sh")


def test_system_directories_come_before_usr_local() -> None:
    assert sysprog.DIRS[:4] == ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
    assert set(sysprog.DIRS[4:]) == {"/usr/local/sbin", "/usr/local/bin"}
    assert ":".join(sysprog.DIRS) == sysprog.PATH


def test_a_missing_program_names_the_directories_and_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(sysprog.NotFound) as e:
        sysprog.find("mkfs.nosuchfs")
    assert isinstance(e.value, OSError)  # every caller's handling of a failed exec applies
    text = str(e.value)
    assert text.startswith("mkfs.nosuchfs: not found in /usr/sbin, /usr/bin, /sbin, /bin")
    assert "root never searches PATH" in text
    monkeypatch.setattr(sysprog, "DIRS", ("/nonexistent",))
    with pytest.raises(sysprog.NotFound, match=r"install xfsprogs$"):
        sysprog.find("mkfs.xfs")
    with pytest.raises(sysprog.NotFound, match=r"slurm-client\) or set \[slurm\] bin_dir$"):
        sysprog.find("squeue")


@pytest.mark.parametrize("name", ["", "bin/sh", "./sh", "../bin/sh"])
def test_relative_paths_are_refused(name: str) -> None:
    with pytest.raises(sysprog.NotFound, match="plain name or an absolute path"):
        sysprog.find(name)


@pytest.mark.skipif(os.geteuid() != 0, reason="root owns the site's directory")
def test_the_sites_slurm_directory_is_searched_first(tmp_path: Path) -> None:
    """[slurm] bin_dir: a Slurm installed elsewhere (or a stand-in a test names)."""
    tmp_path.chmod(0o755)
    (tmp_path / "squeue").write_text("#!/bin/sh\n")
    (tmp_path / "squeue").chmod(0o755)
    assert sysprog.find("squeue", str(tmp_path)) == f"{tmp_path}/squeue"
    assert sysprog.argv(["sh", "-c", "x"], str(tmp_path))[0] in ("/usr/bin/sh", "/bin/sh")
    with pytest.raises(sysprog.NotFound, match=f"not found in {tmp_path}, /usr/sbin"):
        sysprog.find("nosuchprog", str(tmp_path))


def test_an_absolute_name_is_the_sites_own_and_kept() -> None:
    assert sysprog.find("/opt/site/bin/pre-run") == "/opt/site/bin/pre-run"


@pytest.mark.skipif(os.geteuid() != 0, reason="root owns the trusted copy")
def test_a_copy_others_could_replace_is_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)
    bad, good = tmp_path / "bad", tmp_path / "good"
    for d in (bad, good):
        d.mkdir(mode=0o755)
        (d / "prog").write_text("#!/bin/sh\n")
        (d / "prog").chmod(0o755)
    (bad / "prog").chmod(0o777)
    monkeypatch.setattr(sysprog, "DIRS", (str(bad), str(good)))
    assert sysprog.find("prog") == f"{good}/prog"
    good.chmod(0o775)  # a group may replace it
    with pytest.raises(sysprog.NotFound) as e:
        sysprog.find("prog")
    assert f"skipped {bad}/prog ({bad}/prog is uid 0's, mode 0777" in str(e.value)
    assert f"{good} is uid 0's, mode 0775" in str(e.value)


def test_untrusted_reasons(tmp_path: Path) -> None:
    assert sysprog.untrusted("/usr/bin/sh") == ""
    assert sysprog.untrusted(str(tmp_path / "none")) == "missing"
    (tmp_path / "data").write_text("x")
    assert sysprog.untrusted(str(tmp_path / "data")) == "not an executable file"
    assert sysprog.untrusted(str(tmp_path)) == "not an executable file"


def test_the_environment_is_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/home/u/bin")
    monkeypatch.setenv("SQUEUE_FORMAT", "%j")
    monkeypatch.setenv("MKE2FS_CONFIG", "/home/u/mke2fs.conf")
    monkeypatch.setenv("SLURM_CONF", "/run/slurm/conf/slurm.conf")
    assert sysprog.environment() == {"PATH": sysprog.PATH, "LC_ALL": "C"}
    env = sysprog.environment({"HOME": "/h", "PATH": "/x"}, keep=("SLURM_CONF", "UNSET_ONE"))
    assert env == {
        "HOME": "/h",
        "PATH": sysprog.PATH,
        "LC_ALL": "C",
        "SLURM_CONF": "/run/slurm/conf/slurm.conf",
    }
