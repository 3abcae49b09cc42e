"""`jobns doctor`'s checks that need no root: kernel settings read from a fake
/proc/sys, slurm.conf and plugstack.conf parsing, the CDI directory's owner."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from jobns.launcher.commands import doctor
from jobns.launcher.commands.doctor import (
    capacity,
    executables,
    host,
    scripts,
    slurmconf,
    spank_plugin,
)


def proc(tmp_path: Path, **values: int) -> str:
    for name, value in values.items():
        path = tmp_path / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return str(tmp_path)


def kinds(found: list[tuple[str, str]]) -> list[str]:
    return [k for k, _ in found]


def test_user_namespaces_enabled(tmp_path: Path) -> None:
    found = host.kernel(
        proc(tmp_path, user__max_user_namespaces=15000, kernel__unprivileged_userns_clone=1)
    )
    assert kinds(found) == ["ok", "ok"]


def test_user_namespaces_off_is_a_problem_naming_the_sysctl(tmp_path: Path) -> None:
    found = host.kernel(
        proc(
            tmp_path,
            user__max_user_namespaces=0,
            kernel__unprivileged_userns_clone=0,
            kernel__apparmor_restrict_unprivileged_userns=1,
        )
    )
    assert kinds(found) == ["problem"] * 3
    text = " ".join(t for _, t in found)
    for needle in (
        "sysctl -w user.max_user_namespaces=15000",
        "sysctl -w kernel.unprivileged_userns_clone=1",
        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
    ):
        assert needle in text


def test_a_kernel_without_user_namespaces(tmp_path: Path) -> None:
    assert kinds(host.kernel(str(tmp_path))) == ["problem"]


def test_no_loop_control(tmp_path: Path) -> None:
    """A problem where a disk backing needs loop devices (tests/unit/test_doctor_verdict.py
    has the note where nothing does)."""
    users = ['[capacity] tmp_backing = "disk"']
    (found,) = capacity.loop_devices(str(tmp_path), users)
    assert found[0] == "problem" and "modprobe loop" in found[1]
    (tmp_path / "loop-control").write_text("")
    assert kinds(capacity.loop_devices(str(tmp_path), users)) == ["problem"]


def test_slurm_conf_keys_includes_and_comments(tmp_path: Path) -> None:
    (tmp_path / "extra.conf").write_text("Epilog=/x/epilog  # the epilog\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "# Prolog=/not/this\nProlog=/x/prolog\ninclude extra.conf\n"
        "PlugStackConfig=/x/plugstack.conf\nNodeName=a CPUs=2\n"
    )
    values = slurmconf.slurm_conf_values(str(conf))
    assert values["prolog"] == "/x/prolog" and values["epilog"] == "/x/epilog"
    assert values["plugstackconfig"] == "/x/plugstack.conf"


def test_no_slurm_conf_is_a_note(tmp_path: Path) -> None:
    assert kinds(scripts.slurm(str(tmp_path / "slurm.conf"))) == ["note"]


def test_spank_plugin_named_but_missing(tmp_path: Path) -> None:
    so = tmp_path / "jobns_spank.so"
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "jobns.conf").write_text(f"required {so} arg=1\n")
    stack = tmp_path / "plugstack.conf"
    stack.write_text(f"optional /usr/lib/other.so\ninclude {tmp_path}/plugstack.conf.d/*.conf\n")
    (found,) = spank_plugin.spank(str(stack), enforce=True)
    assert found[0] == "problem" and str(so) in found[1]
    so.write_bytes(b"\x7fELF")
    (found,) = spank_plugin.spank(str(stack), enforce=True)
    assert found[0] == "ok"
    # The plugin without [slurm] enforce = true fails every task.
    assert kinds(spank_plugin.spank(str(stack), enforce=False)) == ["problem", "ok"]
    stack.write_text("optional /usr/lib/other.so\n")
    assert kinds(spank_plugin.spank(str(stack))) == ["note"]
    # enforce without the plugin: no task would enter the job's (root's) namespace.
    (found,) = spank_plugin.spank(str(stack), enforce=True)
    assert found[0] == "problem" and "enforce" in found[1]


def built_plugin(tmp_path: Path, version: int) -> Path:
    """A shared object with the symbols SPANK_PLUGIN() defines, plugin_version as the
    headers of Slurm `version` (SLURM_VERSION_NUMBER, 0xMMmmpp) would set it."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed (ci/build-spank installs it)")
    src = tmp_path / "plugin.c"
    src.write_text(
        'const char plugin_name[] = "jobns";\nconst char plugin_type[] = "spank";\n'
        f"const unsigned int plugin_version = {version:#x};\n"
        "const unsigned int spank_plugin_version = 1;\n"
    )
    so = tmp_path / "jobns_spank.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(so), str(src)], check=True)
    return so


def test_a_plugin_built_for_another_slurm_is_a_problem_naming_the_rebuild(
    tmp_path: Path,
) -> None:
    so = built_plugin(tmp_path, 0x160508)  # 22.05.8, Debian bookworm's
    stack = tmp_path / "plugstack.conf"
    stack.write_text(f"required {so}\n")
    (found,) = spank_plugin.spank_build(str(stack), True, "22.05.8")
    assert found[0] == "ok" and "built for Slurm 22.05.8" in found[1]
    (found,) = spank_plugin.spank_build(str(stack), True, "26.05.5")
    assert found[0] == "problem", found
    for needle in (
        "built for Slurm 22.05.8",
        "runs Slurm 26.05.5",
        f"ci/build-spank --output {so}",
    ):
        assert needle in found[1], found
    (found,) = spank_plugin.spank_build(str(stack), True, "")
    assert found[0] == "note" and "22.05.8" in found[1]
    # Not a plugin at all (or stripped of its symbols): Slurm cannot load it either.
    so.write_bytes(b"\x7fELF" + bytes(60))
    (found,) = spank_plugin.spank_build(str(stack), True, "22.05.8")
    assert found[0] == "problem" and "no plugin_version" in found[1]
    stack.write_text("")
    assert spank_plugin.spank_build(str(stack), True, "22.05.8") == []


def test_an_optional_plugin_where_jobs_are_enforced_is_a_problem(tmp_path: Path) -> None:
    so = built_plugin(tmp_path, 0x1A0505)  # 26.05.5
    stack = tmp_path / "plugstack.conf"
    stack.write_text(f"optional {so}\n")
    optional, built = spank_plugin.spank_build(str(stack), True, "26.05.5")
    assert optional[0] == "problem" and "'required'" in optional[1], optional
    assert built[0] == "ok"
    # Without enforcement the plugin is not wanted at all: spank() says so, not this.
    assert kinds(spank_plugin.spank_build(str(stack), False, "26.05.5")) == ["ok"]


def test_enforcement_problems_for_status(tmp_path: Path) -> None:
    """What `jobns status` warns about on a node with [slurm] enforce = true."""
    conf = tmp_path / "slurm.conf"
    stack = tmp_path / "stack.conf"
    conf.write_text(f"PlugStackConfig={stack}\n")
    stack.write_text("")
    (problem,) = doctor.enforcement_problems(str(conf))
    assert "loads no jobns SPANK plugin" in problem
    so = built_plugin(tmp_path, 0x1A0505)
    stack.write_text(f"optional {so}\n")
    assert any("'optional'" in p for p in doctor.enforcement_problems(str(conf)))
    assert doctor.enforcement_problems(str(tmp_path / "none.conf")) == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", None),
        ("[namespace]\npid = false\n", None),
        ("[namespace]\npid = true\n", doctor.PROBLEM),
        ("[slurm]\nenforce = true\n[namespace]\npid = true\n", doctor.OK),
    ],
)
def test_a_pid_namespace_needs_enforce(text: str, kind: str | None) -> None:
    """[namespace] pid is honoured only with [slurm] enforce; doctor says which."""
    from jobns.launcher.model.config import Config, parse

    found = executables.pid_namespace(Config(parse(text, "jobns.toml"), "jobns.toml"))
    assert [k for k, _ in found] == ([kind] if kind else [])
    if kind == doctor.PROBLEM:
        assert "ignored" in found[0][1] and "enforce" in found[0][1]
