"""CDI: `jobns setup` writes a spec per job; `podman run --device jobns.dev/job=JOB` gets the
job's directories and environment from it (real Podman 4.3 with runc). Root only.

The spec directory is the real /var/run/cdi (Podman reads only /etc/cdi and /var/run/cdi);
every job id here is unique to the test (E<sandbox tag>-N), so concurrent sessions do not
meet, and every test checks that its specs are gone at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import JOBNS, OsUser, Sandbox, job_mounts
from tests.e2e.test_oci_runtimes import (
    GATE_LOOP,
    Rig,
    aborted,
    busybox_rootfs,
    need,
    start,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.runtime]

CDI_DIR = Path("/var/run/cdi")


@pytest.fixture
def cdi(sandbox: Sandbox) -> Iterator[Rig]:
    yield from podman_rig(sandbox)


def podman_rig(sandbox: Sandbox, config: str = "") -> Iterator[Rig]:
    """Root's Podman (runc, cgroupfs: MACHINE.md) reading the real /var/run/cdi, where
    setup writes each job's spec; config: more [cdi] keys."""
    need("podman")
    need("runc")
    rig = Rig(sandbox, busybox_rootfs())
    sandbox.write_config(f'[cdi]\ndir = "{CDI_DIR}"\n{config}')
    yield rig
    for name in rig.podman_names:
        subprocess.run(["podman", "rm", "-f", "--time", "0", name], capture_output=True)
    for p in CDI_DIR.glob(f"jobns-E{rig.tag}-*.json"):  # a failed test's leftovers
        p.unlink()
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True)


def spec_path(job: str) -> Path:
    return CDI_DIR / f"jobns-{job}.json"


def podman(
    rig: Rig,
    name: str,
    job: str,
    script: str,
    rootfs: Path,
    user: OsUser | None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    rig.podman_names.append(name)
    empty = rig.box.root / "no-hooks.d"
    empty.mkdir(exist_ok=True)
    who = ("--user", f"{user.uid}:{user.gid}") if user is not None else ()
    return [
        "podman",
        "--runtime",
        "runc",
        "--cgroup-manager=cgroupfs",
        "run",
        "--rm",
        "--name",
        name,
        "--network=none",
        "--hooks-dir",
        str(empty),
        "--device",
        f"jobns.dev/job={job}",
        *who,
        *extra,
        "--rootfs",
        str(rootfs),
        "sh",
        "-c",
        script,
    ]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd="/", stdin=subprocess.DEVNULL
    )


def setup(rig: Rig, job: str, user: OsUser) -> None:
    r = rig.box.run(["setup", "--job-id", job, "--user", user.name])
    assert r.returncode == 0, r.stderr


def teardown(rig: Rig, job: str) -> None:
    r = rig.box.run(["teardown", "--job-id", job])
    assert r.returncode == 0, r.stderr


def test_setup_writes_the_spec_and_teardown_removes_it(cdi: Rig, users: list[OsUser]) -> None:
    alice = users[0]
    job = cdi.job(1)
    setup(cdi, job, alice)
    try:
        p = spec_path(job)
        st = p.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
        doc = json.loads(p.read_text())
        assert (doc["cdiVersion"], doc["kind"]) == ("0.5.0", "jobns.dev/job")
        [dev] = doc["devices"]
        assert dev["name"] == job
        edits = dev["containerEdits"]
        # Root's mount points, the job's trees bound there (a path through her trees could
        # be swapped for a link: tests/security/test_cdi_attacks.py).
        points = cdi.box.state / "mounts" / job / "cdi"
        assert [(m["containerPath"], m["hostPath"], m["options"]) for m in edits["mounts"]] == [
            ("/tmp", f"{points}/0-tmp", ["rbind", "nosuid", "nodev"]),
            ("/var/tmp", f"{points}/1-var-tmp", ["rbind", "nosuid", "nodev"]),
            ("/dev/shm", f"{points}/2-dev-shm", ["rbind", "nosuid", "nodev"]),
        ]
        env = dict(e.split("=", 1) for e in edits["env"])
        assert (env["TMPDIR"], env["JOBNS_JOB_ID"]) == ("/tmp", job)
        [hook] = edits["hooks"]
        assert hook == {
            "hookName": "createRuntime",
            "path": JOBNS,
            "args": [
                "jobns",
                "hook",
                "--config",
                str(cdi.box.config),
                "--job-id",
                job,
                "createRuntime",
            ],
        }
        # Atomic: no temporary name is left in the spec directory.
        assert not [n for n in os.listdir(CDI_DIR) if n.startswith(f".jobns-{job}")]
    finally:
        teardown(cdi, job)
    assert not spec_path(job).exists()
    assert not (cdi.box.state / "mounts" / job).exists()
    assert job_mounts(cdi.box) == []
    assert cdi.clean(), (cdi.box.leftovers(), cdi.holds_left())


def test_containers_and_a_task_of_a_job_share_and_another_job_does_not(
    cdi: Rig, users: list[OsUser]
) -> None:
    alice = users[0]
    j1, j2 = cdi.job(2), cdi.job(3)
    setup(cdi, j1, alice)
    setup(cdi, j2, alice)
    rootfs = cdi.rootfs_copy("c")
    tree = cdi.box.local / f"job-{j1}" / "tmp"
    a = start(
        podman(
            cdi,
            f"jobns-{cdi.tag}-ca",
            j1,
            "echo $TMPDIR $JOBNS_JOB_ID > /tmp/a; echo s > /dev/shm/s; "
            + GATE_LOOP
            + "; cat /tmp/b /tmp/t",
            rootfs,
            alice,
        )
    )
    try:
        wait_for(tree / "a", timeout=60)
        assert (cdi.box.shm / f"job-{j1}" / "s").read_text() == "s\n"
        b = run(
            podman(cdi, f"jobns-{cdi.tag}-cb", j1, "cat /tmp/a; echo b > /tmp/b", rootfs, alice)
        )
        assert (b.returncode, b.stdout) == (0, f"/tmp {j1}\n"), b.stderr
        t = cdi.box.run(
            ["run", "--job-id", j1, "--", "sh", "-c", "cat /tmp/a; echo t > /tmp/t"],
            user=alice,
            cwd="/",
        )
        assert (t.returncode, t.stdout) == (0, f"/tmp {j1}\n"), t.stderr
        c = run(
            podman(cdi, f"jobns-{cdi.tag}-cc", j2, "ls -A /tmp /var/tmp /dev/shm", rootfs, alice)
        )
        assert c.returncode == 0, c.stderr
        assert sorted(c.stdout.split()) == ["/dev/shm:", "/tmp:", "/var/tmp:"]  # all empty
        (tree / "gate").touch()
        out, err = a.communicate(timeout=120)
        assert (a.returncode, out) == (0, "b\nt\n"), err
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        teardown(cdi, j1)
        teardown(cdi, j2)
    assert not spec_path(j1).exists() and not spec_path(j2).exists()
    assert cdi.clean(), (cdi.box.leftovers(), cdi.holds_left())


def test_another_users_or_roots_container_is_refused(cdi: Rig, users: list[OsUser]) -> None:
    """CDI applies a spec to any container naming the device: the spec's createRuntime hook
    refuses a container whose user is not the job's owner (SECURITY.md rule 7)."""
    alice, bob = users
    job = cdi.job(4)
    setup(cdi, job, alice)
    rootfs = cdi.rootfs_copy("r")
    try:
        for name, user, uid in (("bob", bob, bob.uid), ("root", None, 0)):
            r = run(
                podman(
                    cdi,
                    f"jobns-{cdi.tag}-r{name}",
                    job,
                    "echo ran > /tmp/x; echo ran",
                    rootfs,
                    user,
                )
            )
            aborted(
                r,
                f"runs as uid {uid} (process.user, mapped to the host), but job {job} "
                f"belongs to {alice.name} (uid {alice.uid})",
            )
        assert os.listdir(cdi.box.local / f"job-{job}" / "tmp") == []
    finally:
        teardown(cdi, job)
    assert cdi.clean()


def test_a_job_not_set_up_fails_clearly(cdi: Rig, users: list[OsUser]) -> None:
    alice = users[0]
    job = cdi.job(5)
    setup(cdi, job, alice)
    teardown(cdi, job)
    rootfs = cdi.rootfs_copy("n")
    r = run(podman(cdi, f"jobns-{cdi.tag}-n", job, "echo ran", rootfs, alice))
    assert r.returncode != 0 and "ran" not in r.stdout
    assert f"unresolvable CDI devices jobns.dev/job={job}" in r.stderr, r.stderr
    assert cdi.clean()


def test_without_the_owner_check_no_process_runs(cdi: Rig, users: list[OsUser]) -> None:
    """owner_check = false: the spec has no hook (the zero-process path; its residual risk
    is in SECURITY.md)."""
    alice = users[0]
    cdi.box.write_config(f'[cdi]\ndir = "{CDI_DIR}"\nowner_check = false\n')
    job = cdi.job(6)
    setup(cdi, job, alice)
    rootfs = cdi.rootfs_copy("z")
    try:
        doc = json.loads(spec_path(job).read_text())
        assert "hooks" not in doc["devices"][0]["containerEdits"]
        r = run(
            podman(cdi, f"jobns-{cdi.tag}-z", job, "echo z > /tmp/z; cat /tmp/z", rootfs, alice)
        )
        assert (r.returncode, r.stdout) == (0, "z\n"), r.stderr
        assert (cdi.box.local / f"job-{job}" / "tmp" / "z").read_text() == "z\n"
    finally:
        teardown(cdi, job)
    assert not spec_path(job).exists()
    assert cdi.clean()


def test_gc_removes_a_spec_whose_job_has_no_record(cdi: Rig, users: list[OsUser]) -> None:
    job = cdi.job(7)
    CDI_DIR.mkdir(exist_ok=True)
    spec_path(job).write_text('{"cdiVersion": "0.5.0", "kind": "jobns.dev/job", "devices": []}')
    other = CDI_DIR / f"vendor-E{cdi.tag}.json"  # not ours: never touched
    other.write_text("{}")
    try:
        r = cdi.box.run(["gc", "--no-slurm"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"removing the CDI spec of job {job} (no job record)" in r.stdout
        assert not spec_path(job).exists()
        assert other.exists()
    finally:
        other.unlink()


@pytest.fixture
def cdi_1_0(sandbox: Sandbox) -> Iterator[Rig]:
    yield from podman_rig(sandbox, 'version = "1.0.0"\n')


def test_podman_4_ignores_a_cdi_1_0_spec(cdi_1_0: Rig, users: list[OsUser]) -> None:
    """Why `[cdi] version` is 0.5.0 by default: Podman 4.3 does not resolve the job's device
    from a 1.0.0 spec (Podman 5.8 does: tests/e2e/test_rig_hpc_runtimes.py)."""
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
    if not version.startswith("podman version 4."):
        pytest.skip(f"this is about Podman 4 ({version.strip()} here)")
    alice = users[0]
    job = cdi_1_0.job(8)
    setup(cdi_1_0, job, alice)
    rootfs = cdi_1_0.rootfs_copy("v1")
    try:
        assert json.loads(spec_path(job).read_text())["cdiVersion"] == "1.0.0"
        r = run(podman(cdi_1_0, f"jobns-{cdi_1_0.tag}-v1", job, "echo ran", rootfs, alice))
        assert r.returncode != 0 and "ran" not in r.stdout, r
        assert f"unresolvable CDI devices jobns.dev/job={job}" in r.stderr, r.stderr
    finally:
        teardown(cdi_1_0, job)
    assert cdi_1_0.clean()
