"""Attacks on `jobns hook` and `jobns oci-config` by a second ordinary user.

jobnsbob (the attacker) aims at jobnsalice's job: his container (process.user bob, or
root) carries her job id, names her as the job user, or his bundle is prepared with her
job, hoping to be handed her /tmp, /var/tmp and /dev/shm; or his container image and
bundle carry links and races meant to make root create or mount where it must not.
DESIGN.md rule 7: every path that gives a job's directories to a container checks the
container user (process.user, mapped to the host) against the job's owner.

Each test proves one attack fixed: the hook or oci-config exits 125 with one `jobns:`
line (naming the container or bundle, both uids and the fix), nothing of alice's is
bound or created, and no mount, directory or hold is left behind. The stand-in
container (tests/integration/test_hook.py) is a process in its own mount namespace with
a bundle, exactly what a runtime hands a createRuntime hook.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OsUser, Sandbox, require
from tests.integration.test_hook import (
    Container,
    holders,
    holds_left,
    host_mounts,
    lock_files,
    one_line_error,
    same,
)

pytestmark = pytest.mark.root

TARGETS = ("tmp", "var/tmp", "dev/shm")
FIX = "run the container as"


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    require(os.path.exists("/usr/bin/nsenter"), "nsenter (util-linux) missing")
    yield sandbox
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


@pytest.fixture
def made(box: Sandbox) -> Iterator[list[Container]]:
    out: list[Container] = []
    yield out
    for c in out:
        c.stop()


def container(
    box: Sandbox,
    made: list[Container],
    cid: str,
    uid: int,
    gid: int,
    annotations: dict[str, str] | None = None,
    env: tuple[str, ...] = (),
    **kw: Any,
) -> Container:
    c = Container(
        box,
        cid,
        annotations=annotations,
        process={"args": ["sh"], "env": ["PATH=/bin", *env], "user": {"uid": uid, "gid": gid}},
        **kw,
    )
    made.append(c)
    return c


def mounts_under(c: Container) -> list[str]:
    """Mount points at or under the container's rootfs, as its own namespace sees them."""
    points = [ln.split()[4] for ln in c.sh("cat /proc/self/mountinfo").splitlines()]
    return [p for p in points if p == str(c.rootfs) or p.startswith(f"{c.rootfs}/")]


def snapshot(box: Sandbox, job: str) -> list[tuple[str, int, int, int]]:
    """Everything of a job's trees on this node: (path, uid, mode, inode)."""
    out = []
    for top in (box.local / f"job-{job}", box.shm / f"job-{job}"):
        for dirpath, dirs, files in os.walk(top):
            for name in ("", *dirs, *files):
                st = os.lstat(os.path.join(dirpath, name))
                out.append((os.path.join(dirpath, name), st.st_uid, st.st_mode, st.st_ino))
    return sorted(out)


def prolog(box: Sandbox, job: str, user: OsUser) -> list[tuple[str, int, int, int]]:
    """`jobns setup` of alice's job, with a secret in her /tmp; returns its snapshot."""
    r = box.run(["setup", "--job-id", job, "--user", user.name])
    assert r.returncode == 0, r.stderr
    secret = box.local / f"job-{job}" / "tmp" / "secret"
    secret.write_text("alice's\n")
    os.chown(secret, user.uid, user.gid)
    return snapshot(box, job)


def refused(
    r: subprocess.CompletedProcess[str], who: str, attacker_uid: int, owner_uid: int
) -> None:
    """Exit 125, one `jobns:` line naming the container (or bundle), both uids and the fix."""
    one_line_error(r, f"{who} runs as uid {attacker_uid}")
    assert f"uid {owner_uid}" in r.stderr and FIX in r.stderr, r.stderr


def nothing_given(box: Sandbox, c: Container, mounts_before: list[str]) -> None:
    assert mounts_under(c) == []
    assert host_mounts(box) == mounts_before
    assert not [h for h in holds_left(box) if h.endswith(f"/{c.id}")]
    for rel in TARGETS:
        assert os.listdir(c.rootfs / rel) == []  # nothing of anybody's in his image


# --- the container of another user ---------------------------------------------------


@pytest.mark.parametrize("as_root", [False, True], ids=["as-bob", "as-root"])
def test_other_users_container_gets_no_prolog_job(
    box: Sandbox, made: list[Container], users: list[OsUser], as_root: bool
) -> None:
    """Attack: bob's container (process.user bob, or root) annotated with the job id of
    alice's prolog-set-up job was handed her /tmp, /var/tmp and /dev/shm (the hook checked
    the user only when one was named). Fixed: the container's host uid must be the
    recorded owner's."""
    alice, bob = users
    before = prolog(box, "PA1", alice)
    uid, gid = (0, 0) if as_root else (bob.uid, bob.gid)
    c = container(box, made, "bob1", uid, gid, {"org.jobns.job-id": "PA1"})
    c.start()
    mounts_before, locks_before = host_mounts(box), lock_files(box)
    refused(c.hook(), "container bob1", uid, alice.uid)
    nothing_given(box, c, mounts_before)
    assert snapshot(box, "PA1") == before and lock_files(box) == locks_before
    assert box.run(["teardown", "--job-id", "PA1"]).returncode == 0
    assert box.leftovers() == []


def test_other_users_container_gets_no_standalone_job(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """Attack: bob's container annotated with the job id of alice's standalone job, whose
    own container holds the directories, joins her job. The tree owner check already
    refused him, with a message naming neither container nor fix; fixed: the hook knows
    whose job it is and says so before touching it."""
    alice, bob = users
    a = container(box, made, "alice1", alice.uid, alice.gid, {"org.jobns.job-id": "SA1"})
    a.start()
    assert a.hook().returncode == 0
    (box.local / "job-SA1" / "tmp" / "secret").write_text("alice's\n")
    before = snapshot(box, "SA1")
    c = container(box, made, "bob2", bob.uid, bob.gid, {"org.jobns.job-id": "SA1"})
    c.start()
    mounts_before = host_mounts(box)
    refused(c.hook(), "container bob2", bob.uid, alice.uid)
    nothing_given(box, c, mounts_before)
    assert snapshot(box, "SA1") == before
    assert holds_left(box) == ["SA1", "SA1/alice1"] and len(holders()) == 1
    assert same(a.inside("tmp"), os.stat(box.local / "job-SA1" / "tmp"))  # hers, untouched
    assert a.finish().returncode == 0
    assert box.leftovers() == [] and holds_left(box) == []


def naming(how: str, u: OsUser) -> tuple[dict[str, str], tuple[str, ...]]:
    """(annotations, process.env entries) that name u as the job user."""
    if how == "annotation":
        return {"org.jobns.user": u.name}, ()
    return {}, (f"{how}={u.name if how == 'SLURM_JOB_USER' else u.uid}",)


@pytest.mark.parametrize("job", ["new", "standalone", "prolog"])
@pytest.mark.parametrize("how", ["annotation", "SLURM_JOB_USER", "SLURM_JOB_UID"])
def test_naming_the_job_user_does_not_make_it_yours(
    box: Sandbox, made: list[Container], users: list[OsUser], how: str, job: str
) -> None:
    """Attack: bob's container names alice as the job user (annotation org.jobns.user,
    SLURM_JOB_USER or SLURM_JOB_UID in process.env) with her job id: it was handed her
    running standalone job's trees (or her prolog job's), or root made trees in her name
    for him. Fixed: a named user must be the container's own host uid."""
    alice, bob = users
    ann, env = naming(how, alice)
    before: list[tuple[str, int, int, int]] = []
    a = None
    if job == "prolog":
        before = prolog(box, "NA1", alice)
    elif job == "standalone":
        a = container(box, made, "alice2", alice.uid, alice.gid, {"org.jobns.job-id": "NA1"})
        a.start()
        assert a.hook().returncode == 0
        before = snapshot(box, "NA1")
    c = container(box, made, "bob3", bob.uid, bob.gid, {"org.jobns.job-id": "NA1", **ann}, env)
    c.start()
    mounts_before, locks_before = host_mounts(box), lock_files(box)
    refused(c.hook(), "container bob3", bob.uid, alice.uid)
    nothing_given(box, c, mounts_before)
    assert snapshot(box, "NA1") == before and lock_files(box) == locks_before
    if a is not None:
        assert a.finish().returncode == 0
    elif job == "prolog":
        assert box.run(["teardown", "--job-id", "NA1"]).returncode == 0
    assert box.leftovers() == [] and holds_left(box) == [] and lock_files(box) == []


@pytest.mark.parametrize("job", ["new", "prolog"])
def test_config_json_mappings_do_not_outvote_the_live_init(
    box: Sandbox, made: list[Container], users: list[OsUser], job: str
) -> None:
    """Attack: bob's bundle claims a user namespace whose uid 0 is alice
    (linux.uidMappings), while the container really runs as root on the host: the hook
    believed config.json and gave the root container alice's job (or made her trees for
    it). Fixed: with the init's pid, the hook maps process.user through the live
    /proc/PID/uid_map, which here says uid 0 is uid 0."""
    alice, _ = users
    before = prolog(box, "LM1", alice) if job == "prolog" else []
    c = container(box, made, "bob11", 0, 0, {"org.jobns.job-id": "LM1"})
    c.config["linux"] = {
        "namespaces": [{"type": "mount"}, {"type": "user"}],
        "uidMappings": [{"containerID": 0, "hostID": alice.uid, "size": 1}],
        "gidMappings": [{"containerID": 0, "hostID": alice.gid, "size": 1}],
    }
    c.write_config()
    c.start()
    mounts_before = host_mounts(box)
    r = c.hook()
    if job == "prolog":
        refused(r, "container bob11", 0, alice.uid)
    else:  # the job user is the container's own: root, whose job is not alice's
        assert r.returncode == 0, r.stderr
        assert (box.local / "job-LM1").stat().st_uid == 0
        assert c.finish().returncode == 0
    if job == "prolog":
        nothing_given(box, c, mounts_before)
        assert snapshot(box, "LM1") == before
        assert box.run(["teardown", "--job-id", "LM1"]).returncode == 0
    assert box.leftovers() == [] and holds_left(box) == []


# --- oci-config ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["prolog", "--user", "annotation"])
def test_oci_config_writes_no_job_into_another_users_bundle(
    box: Sandbox, made: list[Container], users: list[OsUser], how: str
) -> None:
    """Attack: `jobns oci-config` (root, e.g. Slurm's RunTimeCreate) prepares bob's bundle
    (process.user bob) with alice's job: her prolog job by id, or a job named hers by
    --user or the bundle's org.jobns.user annotation. It wrote binds of her directories
    into his config.json (and made them). Fixed: the bundle's process user, mapped to the
    host, must be the job's owner; config.json and the bases stay untouched."""
    alice, bob = users
    before = prolog(box, "OA1", alice) if how == "prolog" else []
    ann = {"org.jobns.user": alice.name} if how == "annotation" else {}
    c = container(box, made, "bob4", bob.uid, bob.gid, ann)
    config = (c.bundle / "config.json").read_bytes()
    flags = ["--user", alice.name] if how == "--user" else []
    r = box.run(["oci-config", "--job-id", "OA1", *flags, str(c.bundle)])
    refused(r, f"bundle {c.bundle}", bob.uid, alice.uid)
    assert (c.bundle / "config.json").read_bytes() == config
    assert snapshot(box, "OA1") == before
    if how == "prolog":
        assert box.run(["teardown", "--job-id", "OA1"]).returncode == 0
    assert box.leftovers() == [] and lock_files(box) == []


@pytest.mark.parametrize(
    ("link", "to"),
    [
        ("tmp", "/etc"),
        ("var", "/etc"),
        ("var/tmp", "../etc"),
        ("dev", "/etc"),
        ("dev/shm", "/etc"),
        ("", None),
    ],
)
def test_oci_config_checks_the_rootfs_before_making_anything(
    box: Sandbox, made: list[Container], users: list[OsUser], link: str, to: str | None
) -> None:
    """Attack: bob's bundle for his own job, whose image has a link at a mount point (say
    /tmp -> /etc), or whose rootfs is itself his link: oci-config made the job's
    directories and wrote the binds without looking, for the runtime to mount through the
    link. Fixed: the rootfs is walked first, without following links, and refused before
    anything is created."""
    _, bob = users
    c = container(box, made, "bob6", bob.uid, bob.gid, dirs=("etc", "tmp", "var/tmp", "dev/shm"))
    if link:
        real = c.rootfs / link
        if link == "var" or link == "dev":
            real.rename(real.with_name(f"{link}.real"))
        else:
            real.rmdir()
        os.symlink(str(to), real)
        needle = f"refuse {c.rootfs}/{link}: it is a symbolic link"
    else:
        c.rootfs.rename(c.bundle / "image")
        os.symlink(c.bundle / "image", c.rootfs)
        os.lchown(c.rootfs, bob.uid, bob.gid)
        needle = f"{c.rootfs}: it is a symbolic link owned by uid {bob.uid}"
    config = (c.bundle / "config.json").read_bytes()
    r = box.run(["oci-config", "--job-id", "OC1", str(c.bundle)])
    one_line_error(r, needle)
    assert (c.bundle / "config.json").read_bytes() == config
    assert box.leftovers() == [] and lock_files(box) == []


# --- hostile root file systems and races ---------------------------------------------


@pytest.mark.parametrize("where", ["rootfs", "parent"])
def test_rootfs_path_through_a_users_link_is_refused(
    box: Sandbox, made: list[Container], users: list[OsUser], where: str
) -> None:
    """Attack: bob makes the bundle's rootfs (or a directory on its way) his symbolic link
    to a directory of root's (standing for /etc): the hook followed it and, as root, made
    world-writable tmp/, var/tmp/ and dev/shm/ there and mounted over them. Fixed: root
    follows only root's links on the way to a rootfs."""
    _, bob = users
    victim = box.root / "victim"  # root's, like /etc
    (victim / "rootfs").mkdir(parents=True)
    c = container(box, made, "bob7", bob.uid, bob.gid, {"org.jobns.job-id": "RL1"})
    shutil.rmtree(c.rootfs)
    if where == "rootfs":
        link, dest = c.rootfs, victim / "rootfs"
    else:
        link, dest = c.bundle / "img", victim
        c.config["root"]["path"] = "img/rootfs"
        c.write_config()
    os.symlink(dest, link)
    os.lchown(link, bob.uid, bob.gid)
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(c.hook(), f"{link}: it is a symbolic link owned by uid {bob.uid}")
    assert os.listdir(victim / "rootfs") == [] and os.listdir(victim) == ["rootfs"]
    points = [ln.split()[4] for ln in c.sh("cat /proc/self/mountinfo").splitlines()]
    assert not [p for p in points if p.startswith(str(victim))]
    assert host_mounts(box) == mounts_before
    assert box.leftovers() == [] and holds_left(box) == [] and holders() == []


def _stopped_child(parent: int, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for d in Path("/proc").iterdir():
            try:
                fields = (d / "stat").read_text().rpartition(")")[2].split()
            except (OSError, ValueError):
                continue
            if fields[0] == "T" and int(fields[1]) == parent:
                return int(d.name)
        time.sleep(0.01)
    raise AssertionError(f"no stopped child of the hook (pid {parent}) within {timeout}s")


def test_mount_point_swapped_during_the_bind_leaves_no_mount(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """Attack: bob swaps his image's /tmp for a link to /etc while the hook binds (he owns
    the rootfs; the hook's test pause point stands for winning the race). The bind landed
    on the old directory, the hook saw the swap and refused, but left that mount behind
    in the container's namespace. Fixed: it is detached through the fd of the very
    directory it was made on."""
    _, bob = users
    c = container(box, made, "bob8", bob.uid, bob.gid, {"org.jobns.job-id": "SW1"})
    c.start()
    mounts_before = host_mounts(box)
    state = box.root / "state.json"
    state.write_bytes(c.state())
    with state.open("rb") as stdin:
        hook = subprocess.Popen(
            box.cmd(["hook", "createRuntime"]),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            env=box.env(None, {"JOBNS_TEST_PAUSE_IN": "hook-bind"}),
        )
    try:
        child = _stopped_child(hook.pid)
        (c.rootfs / "tmp").rename(c.rootfs / "tmp.old")
        os.symlink("/etc", c.rootfs / "tmp")
        os.kill(child, signal.SIGCONT)
        out, err = hook.communicate(timeout=60)
    finally:
        if hook.poll() is None:
            hook.kill()
            hook.wait()
    r = subprocess.CompletedProcess(hook.args, hook.returncode, out, err)
    one_line_error(
        r, f"bind {box.local}/job-SW1/tmp over {c.rootfs}/tmp: the mount point was replaced"
    )
    assert mounts_under(c) == []
    assert os.listdir(c.rootfs / "tmp.old") == []
    assert "/etc" not in [ln.split()[4] for ln in c.sh("cat /proc/self/mountinfo").splitlines()]
    assert host_mounts(box) == mounts_before
    assert box.leftovers() == [] and holds_left(box) == [] and holders() == []


class SharedContainer(Container):
    """A container whose rootfs mount is a peer of the host's (rootfsPropagation shared)."""

    def start(self) -> int:
        subprocess.run(["mount", "--bind", str(self.rootfs), str(self.rootfs)], check=True)
        subprocess.run(["mount", "--make-shared", str(self.rootfs)], check=True)
        mine = os.stat("/proc/self/ns/mnt").st_ino
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "unchanged", "sleep", "300"]
        )
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{self.proc.pid}/ns/mnt").st_ino == mine:
            assert time.monotonic() < deadline, "unshare did not enter a mount namespace"
            time.sleep(0.005)
        return self.proc.pid

    def stop(self) -> None:
        super().stop()
        subprocess.run(["umount", "-R", "-l", str(self.rootfs)], capture_output=True, check=False)


def test_shared_rootfs_mount_gets_no_bind_on_the_host(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """Attack: bob's container's root file system is a shared mount, a peer of the host's
    (rootfsPropagation shared; Podman sets it for an rshared volume): the hook's binds
    propagated out of the container onto the host, where they stayed after it ended.
    Fixed: the hook refuses to bind on a shared mount."""
    _, bob = users
    c = SharedContainer(
        box,
        "bob9",
        annotations={"org.jobns.job-id": "SH1"},
        process={"args": ["sh"], "env": ["PATH=/bin"], "user": {"uid": bob.uid, "gid": bob.gid}},
    )
    made.append(c)
    c.start()
    mounts_before = host_mounts(box)
    one_line_error(c.hook(), f"{c.rootfs}/tmp is on a shared mount")
    assert host_mounts(box) == mounts_before
    assert [p for p in mounts_under(c) if p != str(c.rootfs)] == []
    c.stop()
    assert box.leftovers() == [] and holds_left(box) == [] and holders() == []
    assert not [ln for ln in host_mounts(box) if str(c.rootfs) in ln]


def test_oci_config_dry_run_shows_no_other_users_job(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """Attack: a dry run of oci-config for bob's bundle with alice's prolog job printed
    the config.json that binds her directories. Fixed: refused like the real run."""
    alice, bob = users
    prolog(box, "DR1", alice)
    c = container(box, made, "bob10", bob.uid, bob.gid)
    r = box.run(["oci-config", "--dry-run", "--job-id", "DR1", str(c.bundle)])
    refused(r, f"bundle {c.bundle}", bob.uid, alice.uid)
    assert json.loads((c.bundle / "config.json").read_text()) == c.config
    assert box.run(["teardown", "--job-id", "DR1"]).returncode == 0
