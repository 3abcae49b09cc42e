"""Attacks on `jobns run` joining a set-up job: root must never run, import or create
anything as root inside a namespace the job user can modify (DESIGN rule 1; contract
points 1 and 8), and every failure is one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.security.conftest import NS_BIND, World, no_crash, one_line, snapshot

pytestmark = pytest.mark.root

VENV_PY = "/opt/jobns/venv/bin/python"


def plant(world: World, job: str, pairs: list[tuple[Path, str]]) -> int:
    """alice starts a task in her job and, from the host, bind-mounts each of her files
    over a path inside the job's mount namespace (hers: it is owned by her user
    namespace). Returns the task's pid (still running)."""
    _, pid = world.task(job, world.alice)
    args = [str(pid)]
    for src, dst in pairs:
        args += [str(src), dst]
    r = world.python(world.alice, NS_BIND, *args)
    assert r.returncode == 0 and r.stdout == "mounted\n", r.stderr
    return pid


def proof_file(world: World) -> Path:
    proof = world.w / "proof"
    proof.touch()
    proof.chmod(0o666)
    return proof


def alices_file(world: World, name: str, text: str, mode: int = 0o755) -> Path:
    p = world.w / name
    p.write_text(text)
    p.chmod(mode)
    os.chown(p, world.alice.uid, world.alice.gid)
    return p


def test_root_join_never_runs_a_program_the_user_bound_over_usr_bin_id(world: World) -> None:
    """Attack: alice bind-mounts her script over /usr/bin/id inside her job's namespace,
    then root runs `jobns run --job-id J -- id -u`. Defence: root drops to the job's
    owner before joining, so the command (hers or not) runs as alice, never as uid 0."""
    alice = world.alice
    proof = proof_file(world)
    evil = alices_file(
        world,
        "evil-id",
        "#!/bin/sh\n"
        "euid=$(awk '/^Uid:/{print $3}' /proc/self/status)\n"
        f'echo "id $euid" >> {proof}\necho "$euid"\n',
    )
    r = world.setup("j1")
    assert r.returncode == 0, r.stderr
    plant(world, "j1", [(evil, "/usr/bin/id")])
    r = world.box.run(["run", "--job-id", "j1", "--", "id", "-u"])
    ran_as = proof.read_text().split()
    assert "0" not in ran_as[1::2], f"root executed alice's /usr/bin/id: {ran_as}"
    assert r.returncode == 0 and r.stdout.strip() == str(alice.uid), (r.stdout, r.stderr)
    # Naming root explicitly does not get root in either.
    r = world.box.run(["run", "--job-id", "j1", "--user", "root", "--", "id", "-u"])
    assert r.returncode == 125, (r.stdout, r.stderr)
    one_line(r)
    assert "0" not in proof.read_text().split()[1::2]
    assert world.teardown("j1").returncode == 0
    world.assert_clean()


def test_root_join_with_net_none_never_imports_python_the_user_bound_over_pyroute2(
    world: World,
) -> None:
    """Attack: alice binds her own `pyroute2` package over the venv's inside her job's
    namespace; root runs `jobns run --job-id J --net none -- true`, which imports pyroute2
    after joining. Defence: root drops to alice before joining; root never imports from
    her namespace."""
    proof = proof_file(world)
    site = subprocess.run(
        [VENV_PY, "-c", "import os, pyroute2; print(os.path.dirname(pyroute2.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    pkg = world.w / "evil-pyroute2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import os\n"
        f"with open({str(proof)!r}, 'a') as f:\n"
        "    f.write(f'pyroute2 {os.geteuid()}\\n')\n"
        "class IPRoute:\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *a): return False\n"
        "    def link_lookup(self, **kw): return [1]\n"
        "    def link(self, *a, **kw): return None\n"
    )
    for p in (pkg, pkg / "__init__.py"):
        os.chown(p, world.alice.uid, world.alice.gid)
    pkg.chmod(0o755)
    assert world.setup("j2").returncode == 0
    plant(world, "j2", [(pkg, site)])
    r = world.box.run(["run", "--job-id", "j2", "--net", "none", "--", "true"])
    imported_as = proof.read_text().split()[1::2]
    assert "0" not in imported_as, f"root imported alice's pyroute2: {imported_as}"
    assert r.returncode == 0, r.stderr
    assert world.teardown("j2").returncode == 0
    world.assert_clean()


@pytest.mark.parametrize("who", ["root", "bob", "0"])
def test_root_naming_another_user_for_a_set_up_job_is_refused(world: World, who: str) -> None:
    """Attack: root (a site launcher fooled by the job's environment) names root or another
    user for alice's set-up job. Defence: exit 125 with one `jobns:` line; nothing runs."""
    name = world.bob.name if who == "bob" else who
    assert world.setup("j3").returncode == 0
    marker = world.w / "ran"
    r = world.box.run(["run", "--job-id", "j3", "--user", name, "--", "touch", str(marker)])
    assert r.returncode == 125, (r.stdout, r.stderr)
    one_line(r)
    assert not marker.exists()
    # The same through Slurm's variable.
    r = world.box.run(
        ["run", "--job-id", "j3", "--", "touch", str(marker)], env={"SLURM_JOB_USER": name}
    )
    assert r.returncode == 125, (r.stdout, r.stderr)
    one_line(r)
    assert not marker.exists()
    assert world.teardown("j3").returncode == 0
    world.assert_clean()


def test_root_may_still_join_a_job_set_up_for_root(world: World) -> None:
    """Attack: none (the other side of the fix). Defence kept: a job set up for root (no
    --user, as root) is joined by root, and its command runs as root."""
    r = world.box.run(["setup", "--job-id", "j4"])
    assert r.returncode == 0, r.stderr
    r = world.box.run(["run", "--job-id", "j4", "--", "sh", "-c", "id -u; touch /tmp/x"])
    assert r.returncode == 0 and r.stdout == "0\n", (r.stdout, r.stderr)
    assert (world.box.local / "job-j4/tmp/x").stat().st_uid == 0
    assert world.teardown("j4").returncode == 0
    world.assert_clean()


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0"},
        {"PMIX_NAMESPACE": "ompi.42", "PMIX_RANK": "3"},
    ],
    ids=["slurm", "pmix"],
)
def test_root_join_with_pmix_env_runs_as_owner_and_leaves_no_root_pmix(
    world: World, env: dict[str, str]
) -> None:
    """Attack: root (slurmstepd-like, PMIx variables set) runs `jobns run --job-id J`
    without --user in alice's job; a root-owned /tmp/pmix would lock her out of PMIx.
    Defence: the task runs as alice, /tmp/pmix is hers, and her later task works."""
    alice = world.alice
    assert world.setup("j5").returncode == 0
    r = world.box.run(["run", "--job-id", "j5", "--", "id", "-u"], env=env)
    assert r.returncode == 0 and r.stdout.strip() == str(alice.uid), (r.stdout, r.stderr)
    top = world.box.local / "job-j5/tmp/pmix"
    owners = {p: p.lstat().st_uid for p in [top, *top.rglob("*")] if p.exists()}
    assert all(uid == alice.uid for uid in owners.values()), owners
    r = world.run(
        "j5",
        "test -d /tmp/pmix && test -O /tmp/pmix && touch /tmp/pmix/mine",
        user=alice,
        env={"SLURM_STEP_ID": "1", "SLURM_PROCID": "2"},
    )
    assert r.returncode == 0, r.stderr
    assert world.teardown("j5").returncode == 0
    world.assert_clean()


def test_pmix_dir_symlinked_by_the_user_is_never_followed_by_root(world: World) -> None:
    """Attack: alice makes /tmp/pmix in her job a symlink to a root-owned directory, then
    root runs a task of her job (which creates /tmp/pmix). Defence: nothing is created
    through the link as root; the decoy stays as it was."""
    decoy = world.decoy()
    before = snapshot(decoy)
    assert world.setup("j6").returncode == 0
    r = world.run("j6", f"rm -rf /tmp/pmix; ln -s {decoy} /tmp/pmix", user=world.alice)
    assert r.returncode == 0, r.stderr
    r = world.box.run(
        ["run", "--job-id", "j6", "--", "true"], env={"SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    )
    no_crash(r)
    assert snapshot(decoy) == before, "root created PMIx directories through alice's link"
    assert world.teardown("j6").returncode == 0
    assert snapshot(decoy) == before
    world.assert_clean()


def test_root_run_from_a_cwd_the_user_replaced_with_a_symlink(world: World) -> None:
    """Attack: root's working directory is under the host's /tmp; inside her job alice
    puts a symlink at that path pointing to a root-only directory, so a task that
    re-resolves its cwd lands there. Defence: the task runs as alice, who cannot read it."""
    decoy = world.decoy(mode=0o700)
    here = Path("/tmp") / f"jobns-sec-cwd-{world.box.root.name}"
    here.mkdir()
    try:
        assert world.setup("j7").returncode == 0
        assert world.run("j7", f"ln -s {decoy} {here}", user=world.alice).returncode == 0
        r = world.box.run(
            ["run", "--job-id", "j7", "--", "sh", "-c", "id -u; ls -A ."], cwd=str(here)
        )
        no_crash(r)
        lines = r.stdout.split()
        assert lines[:1] == [str(world.alice.uid)], (r.stdout, r.stderr)
        assert "passwd" not in lines, "the task listed a root-only directory"
    finally:
        here.rmdir()
    assert world.teardown("j7").returncode == 0
    world.assert_clean()


def _bad_config(world: World, kind: str) -> Path:
    if kind == "directory":
        d = world.box.root / "conf.d"
        d.mkdir()
        return d
    p = world.box.root / f"bad-{kind}.toml"
    body = {
        "kill_wait-nan": "kill_wait = nan\n",
        "kill_wait-inf": "kill_wait = inf\n",
        "binary": "\udcff\udcfe\0\n",
        "base-relative": 'local_base = "../../etc"\n',
    }[kind]
    p.write_bytes(body.encode(errors="surrogateescape"))
    return p


@pytest.mark.parametrize(
    "kind", ["directory", "kill_wait-nan", "kill_wait-inf", "binary", "base-relative"]
)
@pytest.mark.parametrize("sub", ["run", "setup", "teardown", "status", "gc", "env"])
def test_bad_config_is_one_line_never_a_traceback(world: World, kind: str, sub: str) -> None:
    """Attack: a config jobns cannot use (a directory, kill_wait = nan/inf, binary junk, a
    relative base). Defence: every subcommand exits 125 with one `jobns:` line, no
    traceback, no internal error, and nothing is created."""
    conf = _bad_config(world, kind)
    args = {
        "run": ["--job-id", "c1", "--", "true"],
        "setup": ["--job-id", "c1"],
        "teardown": ["--job-id", "c1"],
        "status": [],
        "gc": ["--no-slurm"],
        "env": ["--job-id", "c1"],
    }[sub]
    r = world.box.run([sub, "--config", str(conf), *args])
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    one_line(r)
    world.assert_clean()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1", "86401", "0x10", "", "NaN"])
@pytest.mark.parametrize("sub", ["run", "setup"])
def test_bad_kill_wait_is_one_line(world: World, value: str, sub: str) -> None:
    """Attack: --kill-wait that is not a number of seconds in range (nan, inf, ...), as
    the job user (run) or in the prolog (setup). Defence: 125, one line, nothing made."""
    args = ["--job-id", "k1", "--kill-wait", value]
    if sub == "run":
        r = world.box.run(["run", *args, "--", "true"], user=world.alice)
    else:
        r = world.box.run(["setup", *args, "--user", world.alice.name])
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    one_line(r)
    world.assert_clean()
