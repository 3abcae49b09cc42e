"""Attacks on the CDI path (jobns/launcher/mountns/cdi.py): a job's spec and the hook it carries.

jobnsalice owns the job; jobnsbob attacks it. A CDI spec is a list of edits an engine
applies to any container that names the device, so the spec's createRuntime hook
(`jobns hook --job-id JOB createRuntime`) is where rule 7 is kept: the stand-in
container of tests/integration/test_hook.py runs it as a runtime would. The spec itself
must only ever name the job's verified trees, even if alice renames her tree root (she
owns it, in a sticky directory) while setup writes the spec.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts, require
from tests.e2e import test_cdi as e2e_cdi
from tests.e2e.test_cdi import podman, run
from tests.e2e.test_oci_runtimes import Rig, start, wait_for
from tests.integration.test_hook import Container, holds_left, host_mounts, one_line_error
from tests.security.conftest import snapshot

pytestmark = pytest.mark.root


@pytest.fixture
def box(sandbox: Sandbox) -> Iterator[Sandbox]:
    require(os.path.exists("/usr/bin/nsenter"), "nsenter (util-linux) missing")
    cdi = sandbox.root / "cdi"
    cdi.mkdir(mode=0o755)
    sandbox.write_config(f'[cdi]\ndir = "{cdi}"\n')
    yield sandbox
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True, check=False)


@pytest.fixture
def made(box: Sandbox) -> Iterator[list[Container]]:
    out: list[Container] = []
    yield out
    for c in out:
        c.stop()


def cdi_hook(c: Container, job: str) -> subprocess.CompletedProcess[str]:
    """The hook exactly as a job's spec names it."""
    cmd = c.box.cmd(["hook", "--job-id", job, "createRuntime"])
    return subprocess.run(
        cmd,
        input=c.state("creating").decode(),
        capture_output=True,
        text=True,
        timeout=60,
        env=c.box.env(None, None),
        cwd="/",
    )


def container(
    box: Sandbox, made: list[Container], cid: str, user: tuple[int, int], **kw: Any
) -> Container:
    c = Container(
        box,
        cid,
        process={"args": ["sh"], "env": ["PATH=/bin"], "user": {"uid": user[0], "gid": user[1]}},
        **kw,
    )
    made.append(c)
    return c


def setup(box: Sandbox, job: str, user: OsUser) -> None:
    r = box.run(["setup", "--job-id", job, "--user", user.name])
    assert r.returncode == 0, r.stderr


def test_bobs_or_roots_container_naming_alices_device_gets_nothing(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """Attack: bob's container (or a root one) asks for alice's CDI device. The engine
    applies the spec's mounts; the spec's hook refuses the container (exit 125 aborts it)
    before its process runs, naming both uids and the fix."""
    alice, bob = users
    setup(box, "CD1", alice)
    try:
        for cid, ids in (("bobc", (bob.uid, bob.gid)), ("rootc", (0, 0))):
            c = container(box, made, cid, ids)
            c.start()
            before = host_mounts(box)
            r = cdi_hook(c, "CD1")
            one_line_error(
                r,
                f"container {cid} runs as uid {ids[0]} (process.user, mapped to "
                f"the host), but job CD1 belongs to {alice.name} (uid "
                f"{alice.uid})",
            )
            assert host_mounts(box) == before
        # Alice's own container passes, and sees her directories bound.
        c = container(box, made, "alicec", (alice.uid, alice.gid))
        c.start()
        r = cdi_hook(c, "CD1")
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        inside = c.inside("tmp")
        tree = os.stat(box.local / "job-CD1" / "tmp")
        assert (inside.st_dev, inside.st_ino) == (tree.st_dev, tree.st_ino)
        assert holds_left(box) == []  # a prolog's job: no holder
    finally:
        assert box.run(["teardown", "--job-id", "CD1"]).returncode == 0
    assert not (box.root / "cdi" / "jobns-CD1.json").exists()
    assert box.leftovers() == []


def test_the_hook_refuses_a_job_that_is_not_set_up(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """--job-id never makes a standalone job: a spec left behind (or hand-written) for a
    job that is gone gives a container nothing, and creates nothing."""
    alice = users[0]
    c = container(box, made, "late", (alice.uid, alice.gid))
    c.start()
    one_line_error(cdi_hook(c, "CD2"), "container late: job CD2 is not set up on this node")
    assert box.leftovers() == [] and holds_left(box) == []


def _stopped(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, "setup did not stop at its pause point"
        time.sleep(0.01)


def test_a_tree_swapped_before_the_spec_is_written_is_never_named(
    box: Sandbox, users: list[OsUser]
) -> None:
    """Attack: alice renames her tree root away and puts a link to a directory of her
    choice in its place just before setup writes the spec (the pause point stands for
    winning the race), hoping the spec binds that directory into her containers as the
    job's. Setup checks every host path against the tree it verified by fd: no spec is
    written, and her job (not the node) fails: setup exits 0, the job is refused."""
    alice = users[0]
    decoy = box.root / "decoy"
    for d in ("tmp", "var_tmp"):
        (decoy / d).mkdir(parents=True)
    os.chown(decoy, alice.uid, alice.gid)
    setup_proc = box.popen(
        ["setup", "--job-id", "CD3", "--user", alice.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"JOBNS_TEST_PAUSE_IN": "cdi"},
    )
    try:
        _stopped(setup_proc.pid)
        tree = box.local / "job-CD3"
        swap_for_links(alice, [(tree, decoy)])
        os.kill(setup_proc.pid, signal.SIGCONT)
        _, err = setup_proc.communicate(timeout=60)
    finally:
        if setup_proc.poll() is None:
            setup_proc.kill()
            setup_proc.wait()
    assert setup_proc.returncode == 0, err  # her job is failed, not the node
    assert "is not the job's verified directory" in err or "moved while setting up" in err, err
    assert list((box.root / "cdi").iterdir()) == []
    status = box.run(["status", "--json"])
    assert "refused" in json.dumps(
        [j for j in json.loads(status.stdout)["jobs"] if "CD3" in json.dumps(j)]
    ), status.stdout
    assert box.run(["teardown", "--job-id", "CD3"]).returncode == 0


def test_a_spec_directory_others_can_write_is_refused(box: Sandbox, users: list[OsUser]) -> None:
    """A spec directory anybody can write is anybody's devices: setup refuses to use it
    (a fault of the node's config: loud), and writes nothing there."""
    alice = users[0]
    cdi = box.root / "cdi"
    cdi.chmod(0o777)
    r = box.run(["setup", "--job-id", "CD4", "--user", alice.name])
    assert r.returncode == 125, r.stderr
    assert f"refuse CDI spec directory {cdi}: not owned by root or writable by others" in r.stderr
    assert list(cdi.iterdir()) == []
    box.run(["teardown", "--job-id", "CD4"])
    assert box.leftovers() == []


def test_already_bound_never_skips_the_check_of_a_linked_rootfs(
    box: Sandbox, made: list[Container], users: list[OsUser]
) -> None:
    """The hook forks no bind child when the engine bound exactly the job's trees; that
    shortcut must not skip the rootfs checks: alice's own container whose rootfs is her
    symbolic link, with the job's trees bound under the link's target, is still refused
    as before (root follows only root's links on the way to a rootfs)."""
    alice = users[0]
    setup(box, "CD5", alice)
    try:
        c = container(box, made, "linked", (alice.uid, alice.gid))
        real = box.root / "real-rootfs"
        c.rootfs.rename(real)
        # Relative: an absolute link seen through /proc/PID/root resolves in the caller's
        # namespace, which would hide the binds from the shortcut anyway.
        os.symlink(os.path.relpath(real, c.rootfs.parent), c.rootfs)
        os.lchown(c.rootfs, alice.uid, alice.gid)
        pid = c.start()
        tree = box.local / "job-CD5"
        for target, source in (
            ("tmp", tree / "tmp"),
            ("var/tmp", tree / "var_tmp"),
            ("dev/shm", box.shm / "job-CD5"),
        ):
            subprocess.run(
                [
                    "nsenter",
                    "-t",
                    str(pid),
                    "-m",
                    "mount",
                    "--rbind",
                    str(source),
                    str(real / target),
                ],
                check=True,
            )
        one_line_error(
            cdi_hook(c, "CD5"), f"{c.rootfs}: it is a symbolic link owned by uid {alice.uid}"
        )
    finally:
        for c in made:
            c.stop()
        assert box.run(["teardown", "--job-id", "CD5"]).returncode == 0
    assert box.leftovers() == []


# ------------------------------------------------- the spec's host paths, real Podman


@pytest.fixture
def podman_rig(sandbox: Sandbox) -> Iterator[Rig]:
    """Root's Podman with the zero-process spec (owner_check = false): only the spec's
    host paths decide what a container gets."""
    yield from e2e_cdi.podman_rig(sandbox, "owner_check = false\n")


def as_user(user: OsUser, code: str) -> None:
    r = subprocess.run(
        ["/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[user.gid],
        cwd="/",
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def swap_for_links(user: OsUser, pairs: list[tuple[Path, Path]]) -> None:
    """user renames each of her entries aside (<name>.away) and puts a symbolic link to
    the victim's in its place: she owns them, in sticky bases."""
    code = "import os\n" + "".join(
        f"os.rename({str(mine)!r}, {str(mine) + '.away'!r})\n"
        f"os.symlink({str(his)!r}, {str(mine)!r})\n"
        for mine, his in pairs
    )
    as_user(user, code)


def swap_back(user: OsUser, pairs: list[tuple[Path, Path]]) -> None:
    code = "import os\n" + "".join(
        f"os.unlink({str(mine)!r}); os.rename({str(mine) + '.away'!r}, {str(mine)!r})\n"
        for mine, _ in pairs
    )
    as_user(user, code)


def beside_bobs_secrets(
    box: Sandbox, mine: str, his: str, users: list[OsUser]
) -> tuple[list[tuple[Path, Path]], dict[Path, Any]]:
    """Bob's job `his` (a secret in its /tmp, /var/tmp, /dev/shm) and alice's job `mine`,
    set up; the pairs of trees (hers, his) she can swap, and a snapshot of his."""
    alice, bob = users
    setup(box, his, bob)
    setup(box, mine, alice)
    pairs = [
        (box.local / f"job-{mine}", box.local / f"job-{his}"),
        (box.shm / f"job-{mine}", box.shm / f"job-{his}"),
    ]
    secret = "echo secret > /tmp/s; echo secret > /var/tmp/s; echo secret > /dev/shm/s"
    r = box.run(["run", "--job-id", his, "--", "sh", "-c", secret], user=bob)
    assert r.returncode == 0, r.stderr
    return pairs, {p: snapshot(p) for _, p in pairs}


def test_a_link_in_place_of_her_tree_never_gives_her_container_another_jobs_directories(
    podman_rig: Rig, users: list[OsUser]
) -> None:
    """Attack (issue 20, finding 7): with owner_check = false, bob's job runs beside
    alice's; alice renames her trees aside (<local>/job-A, <shm>/job-A: hers, in sticky
    bases) and puts links to bob's trees in their place, then runs her container with
    her job's device. Podman (root) binds the spec's host paths: if they went through
    her trees it would follow her links and give her container bob's /tmp, /var/tmp and
    /dev/shm. Defence: the spec names root's own mount points (<state_dir>/cdi/JOB/...,
    root's all the way), onto which setup bound the verified trees by fd: her container
    sees her own (empty) directories, bob's files are neither read nor written."""
    rig = podman_rig
    alice = users[0]
    mine, his = rig.job(11), rig.job(12)
    box = rig.box
    pairs, before = beside_bobs_secrets(box, mine, his, users)
    swapped = False
    try:
        swap_for_links(alice, pairs)
        swapped = True
        script = (
            "for d in /tmp /var/tmp /dev/shm; do cat $d/s 2>/dev/null; "
            "echo pwned > $d/p 2>/dev/null; ls -A $d; done"
        )
        r = run(podman(rig, f"jobns-{rig.tag}-swap", mine, script, rig.rootfs_copy("s"), alice))
        assert "secret" not in r.stdout, r.stdout  # bob's files: not read...
        assert {p: snapshot(p) for _, p in pairs} == before  # ...nor written
        assert r.returncode == 0, r.stderr
        # Her container wrote into her own, real trees.
        away = box.local / f"job-{mine}.away"
        assert (away / "tmp" / "p").read_text() == "pwned\n"
        assert (box.shm / f"job-{mine}.away" / "p").read_text() == "pwned\n"
        swap_back(alice, pairs)
        swapped = False
    finally:
        if swapped:
            swap_back(alice, pairs)
        for job in (mine, his):
            assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert rig.clean(), box.leftovers()
    assert [m for m in job_mounts(box) if "/cdi/" in m] == []


def test_teardown_detaches_the_spec_mount_points_while_her_container_holds_files_in_them(
    podman_rig: Rig, users: list[OsUser]
) -> None:
    """Rule 6 with the spec's mount points: alice's container, started through them,
    keeps files open in its /tmp and /dev/shm (both capacities) and its working
    directory in /tmp while the job is torn down. Teardown still exits 0 and leaves
    nothing on the host: the mount points are detached before the trees are removed,
    the capacities are unmounted, the trees and the area under <state_dir>/mounts gone."""
    rig = podman_rig
    alice = users[0]
    job = rig.job(13)
    box = rig.box
    r = box.run(
        [
            "setup",
            "--job-id",
            job,
            "--user",
            alice.name,
            "--directives",
            "shm capacity=16MiB; tmp capacity=16MiB",
        ]
    )
    assert r.returncode == 0, r.stderr
    name = f"jobns-{rig.tag}-held"
    script = (
        "cd /tmp; exec 3>/tmp/held 4>/dev/shm/held; echo x >&3; echo x >&4; "
        "echo ready > /tmp/ready; exec sleep 600"
    )
    p = start(podman(rig, name, job, script, rig.rootfs_copy("h"), alice))
    try:
        wait_for(box.local / f"job-{job}" / "tmp" / "ready", timeout=60)
        points = box.state / "mounts" / job / "cdi"
        assert [m for m in job_mounts(box) if f"{points}/" in m], "no mount points to detach"
        r = box.run(["teardown", "--job-id", job])
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert p.poll() is None  # the container still runs, holding its files
        assert job_mounts(box) == []
        assert not (box.state / "mounts" / job).exists()
        assert box.leftovers() == []
    finally:
        subprocess.run(["podman", "rm", "-f", "--time", "0", name], capture_output=True)
        p.wait(timeout=60)
