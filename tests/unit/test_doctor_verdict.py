"""`jobns doctor`'s verdict is the deployment's truth (issue 32): a check is a `problem:`
only where this node's configuration uses what it checks, a `note:` otherwise; a
world-writable base is not `ok` (docs/config.md recommends a root-owned one); the fix
for the plugin names the package's way; and the last line says what could not be
checked yet, exiting 0 only when nothing is left."""

from __future__ import annotations

from pathlib import Path

from jobns.launcher.commands import doctor
from jobns.launcher.commands.doctor import capacity, host, node, spank_plugin
from jobns.launcher.model.config import Config, parse
from jobns.launcher.system.errors import JobnsError


def cfg(text: str = "", state: Path | None = None) -> Config:
    if state is not None:
        text = f'state_dir = "{state}"\n' + text
    return Config(parse(text, "/t.toml"), "/t.toml")


DISK = '[capacity]\ntmp_backing = "disk"\n'


# -- loop devices: what the configuration uses, and where modprobe cannot help


def test_no_loop_devices_is_a_note_when_nothing_uses_them(tmp_path: Path) -> None:
    assert capacity.disk_users(cfg()) == []
    (found,) = capacity.loop_devices(str(tmp_path), capacity.disk_users(cfg()), "")
    assert found[0] == "note", found
    assert "nothing configured here needs loop devices" in found[1]
    assert "modprobe loop" in found[1]  # what to do before configuring a disk backing


def test_no_loop_devices_is_a_problem_for_a_disk_backing(tmp_path: Path) -> None:
    users = capacity.disk_users(cfg(DISK))
    assert users == ['[capacity] tmp_backing = "disk"']
    (found,) = capacity.loop_devices(str(tmp_path), users, "")
    assert found[0] == "problem" and "tmp_backing" in found[1] and "fix: modprobe loop" in found[1]


def test_a_dirs_disk_backing_needs_loop_devices_too(tmp_path: Path) -> None:
    config = cfg(
        '[[dirs]]\npath = "/scratch/local"\nbase = "/var/lib/jobns/local"\n'
        'backing = "disk"\nsize = "1GiB"\n'
    )
    assert capacity.disk_users(config) == ["[[dirs]] /scratch/local"]


def test_in_a_container_the_fix_is_the_hosts_not_modprobe(tmp_path: Path) -> None:
    (found,) = capacity.loop_devices(str(tmp_path), ["x"], "/.dockerenv exists")
    assert found[0] == "problem"
    fix = found[1].split("fix: ", 1)[1]
    assert fix.startswith("this node is a container (/.dockerenv exists)")
    assert "on the host" in fix and "--device /dev/loop-control" in fix
    (note,) = capacity.loop_devices(str(tmp_path), [], "/.dockerenv exists")
    assert note[0] == "note" and "this node is a container" in note[1]


def test_loop_control_present_is_ok(tmp_path: Path) -> None:
    assert capacity.loop_devices("/dev", [], "") == [capacity.loop_devices("/dev", ["x"], "")[0]]


def test_container_detection(tmp_path: Path) -> None:
    assert host.in_container(str(tmp_path)) == ""
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/\n")
    assert host.in_container(str(tmp_path)) == ""
    (tmp_path / "proc" / "1" / "cgroup").write_text("12:pids:/docker/0123abcd\n")
    assert host.in_container(str(tmp_path)) == "/proc/1/cgroup names docker"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text("")
    assert host.in_container(str(tmp_path)) == "/run/.containerenv exists"
    (tmp_path / ".dockerenv").write_text("")
    assert host.in_container(str(tmp_path)) == "/.dockerenv exists"


# -- bases: a world-writable one works, but is not what docs/config.md recommends


def test_a_world_writable_local_base_is_a_note_naming_the_root_owned_one() -> None:
    found = node.base("local_base", "/tmp")  # root's, 1777 on every Debian
    assert [k for k, _ in found] == ["note"], found
    text = found[0][1]
    assert "world-writable" in text and "docs/config.md" in text
    assert 'local_base = "/var/lib/jobns"' in text and "install -d -m 0755" in text


def test_a_root_owned_base_is_ok() -> None:
    assert [k for k, _ in node.base("local_base", "/usr")] == ["ok"]


# -- the plugin: the package's way to enable it


def test_enable_hint_uncomments_the_packaged_line(tmp_path: Path) -> None:
    d = tmp_path / "plugstack.conf.d"
    d.mkdir()
    packaged = d / "jobns.conf"
    packaged.write_text("# the recipe\n#required /usr/lib/x/slurm-wlm/jobns_spank.so\n")
    stack = tmp_path / "plugstack.conf"
    stack.write_text(f"include {d}/*.conf\n")
    hint = spank_plugin.enable_plugin_hint(str(stack), str(packaged))
    assert hint == f"uncomment the 'required' line in {packaged} (package jobns-slurm)"
    stack.write_text("")  # a site's own plugstack.conf that does not include the directory
    hint = spank_plugin.enable_plugin_hint(str(stack), str(packaged))
    assert hint.endswith(f"and add 'include {d}/*.conf' to {stack}")
    packaged.write_text("required /usr/lib/x/slurm-wlm/jobns_spank.so\n")
    assert spank_plugin.enable_plugin_hint(str(stack), str(packaged)) == (
        f"add 'include {d}/*.conf' to {stack}"
    )
    packaged.unlink()  # a development install: the from-source line
    assert spank_plugin.enable_plugin_hint(str(stack), str(packaged)).startswith("add 'required ")


def test_a_missing_plugin_on_an_enforced_node_says_how_to_enable_it(tmp_path: Path) -> None:
    stack = tmp_path / "plugstack.conf"
    stack.write_text("")
    (found,) = spank_plugin.spank(str(stack), enforce=True)
    assert found[0] == "problem"
    assert "fix: " in found[1] and "then restart slurmd" in found[1], found


# -- what doctor cannot check yet, and the last line


def test_no_slurm_conf_is_not_ready_yet(tmp_path: Path) -> None:
    conf = str(tmp_path / "slurm.conf")
    pending = doctor.not_checked_yet(cfg(), conf)
    assert pending == [(f"Slurm is not configured yet (no {conf})", "configuring Slurm")]
    assert doctor.not_checked_yet(cfg(), conf, use_slurm=False) == []


def test_an_enforced_node_whose_slurmd_has_not_loaded_the_plugin(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stack = tmp_path / "plugstack.conf"
    stack.write_text(f"required {tmp_path}/jobns_spank.so\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"PlugStackConfig={stack}\n")
    enforced = cfg("[slurm]\nenforce = true\n", state)
    ((what, after),) = doctor.not_checked_yet(enforced, str(conf))
    assert "slurmd has not loaded the jobns SPANK plugin" in what and after == "(re)starting slurmd"
    (state / "tasks-wait").write_text("")  # slurmd made it when it loaded the plugin
    assert doctor.not_checked_yet(enforced, str(conf)) == []
    (state / "tasks-wait").unlink()
    assert doctor.not_checked_yet(cfg("", state), str(conf)) == []  # not enforced: spank() says


def test_verdict() -> None:
    ok = [("ok", "a"), ("note", "b")]
    problem = [*ok, ("problem", "c; fix: d")]
    slurm = [("Slurm is not configured yet (no /etc/slurm/slurm.conf)", "configuring Slurm")]
    assert doctor.verdict(ok, []) == ("jobns doctor: this node is ready", 0)
    line, code = doctor.verdict(ok, slurm)
    assert code == 125
    assert line == (
        "jobns doctor: not ready yet: Slurm is not configured yet (no "
        "/etc/slurm/slurm.conf); run jobns doctor again after configuring Slurm"
    )
    line, code = doctor.verdict(problem, slurm)
    assert code == 125
    assert line.startswith("jobns doctor: 1 problem(s) to fix before this node runs jobs; ")
    assert line.endswith("run jobns doctor again after fixing them and configuring Slurm")
    line, code = doctor.verdict(problem, [])
    assert (line, code) == (
        "jobns doctor: 1 problem(s) to fix before this node runs jobs; run jobns doctor "
        "again after fixing them",
        125,
    )


def test_a_broken_config_is_a_problem_with_its_fix() -> None:
    text = doctor.config_problem(JobnsError("config /etc/jobns/jobns.toml: bad"), "/e/j.toml")
    assert text.startswith("config /etc/jobns/jobns.toml: bad; fix: correct /e/j.toml")
    assert "docs/config.md" in text
