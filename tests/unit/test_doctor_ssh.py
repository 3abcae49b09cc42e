"""`jobns doctor`'s checks for an enforced node reached by ssh (issue 22): sshd's PAM
stack (pam_jobns after pam_slurm_adopt, PrologFlags=Contain) and no Slurm namespace
plugin beside jobns's enforcement; and hints that name this installation's paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jobns.launcher.commands import doctor
from jobns.launcher.commands.doctor import (
    namespace_plugins,
    scripts,
    slurm_versions,
    spank_plugin,
    ssh,
)

DEBIAN_SSHD = """\
@include common-auth
account    required     pam_nologin.so
@include common-account
{account}
session [success=ok ignore=ignore module_unknown=ignore default=bad]        pam_selinux.so close
session    required     pam_loginuid.so
@include common-session
session    required     pam_env.so user_readenv=1 envfile=/etc/default/locale
{session}
"""
ADOPT = "account required pam_slurm_adopt.so"
JOIN_ACCOUNT = "account required pam_jobns.so admin_group=hpcadmin"
JOIN_SESSION = "-session required pam_jobns.so"


def pam(tmp_path: Path, account: str, session: str) -> str:
    (tmp_path / "common-account").write_text("account [success=1 default=ignore] pam_unix.so\n")
    (tmp_path / "common-session").write_text("session required pam_unix.so\n")
    (tmp_path / "common-auth").write_text("auth required pam_unix.so\n")
    path = tmp_path / "sshd"
    path.write_text(DEBIAN_SSHD.format(account=account, session=session))
    return str(path)


def kinds(found: list[tuple[str, str]]) -> list[str]:
    return [k for k, _ in found]


CONTAIN = {"prologflags": "Alloc,Contain"}


def test_pam_stack_follows_includes_controls_and_optional_modules(tmp_path: Path) -> None:
    stack = ssh.pam_stack(pam(tmp_path, f"{ADOPT}\n{JOIN_ACCOUNT}", JOIN_SESSION))
    assert ("account", "pam_unix.so") in stack  # from common-account
    assert ("session", "pam_selinux.so") in stack  # [..] control spanning words
    assert stack[-1] == ("session", "pam_jobns.so")  # "-session" counts


def test_pam_jobns_after_pam_slurm_adopt_with_contain_is_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("glob.glob", lambda _p: ["/usr/lib/x/security/pam_jobns.so"])
    found = ssh.sshd_pam(pam(tmp_path, f"{ADOPT}\n{JOIN_ACCOUNT}", JOIN_SESSION), CONTAIN)
    assert kinds(found) == ["ok"], found


@pytest.mark.parametrize(
    ("account", "session"),
    [
        (ADOPT, ""),  # no pam_jobns at all
        (f"{ADOPT}\n{JOIN_ACCOUNT}", ""),  # checks but never joins
        (f"{JOIN_ACCOUNT}\n{ADOPT}", JOIN_SESSION),  # before SLURM_JOB_ID is set
        (ADOPT, JOIN_SESSION),  # joins what the session's PAM environment says
    ],
)
def test_pam_jobns_missing_or_misplaced_is_a_problem_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, account: str, session: str
) -> None:
    monkeypatch.setattr("glob.glob", lambda _p: ["/usr/lib/x/security/pam_jobns.so"])
    found = ssh.sshd_pam(pam(tmp_path, account, session), CONTAIN)
    assert kinds(found) == ["problem"], found
    assert "'account required pam_jobns.so' right after pam_slurm_adopt" in found[0][1]


def test_no_contain_or_no_module_file_are_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("glob.glob", lambda _p: [])
    found = ssh.sshd_pam(pam(tmp_path, f"{ADOPT}\n{JOIN_ACCOUNT}", JOIN_SESSION), {})
    assert kinds(found) == ["ok", "problem", "problem"], found
    assert "apt-get install jobns-slurm" in found[1][1]
    assert "PrologFlags=Contain" in found[2][1]


def test_no_pam_slurm_adopt_or_no_sshd_is_a_note(tmp_path: Path) -> None:
    assert kinds(ssh.sshd_pam(pam(tmp_path, "", ""), CONTAIN)) == ["note"]
    assert kinds(ssh.sshd_pam(str(tmp_path / "none"), CONTAIN)) == ["note"]


@pytest.mark.parametrize(
    "values",
    [
        {"jobcontainertype": "job_container/tmpfs"},
        {"namespacetype": "namespace/linux"},
        {"namespacetype": "namespace/tmpfs", "jobcontainertype": "job_container/none"},
    ],
)
def test_a_slurm_namespace_plugin_beside_enforcement_is_a_problem(values: dict[str, str]) -> None:
    found = namespace_plugins.slurm_namespace_plugins(values, "22.05.8")
    assert kinds(found) == ["problem", "note"], found
    assert "/jobns (jobns's own plugin of that type) instead" in found[0][1]


def test_no_slurm_namespace_plugin_is_a_note_naming_jobns_own() -> None:
    for values in ({}, {"jobcontainertype": "job_container/none"}):
        found = namespace_plugins.slurm_namespace_plugins(values, "22.05.8")
        assert kinds(found) == ["note"], found
        assert "JobContainerType=job_container/jobns" in found[0][1]


def plugin_dir(tmp_path: Path, name: str, built: str) -> Path:
    """A PluginDir holding a copy of a real Slurm plugin renamed `name`, or (built "")
    an empty one."""
    d = tmp_path / "plugins"
    d.mkdir()
    if built:
        import glob

        real = sorted(glob.glob("/usr/lib/*/slurm-wlm/job_container_tmpfs.so"))
        if not real:
            pytest.skip("no Slurm plugin on this machine to copy (apt-get install slurm-wlm)")
        (d / name).write_bytes(Path(real[0]).read_bytes())
    return d


def test_jobns_container_plugin_built_for_this_slurm_is_ok(tmp_path: Path) -> None:
    d = plugin_dir(tmp_path, "job_container_jobns.so", "yes")
    built = slurm_versions._plugin_version(str(d / "job_container_jobns.so"))
    assert built
    (tmp_path / "mpi.conf").write_text("PMIxCliTmpDirBase=/var/spool/slurmd/pmix\n")
    values = {
        "jobcontainertype": "job_container/jobns",
        "plugindir": str(d),
        "prologflags": "Alloc",
    }
    found = namespace_plugins.slurm_namespace_plugins(values, built, str(tmp_path))
    assert kinds(found) == ["ok"], found
    del values["prologflags"]
    found = namespace_plugins.slurm_namespace_plugins(values, built, str(tmp_path))
    assert kinds(found) == ["note"] and "PrologFlags=Alloc" in found[0][1], found


def test_jobns_container_plugin_of_another_slurm_missing_or_without_contain(
    tmp_path: Path,
) -> None:
    d = plugin_dir(tmp_path, "job_container_jobns.so", "yes")
    values = {
        "jobcontainertype": "job_container/jobns",
        "plugindir": str(d),
        "prologflags": "Alloc",
    }
    (tmp_path / "mpi.conf").write_text("PMIxCliTmpDirBase=/var/spool/slurmd/pmix\n")
    found = namespace_plugins.slurm_namespace_plugins(values, "24.11.5", str(tmp_path))
    assert kinds(found) == ["problem"] and "loads only into the exact release" in found[0][1]
    values = {"namespacetype": "namespace/jobns", "plugindir": str(d)}
    found = namespace_plugins.slurm_namespace_plugins(values, "26.05.5", str(tmp_path))
    assert kinds(found) == ["problem"] and "namespace_jobns.so is in no PluginDir" in found[0][1]


def test_no_step_daemon_in_the_job_names_pmix_x11_and_the_spool_dir(tmp_path: Path) -> None:
    d = plugin_dir(tmp_path, "job_container_jobns.so", "yes")
    built = slurm_versions._plugin_version(str(d / "job_container_jobns.so"))
    assert built
    values = {
        "jobcontainertype": "job_container/jobns",
        "plugindir": str(d),
        "prologflags": "Contain,X11",
        "slurmdspooldir": "/tmp/slurmd",
    }
    found = namespace_plugins.slurm_namespace_plugins(values, built, str(tmp_path))
    texts = " ".join(t for _, t in found)
    assert kinds(found) == ["problem", "note", "note"], found
    assert "SlurmdSpoolDir=/tmp/slurmd" in texts and "PMIxCliTmpDirBase=" in texts
    assert "X11Parameters=home_xauthority" in texts


def test_check_runs_the_ssh_checks_only_when_enforced(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("JobContainerType=job_container/tmpfs\n")
    sshd = pam(tmp_path, ADOPT, "")
    from jobns.launcher.model import config as config_mod

    for enforce in (False, True):
        config = config_mod.Config({"slurm": {"enforce": enforce}}, "test")
        found = [
            t
            for _k, t in doctor.check(config, str(conf), str(tmp_path / "cdi"), sshd_pam_file=sshd)
            if "pam_jobns" in t or "besides jobns" in t or "while jobns enforces" in t
        ]
        assert bool(found) == enforce, found


def test_hints_name_this_installations_jobns_and_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert scripts.installed_jobns() == "/usr/bin/jobns"
    assert spank_plugin.installed_spank_plugin().endswith("/slurm-wlm/jobns_spank.so")
    monkeypatch.setattr(sys, "executable", "/opt/jobns/venv/bin/python")
    assert scripts.installed_jobns() == "/opt/jobns/venv/bin/jobns"
    assert spank_plugin.installed_spank_plugin() == "/opt/jobns/lib/jobns_spank.so"
