"""`jobns doctor`'s checks of settings it used to call ok although every prolog then
fails (and the node drains): a base the job user cannot enter in the voluntary mode, a
missing mkfs for a disk backing, a refused scratch_base, the site's programs, and a
Prolog that runs jobns by name when slurmd gives it no PATH."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobns.launcher.commands import doctor
from jobns.launcher.commands.doctor import capacity, executables, node, scripts
from jobns.launcher.model.config import Config, parse
from jobns.launcher.system import sysprog

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the directories must be root's")


@pytest.fixture
def where() -> Iterator[Path]:
    """A directory every user may reach (pytest's own tmp_path is under a 0700 one)."""
    d = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="jobns-doctor-"))
    d.chmod(0o755)
    yield d
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(d)


def cfg(text: str) -> Config:
    return Config(parse(text, "/t.toml"), "/t.toml")


def kinds(found: list[tuple[str, str]]) -> list[str]:
    return [k for k, _ in found]


@pytest.mark.parametrize(
    ("top", "base", "problem"),
    [
        (0o755, 0o755, ""),
        (0o711, 0o755, ""),
        (0o755, 0o1777, ""),
        (0o755, 0o700, "may not read and search {base} (uid"),
        (0o755, 0o711, "may not read and search {base}"),
        (0o700, 0o755, "may not search {top} "),
    ],
)
def test_a_base_the_job_user_cannot_enter(where: Path, top: int, base: int, problem: str) -> None:
    """The voluntary mode's namespace holder opens the base as the job user: search on
    every directory above it, read and search on it (launcher.backing.fs.reopen)."""
    t = where / "top"
    b = t / "base"
    b.mkdir(parents=True)
    t.chmod(top)
    b.chmod(base)
    found = node.reachable("[[dirs]] base of /x:", str(b), enforce=False)
    # Covered in the job's namespace (every base outside the job's mount points): only
    # the directories above it are looked up as the job user.
    covered = node.reachable("[[dirs]] base of /x:", str(b), enforce=False, covered=True)
    assert (covered != []) == (top & 0o001 == 0), covered
    if not problem:
        assert found == []
    else:
        ((kind, text),) = found
        assert kind == "problem" and problem.format(base=b, top=t) in text, text
        assert "every job's prolog fails and the node drains" in text
        assert f"fix: chmod o+{'rx' if problem.startswith('may not read') else 'x'} " in text
    assert node.reachable("local_base", str(b), enforce=True) == []  # root makes it


def test_a_base_reached_through_a_symbolic_link(where: Path) -> None:
    hidden = where / "hidden"
    (hidden / "base").mkdir(parents=True)
    hidden.chmod(0o700)
    (where / "link").symlink_to(hidden)
    ((_, text),) = node.reachable("local_base", str(where / "link" / "base"), False)
    assert f"may not search {hidden} " in text


def test_mkfs_for_a_disk_backing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert executables.disk_programs(cfg("")) == []
    found = executables.disk_programs(cfg('[capacity]\ntmp_backing = "disk"\n'))
    assert kinds(found) == ["ok"] and "mkfs.ext4 is /" in found[0][1]
    monkeypatch.setattr(sysprog, "DIRS", ("/nonexistent",))
    text = '[[dirs]]\npath = "/scratch"\nbase = "/b"\nbacking = "disk"\nsize = "1GiB"\n'
    ((kind, line),) = executables.disk_programs(cfg(text + '[capacity]\nfs_type = "xfs"\n'))
    assert kind == "problem" and "mkfs.xfs (for [[dirs]] /scratch)" in line
    assert "install xfsprogs" in line


@needs_root
def test_scratch_base_others_may_write(where: Path) -> None:
    base = where / "scratch"
    text = f'[capacity]\ntmp_backing = "disk"\nscratch_base = "{base}"\n'
    assert kinds(capacity.scratch_base(cfg(text))) == ["ok"]  # made by setup
    base.mkdir(mode=0o700)
    assert kinds(capacity.scratch_base(cfg(text))) == ["ok"]
    base.chmod(0o777)
    ((kind, line),) = capacity.scratch_base(cfg(text))
    assert kind == "problem" and f"chmod go-w {base}" in line
    assert capacity.scratch_base(cfg("")) == []


@needs_root
def test_the_sites_programs(where: Path) -> None:
    prog = where / "pre"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    text = f'[lifecycle]\npre_run = "{prog} --x"\npost_run = "/bin/true"\n'
    arc = '[arc]\nmovetool = "cp -a"\n'
    found = executables.programs(cfg(text + arc))
    assert kinds(found) == ["ok"] * 3, found
    assert found[2][1] in ("[arc] movetool: /usr/bin/cp", "[arc] movetool: /bin/cp")
    prog.chmod(0o757)  # anyone may rewrite what root runs
    ((kind, line), *_) = executables.programs(cfg(text))
    assert kind == "problem" and "others than root could replace" in line
    prog.unlink()
    ((kind, line), *_) = executables.programs(cfg(text))
    assert kind == "problem" and f"{prog}: no such file" in line
    ((kind, line),) = executables.programs(cfg('[arc]\nmovetool = "nosuchtool -a"\n'))
    assert kind == "problem" and "nosuchtool: not found in /usr/sbin" in line


def test_a_prolog_that_runs_jobns_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysprog, "DIRS", ("/nonexistent",))  # no jobns in a shell's default
    by_name, by_path = tmp_path / "p1", tmp_path / "p2"
    by_name.write_text('#!/bin/sh\n# jobns setup, by name\nexec jobns setup --job-id "$X"\n')
    by_path.write_text("#!/bin/sh\nexec /opt/jobns/venv/bin/jobns teardown\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"Prolog={by_name}\nEpilog={by_path}\n")
    ((kind, line),) = scripts.scripts_by_name(str(conf))
    assert kind == "problem" and f"Prolog={by_name} runs 'jobns' by name" in line
    assert "slurmd gives it no PATH" in line
    conf.write_text(f"Prolog={by_path}\nEpilog={by_path}\n")
    assert scripts.scripts_by_name(str(conf)) == []
    assert scripts.scripts_by_name(str(tmp_path / "none.conf")) == []


def test_slurms_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    assert executables.slurm_commands(cfg(""), str(conf)) == []  # not a Slurm node, no option
    conf.write_text("ClusterName=x\n")
    text = '[capacity]\ntmp_from_slurm = "scontrol"\n'
    monkeypatch.setattr(sysprog, "DIRS", ("/nonexistent",))
    found = executables.slurm_commands(cfg(text), str(conf))
    assert kinds(found) == ["problem"], found  # tmp_from_slurm asks squeue (gc does too)
    assert "squeue: not found in /nonexistent" in found[0][1]
    assert "set [slurm] bin_dir" in found[0][1] and "tmp_from_slurm" in found[0][1]
    found = executables.slurm_commands(cfg(""), str(conf))
    assert kinds(found) == ["note"] and "jobns gc needs squeue" in found[0][1], found


def test_a_node_is_told_whether_its_prolog_returns_at_once(tmp_path: Path) -> None:
    """tasks-wait (made by slurmd loading the plugin) decides what the packaged prolog
    does, the helper's pid file whether a Python is waiting for the work; doctor says
    which, how to get the fast one, and that a marker without the plugin is a problem."""
    marker, helper = scripts.prolog_waits(str(tmp_path), plugin_loaded=True)
    assert marker[0] == doctor.NOTE and "restart slurmd" in marker[1], marker
    assert helper[0] == doctor.NOTE and "jobns-helper.service" in helper[1], helper
    assert len(scripts.prolog_waits(str(tmp_path), plugin_loaded=False)) == 1  # voluntary
    (tmp_path / "tasks-wait").touch()
    [stale, _] = scripts.prolog_waits(str(tmp_path), plugin_loaded=False)
    assert stale[0] == doctor.PROBLEM and f"rm {tmp_path}/tasks-wait" in stale[1], stale
    (tmp_path / "helper").mkdir()
    (tmp_path / "helper" / "pid").write_text(f"{os.getpid()}\n")
    marker, helper = scripts.prolog_waits(str(tmp_path), plugin_loaded=True)
    assert marker[0] == doctor.OK and "returns at once" in marker[1], marker
    assert helper[0] == doctor.OK and str(os.getpid()) in helper[1], helper
