"""`jobns doctor` (root) against a sandbox made ready and against broken ones: exit 0
when ready, else 125 with one `problem:` line per problem, each saying what to fix, or
a last line naming what could not be checked yet."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import JOBNS, REPO, OsUser, Sandbox, require
from tests.slurmd import as_slurmd

pytestmark = pytest.mark.root


class Node:
    """A sandbox plus the Slurm and CDI files doctor reads, all in good order."""

    def __init__(self, box: Sandbox) -> None:
        self.box = box
        root = box.root
        self.prolog, self.epilog = root / "prolog", root / "epilog"
        self.prolog.write_text(
            f'#!/bin/bash\nexec {JOBNS} setup --job-id "$SLURM_JOB_ID" --user "$SLURM_JOB_USER"\n'
        )
        self.epilog.write_text(f'#!/bin/bash\nexec {JOBNS} teardown --job-id "$SLURM_JOB_ID"\n')
        for p in (self.prolog, self.epilog):
            p.chmod(0o755)
        # the real plugin, built against this node's Slurm headers as a site builds it
        self.so = root / "jobns_spank.so"
        subprocess.run([str(REPO / "ci" / "build-spank"), "--output", str(self.so)], check=True)
        self.plugstack = root / "plugstack.conf"
        self.plugstack.write_text(self.plugin_line())
        self.slurm_conf = root / "slurm.conf"
        self.write_slurm_conf()
        box.write_config(extra="[slurm]\nenforce = true\n")  # plugstack loads the plugin
        # the marker the plugin makes when slurmd loads it: this "slurmd" has
        (box.state / "tasks-wait").write_text("")
        self.cdi = root / "cdi"
        self.cdi.mkdir(mode=0o755)
        (self.cdi / "jobns-1.json").write_text("{}\n")

    def plugin_line(self, state_dir: object = None) -> str:
        """The plugstack.conf line, with the config's state_dir (doctor compares them)."""
        return f"required {self.so} state_dir={state_dir or self.box.state}\n"

    def write_slurm_conf(self, prolog: str | None = None, epilog: bool = True) -> None:
        lines = [f"Prolog={prolog or self.prolog}", f"PlugStackConfig={self.plugstack}"]
        if epilog:
            lines.append(f"Epilog={self.epilog}")
        self.slurm_conf.write_text("ClusterName=x\n" + "\n".join(lines) + "\n")

    def doctor(self, shared_root: bool = True) -> tuple[int, list[str], list[str]]:
        """(exit status, problem lines, all lines). shared_root: run it in a mount
        namespace whose / is shared, as on a systemd host (these VMs' / is private)."""
        cmd = self.box.cmd(
            ["doctor", "--slurm-conf", str(self.slurm_conf), "--cdi-dir", str(self.cdi)]
        )
        if shared_root:
            cmd = ["unshare", "--mount", "--propagation", "shared", *cmd]
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env=self.box.env(None, None),
            check=False,
        )
        assert r.stderr == "", r.stderr
        lines = r.stdout.splitlines()
        assert all(ln.split(":")[0] in ("ok", "note", "problem", "jobns doctor") for ln in lines), (
            lines
        )
        return r.returncode, [ln for ln in lines if ln.startswith("problem:")], lines


@pytest.fixture
def node(sandbox: Sandbox) -> Node:
    require(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    return Node(sandbox)


def test_a_ready_node(node: Node) -> None:
    code, problems, lines = node.doctor()
    assert (code, problems) == (0, []), lines
    assert lines[-1] == "jobns doctor: this node is ready"
    text = "\n".join(lines)
    for needle in (
        "ok: user.max_user_namespaces",
        "ok: loop devices",
        f"ok: state_dir {node.box.state}: root's",
        "POSIX ACLs work",
        # world-writable (sticky) bases work, but docs/config.md recommends root-owned ones
        f"note: local_base {node.box.local}: root's, mode 1777, ",
        f"note: shm_base {node.box.shm}: root's, mode 1777, tmpfs, but world-writable",
        "ok: / is a shared mount",
        f"ok: Prolog={node.prolog} runs jobns setup",
        f"ok: Epilog={node.epilog} runs jobns teardown",
        f"ok: SPANK plugin {node.so} was built for Slurm ",
        f"ok: CDI directory {node.cdi}: root's; 1 jobns spec(s)",
    ):
        assert needle in text, (needle, text)


def test_a_private_root_is_a_problem(node: Node) -> None:
    with open("/proc/self/mountinfo") as f:
        root = [ln for ln in f if ln.split()[4] == "/"][-1]
    require("shared:" not in root.split(" - ")[0], "/ is shared on this host already")
    code, problems, _ = node.doctor(shared_root=False)
    assert code == 125 and len(problems) == 1 and "mount --make-rshared /" in problems[0]


def test_a_broken_node_gets_one_line_per_problem(node: Node) -> None:
    box = node.box
    box.state.chmod(0o777)  # state_dir writable by all
    box.local.chmod(0o777)  # a world-writable base, not sticky
    (box.root / "disk-shm").mkdir(mode=0o1777)  # shm_base on disk
    (box.root / "disk-shm").chmod(0o1777)
    box.write_config(extra="[slurm]\nenforce = true\n")
    box.config.write_text(
        box.config.read_text().replace(
            f'shm_base = "{box.shm}"', f'shm_base = "{box.root / "disk-shm"}"'
        )
    )
    other = box.root / "other-prolog"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    node.write_slurm_conf(prolog=str(other), epilog=False)  # no jobns prolog, no epilog
    node.so.unlink()  # plugstack names a missing plugin
    node.cdi.chmod(0o777)  # anyone could add a CDI spec
    code, problems, lines = node.doctor()
    assert code == 125, lines
    expected = [
        f"state_dir {box.state} is owned by uid 0 with mode 0777",
        f"local_base {box.local} is world-writable without the sticky bit",
        f"shm_base {box.root / 'disk-shm'} is on ",
        f"Prolog={other} does not run jobns setup",
        f"{node.slurm_conf} has no Epilog=",
        f"names the SPANK plugin {node.so}, which does not exist",
        f"CDI directory {node.cdi} is writable by others than root",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for needle in expected:
        assert sum(needle in p for p in problems) == 1, (needle, problems)
    assert all("fix: " in p for p in problems), problems
    assert lines[-1] == (
        f"jobns doctor: {len(expected)} problem(s) to fix before this node runs jobs; "
        "run jobns doctor again after fixing them"
    )


def test_a_state_dir_without_acls(node: Node) -> None:
    """The state directory on a file system without POSIX ACLs (ramfs has no xattrs)."""
    mnt = node.box.root / "noacl"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "ramfs", "-o", "mode=0755", "jobns-test", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(r.returncode == 0, f"cannot mount a ramfs: {r.stderr.strip()}")
    try:
        node.box.config.write_text(
            node.box.config.read_text().replace(
                f'state_dir = "{node.box.state}"', f'state_dir = "{mnt}/state"'
            )
        )
        node.plugstack.write_text(node.plugin_line(f"{mnt}/state"))
        code, problems, lines = node.doctor()
        assert code == 125 and len(problems) == 1, lines
        assert "refuses POSIX ACLs" in problems[0] and f"state_dir {mnt}/state" in problems[0]
        assert os.listdir(mnt) == []  # the probe file is gone again
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_state_dir_the_packaged_scripts_do_not_name(node: Node) -> None:
    """Issue 30, finding 5: state_dir moved in jobns.toml only, the packaged prolog and
    epilog still saying STATE_DIR=/run/jobns. doctor said "this node is ready", and
    every job then waited 60 s and failed. Now it is a problem naming each file with
    its value and the edit; after that edit the node is ready."""
    box = node.box
    for path, name in ((node.prolog, "prolog"), (node.epilog, "epilog")):
        path.write_text((REPO / "jobns" / "slurm" / "scripts" / name).read_text())  # as installed
        path.chmod(0o755)
    code, problems, lines = node.doctor()
    assert code == 125 and len(problems) == 1, lines
    for needle in (
        f"{box.state} in {box.config} (state_dir)",
        f"{box.state} in {node.plugstack} (the SPANK plugin's state_dir=)",
        f"/run/jobns in {node.prolog} (STATE_DIR)",
        f"/run/jobns in {node.epilog} (STATE_DIR)",
        f"fix: STATE_DIR={box.state} in {node.prolog} and {node.epilog}",
    ):
        assert needle in problems[0], (needle, problems)
    assert lines[-1].startswith("jobns doctor: 1 problem(s) to fix before this node runs jobs")
    for path in (node.prolog, node.epilog):
        path.write_text(path.read_text().replace("STATE_DIR=/run/jobns", f"STATE_DIR={box.state}"))
    code, problems, lines = node.doctor()
    assert (code, problems) == (0, []), lines
    assert f"ok: state_dir {box.state} is the same in {box.config} (state_dir), " in "\n".join(
        lines
    )
    assert lines[-1] == "jobns doctor: this node is ready"
    # The plugin's line left behind instead.
    node.plugstack.write_text(node.plugin_line("/run/jobns"))
    code, problems, lines = node.doctor()
    assert code == 125 and len(problems) == 1, lines
    fix = f"fix: state_dir={box.state} on the jobns_spank.so line of {node.plugstack}"
    assert fix in problems[0], problems


def test_the_configured_cdi_directory_is_checked(node: Node) -> None:
    """[cdi] dir is where jobns setup writes each job's spec: doctor checks it (without
    --cdi-dir), and a spec directory anyone may write is a problem."""
    spec_dir = node.box.root / "run-cdi"
    node.box.write_config(extra=f'[slurm]\nenforce = true\n[cdi]\ndir = "{spec_dir}"\n')
    cmd = node.box.cmd(["doctor", "--slurm-conf", str(node.slurm_conf)])
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "shared", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ok: CDI directory {spec_dir}: made by the first jobns setup" in r.stdout
    spec_dir.mkdir(mode=0o777)
    spec_dir.chmod(0o777)
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "shared", *cmd],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=False,
    )
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert r.returncode == 125 and len(problems) == 1, r.stdout
    assert f"CDI directory {spec_dir} is writable by others than root" in problems[0]


def test_a_dirs_base_the_job_user_cannot_enter(node: Node, users: list[OsUser]) -> None:
    """A [[dirs]] base below a directory of root's with mode 0700: doctor said ok, yet
    without [slurm] enforce every job's prolog failed ("open dir base ...: Permission
    denied", exit 125) and the node drained: the namespace is made as the job user, who
    looks the base up. Doctor now says so, and what it says matches what the prolog
    does. The base itself may be 0700: inside the job it is covered by root before the
    holder becomes the user (launcher.mountns.namespace.cover_bases)."""
    box, alice = node.box, users[0]
    node.plugstack.write_text("")  # the voluntary mode: no SPANK plugin
    (box.state / "tasks-wait").unlink()  # nor a slurmd that loaded one
    top, target = box.root / "xtop", box.root / "mnt" / "x"
    base = top / "xbase"
    base.mkdir(parents=True, mode=0o700)
    top.chmod(0o700)
    target.mkdir(parents=True)
    entry = f'[[dirs]]\npath = "{target}"\nbase = "{base}"\n'
    box.write_config(extra=entry)
    code, problems, lines = node.doctor()
    assert code == 125 and len(problems) == 1, lines
    assert f"an ordinary user may not search {top} (uid 0, mode 0700)" in problems[0]
    assert f"fix: chmod o+x {top}" in problems[0]
    r = as_slurmd(box, "setup", "d1", alice)
    assert r.returncode == 125 and "Permission denied" in r.stderr, r.stderr
    assert as_slurmd(box, "teardown", "d1", alice).returncode == 0
    top.chmod(0o755)  # the fix doctor names; the base stays 0700
    code, problems, lines = node.doctor()
    assert (code, problems) == (0, []), lines
    r = as_slurmd(box, "setup", "d2", alice)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert as_slurmd(box, "teardown", "d2", alice).returncode == 0
    # Enforced, root makes the namespace: 0700 is fine, and doctor says nothing.
    top.chmod(0o700)
    node.plugstack.write_text(node.plugin_line())
    (box.state / "tasks-wait").write_text("")  # slurmd restarted: it loaded the plugin
    box.write_config(extra="[slurm]\nenforce = true\n" + entry)
    code, problems, lines = node.doctor()
    assert (code, problems) == (0, []), lines
    r = as_slurmd(box, "setup", "d3", alice)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert as_slurmd(box, "teardown", "d3", alice).returncode == 0
    assert box.leftovers() == [] and [p.name for p in base.iterdir()] == []


# -- issue 32: the verdict is the deployment's truth


def run_doctor(node: Node, *args: str) -> tuple[int, list[str]]:
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "shared", *node.box.cmd(["doctor", *args])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env=node.box.env(None, None),
        check=False,
    )
    assert r.stderr == "", r.stderr
    return r.returncode, r.stdout.splitlines()


def test_a_node_where_slurm_is_not_configured_yet_is_not_ready(node: Node) -> None:
    """The docs' order (install, then configure Slurm): doctor run before Slurm is
    configured skipped every Slurm check and said "ready". Now it exits 125, says what it
    could not check, and to run it again; --no-slurm is the node without Slurm."""
    node.box.write_config()  # voluntary: nothing of Slurm's is configured yet
    missing = node.box.root / "no-slurm.conf"
    code, lines = run_doctor(node, "--slurm-conf", str(missing), "--cdi-dir", str(node.cdi))
    assert code == 125 and not [ln for ln in lines if ln.startswith("problem:")], lines
    assert f"note: no {missing}: Slurm is not configured yet" in "\n".join(lines)
    assert lines[-1] == (
        f"jobns doctor: not ready yet: Slurm is not configured yet (no {missing}); "
        "run jobns doctor again after configuring Slurm"
    )
    code, lines = run_doctor(
        node, "--slurm-conf", str(missing), "--cdi-dir", str(node.cdi), "--no-slurm"
    )
    assert (code, lines[-1]) == (0, "jobns doctor: this node is ready"), lines


def test_an_enforced_node_whose_slurmd_has_not_loaded_the_plugin(node: Node) -> None:
    (node.box.state / "tasks-wait").unlink()  # slurmd not restarted since the line was added
    code, problems, lines = node.doctor()
    assert code == 125 and problems == [], lines
    assert lines[-1] == (
        "jobns doctor: not ready yet: slurmd has not loaded the jobns SPANK plugin since "
        f"it started (no {node.box.state}/tasks-wait); run jobns doctor again after "
        "(re)starting slurmd"
    )


def test_a_missing_plugin_on_an_enforced_node(node: Node) -> None:
    node.plugstack.write_text("# the line was never added\n")
    (node.box.state / "tasks-wait").unlink()  # so slurmd never loaded the plugin
    code, problems, lines = node.doctor()
    assert code == 125 and len(problems) == 1, lines
    assert (
        f"[slurm] enforce = true, but {node.plugstack} loads no jobns SPANK plugin" in (problems[0])
    )
    assert "; fix: " in problems[0] and "then restart slurmd" in problems[0], problems


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("local_base = /tmp\n", "not valid TOML"),
        ('local_bsae = "/tmp"\n', "local_bsae"),
    ],
)
def test_a_broken_config_is_one_problem_with_its_fix(node: Node, text: str, why: str) -> None:
    node.box.config.write_text(text)
    code, problems, lines = node.doctor()
    assert code == 125 and len(problems) == 1, lines
    assert why in problems[0] and f"fix: correct {node.box.config}" in problems[0], problems
    assert lines[-1].endswith("run jobns doctor again after fixing it"), lines
