"""Disk-backed tmp capacities (issue 12): a loop-mounted image per job, for real (root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts

pytestmark = pytest.mark.root

MI = 1024**2


def disk_config(box: Sandbox, extra: str = "") -> Path:
    base = box.root / "scratch"
    box.write_config(f'[capacity]\ntmp_backing = "disk"\nscratch_base = "{base}"\n' + extra)
    return base


def loops_under(base: Path) -> list[str]:
    out = []
    for name in os.listdir("/sys/block"):
        try:
            back = Path(f"/sys/block/{name}/loop/backing_file").read_text().strip()
        except OSError:
            continue
        if back.startswith(str(base) + "/"):
            out.append(f"{name} {back}")
    return out


def loop_mounts(box: Sandbox) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln for ln in f if str(box.root) in ln and "/dev/loop" in ln]


def assert_nothing_left(box: Sandbox, base: Path) -> None:
    for _ in range(50):  # autoclear and the release process finish asynchronously
        if not loops_under(base):
            break
        time.sleep(0.1)
    assert loops_under(base) == []
    assert loop_mounts(box) == []
    assert not base.exists() or sorted(os.listdir(base)) == []
    assert box.leftovers() == []
    assert job_mounts(box) == []


def setup(
    box: Sandbox, job: str, user: OsUser, directives: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return box.run(
        ["setup", "--job-id", job, "--user", user.name, "--directives", directives], env=env
    )


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_disk_capacity_is_enospc_at_the_limit_and_node_disk_untouched(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    base = disk_config(sandbox)
    r = setup(sandbox, "d1", alice, "tmp capacity=64MiB")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    image = base / "jobns-local-d1.img"
    rec = json.loads((sandbox.state / "jobs" / "d1" / "state.json").read_text())
    assert [t.get("image") for t in rec["trees"] if t["role"] == "local"] == [str(image)]
    assert image.stat().st_size == 64 * MI and image.stat().st_blocks * 512 < 16 * MI
    (line,) = loop_mounts(sandbox)
    assert "nosuid" in line and "nodev" in line and " ext4 " in line
    node_before = free_bytes(base)
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "d1",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/big bs=4k count=25600 status=none; echo rc=$?; "
            "echo x > /var/tmp/small; echo small=$?; stat -c '%s %u' /tmp/big; "
            "stat -c %u /tmp; df -B1 --output=size /tmp | tail -1",
        ],
        user=alice,
    )
    assert "No space left on device" in r.stderr, r.stderr
    out = r.stdout.split()
    assert "rc=1" in out, r.stdout  # (a tiny file may still fit in ext4's metadata reserve)
    big = int(out[2])
    assert 50 * MI < big <= 64 * MI and out[3] == str(alice.uid) and out[4] == str(alice.uid)
    assert int(out[5]) <= 64 * MI
    # The job's bytes are in its image (at most its size), not anywhere else on the node.
    assert node_before - free_bytes(base) <= 64 * MI
    t0 = time.monotonic()
    r = sandbox.run(["teardown", "--job-id", "d1"])
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 5
    assert not image.exists()
    for _ in range(50):  # the release process truncates the image once teardown exits
        if free_bytes(base) >= node_before - MI:
            break
        time.sleep(0.1)
    assert free_bytes(base) >= node_before - MI  # the space came back
    assert_nothing_left(sandbox, base)


def test_disk_capacity_from_the_slurm_comment_and_dry_run(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    base = disk_config(sandbox, 'fs_type = "xfs"\n')
    r = sandbox.run(
        ["setup", "--job-id", "d2", "--user", users[0].name, "--dry-run"],
        env={"SLURM_JOB_COMMENT": "jobns: tmp capacity=300MiB"},
    )
    assert r.returncode == 0, r.stderr
    assert f"image  {base}/jobns-local-JOB.img: sparse file of {300 * MI} bytes" in r.stdout
    assert "xfs in it" in r.stdout and "loop device (autoclear)" in r.stdout
    r = sandbox.run(
        ["setup", "--job-id", "d2", "--user", users[0].name],
        env={"SLURM_JOB_COMMENT": "jobns: tmp capacity=300MiB"},
    )
    assert r.returncode == 0, r.stderr
    (line,) = loop_mounts(sandbox)
    assert " xfs " in line
    st = os.statvfs(sandbox.local / "job-d2")
    assert 200 * MI < st.f_blocks * st.f_frsize <= 300 * MI  # less xfs's log
    assert sandbox.run(["teardown", "--job-id", "d2"]).returncode == 0
    assert_nothing_left(sandbox, base)


def test_two_jobs_and_the_node_cap(sandbox: Sandbox, users: list[OsUser]) -> None:
    alice, bob = users[0], users[1]
    base = disk_config(sandbox)
    base.mkdir(mode=0o700)
    free = free_bytes(base)
    # Reserve all but 200 MiB: two 64 MiB jobs fit, a third 100 MiB one does not.
    disk_config(sandbox, f"node_reserve = {free - 200 * MI}\n")
    # Two prologs at once (the node cap is checked under the scratch base's lock).
    procs = [
        sandbox.popen(
            ["setup", "--job-id", job, "--user", who.name, "--directives", "tmp capacity=64MiB"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for job, who in (("d3", alice), ("d4", bob))
    ]
    for p in procs:
        _out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert len(loop_mounts(sandbox)) == 2
    r = setup(sandbox, "d5", alice, "tmp capacity=100MiB")
    assert r.returncode == 0, r.stderr  # refused: the job fails, not the node
    assert "does not fit on this node" in r.stderr and "refused the job" in r.stderr
    r = sandbox.run(["run", "--job-id", "d5", "--", "true"], user=alice)
    assert r.returncode == 125 and "does not fit on this node" in r.stderr
    assert sorted(p.name for p in base.iterdir()) == ["jobns-local-d3.img", "jobns-local-d4.img"]
    # Each job sees only its own file system.
    r = sandbox.run(
        ["run", "--job-id", "d3", "--", "sh", "-c", "echo a > /tmp/a; ls /tmp"], user=alice
    )
    assert r.stdout.split() == ["a", "pmix"], r.stderr  # pmix/: jobns run's PMIx dirs
    r = sandbox.run(["run", "--job-id", "d4", "--", "ls", "/tmp"], user=bob)
    assert r.stdout.split() == ["pmix"], r.stderr
    for job in ("d3", "d4", "d5"):
        assert sandbox.run(["teardown", "--job-id", job]).returncode == 0
    assert_nothing_left(sandbox, base)


@pytest.mark.parametrize("layout", ["shared_tmpdir", "shared_tmpdir=per-node"])
def test_shared_layouts_refuse_a_tmp_capacity(
    sandbox: Sandbox, users: list[OsUser], layout: str
) -> None:
    base = disk_config(sandbox)
    r = setup(sandbox, "d6", users[0], f"tmp capacity=64MiB; {layout}")
    assert r.returncode == 0 and "tmp capacity needs the local layout" in r.stderr
    assert sandbox.run(["teardown", "--job-id", "d6"]).returncode == 0
    assert_nothing_left(sandbox, base)


STEPS = ["staging-in", "image-made", "fs-made", "loop-attached", "mounted"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("then", ["recover", "gc"])
def test_sigkill_of_setup_at_each_step_then_recover_or_gc(
    sandbox: Sandbox, users: list[OsUser], step: str, then: str
) -> None:
    alice = users[0]
    base = disk_config(sandbox)
    killed_at(
        sandbox,
        ["setup", "--job-id", "d7", "--user", alice.name, "--directives", "tmp capacity=64MiB"],
        step,
    )
    if then == "recover":
        r = sandbox.run(["recover"])
        assert r.returncode == 0, r.stderr
        assert "set up again: running" in r.stdout, r.stdout
        assert len(loop_mounts(sandbox)) == 1  # a fresh image, mounted once
        for _ in range(50):  # the killed setup's device clears itself (autoclear)
            if len(loops_under(base)) == 1:
                break
            time.sleep(0.1)
        assert len(loops_under(base)) == 1, loops_under(base)
        assert sandbox.run(["teardown", "--job-id", "d7"]).returncode == 0
    else:
        r = sandbox.run(["gc", "--no-slurm"])
        assert r.returncode == 0, (r.stdout, r.stderr)
    assert_nothing_left(sandbox, base)
    # A second job of the same id starts from nothing of the first.
    assert setup(sandbox, "d7", alice, "tmp capacity=64MiB").returncode == 0
    r = sandbox.run(["run", "--job-id", "d7", "--", "ls", "-A", "/tmp"], user=alice)
    assert r.stdout == "pmix\n", r.stdout  # only what this run made
    assert sandbox.run(["teardown", "--job-id", "d7"]).returncode == 0
    assert_nothing_left(sandbox, base)


@pytest.mark.parametrize("step", ["post-run", "teardown", "capacity-detached"])
@pytest.mark.parametrize("then", ["teardown", "gc"])
def test_sigkill_of_teardown_at_each_step_then_teardown_or_gc(
    sandbox: Sandbox, users: list[OsUser], step: str, then: str
) -> None:
    base = disk_config(sandbox)
    assert setup(sandbox, "d8", users[0], "tmp capacity=64MiB").returncode == 0
    killed_at(sandbox, ["teardown", "--job-id", "d8"], step)
    r = sandbox.run(["teardown", "--job-id", "d8"] if then == "teardown" else ["gc", "--no-slurm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert_nothing_left(sandbox, base)
    # The same job id again starts from nothing.
    assert setup(sandbox, "d8", users[0], "tmp capacity=64MiB").returncode == 0
    r = sandbox.run(["run", "--job-id", "d8", "--", "ls", "-A", "/tmp"], user=users[0])
    assert r.stdout == "pmix\n", r.stdout
    assert sandbox.run(["teardown", "--job-id", "d8"]).returncode == 0
    assert_nothing_left(sandbox, base)


def test_gc_reclaims_images_and_loop_mounts_no_record_names(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """After a reboot (or /run wiped): images with no record, one of them still loop-
    mounted; a live job's image is kept."""
    base = disk_config(sandbox)
    assert setup(sandbox, "d9", users[0], "tmp capacity=64MiB").returncode == 0
    for job in ("x1", "x2"):
        img = base / f"jobns-local-{job}.img"
        subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(img)], check=True)
    point = sandbox.root / "mnt"
    point.mkdir()
    subprocess.run(
        ["mount", "-o", "loop", str(base / "jobns-local-x2.img"), str(point)], check=True
    )
    r = sandbox.run(["gc", "--no-slurm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"removed the disk capacity {base}/jobns-local-x1.img" in r.stdout, r.stdout
    assert f"removed the disk capacity {base}/jobns-local-x2.img" in r.stdout, r.stdout
    assert sorted(p.name for p in base.iterdir()) == ["jobns-local-d9.img"]
    assert len(loop_mounts(sandbox)) == 1  # d9's
    assert sandbox.run(["teardown", "--job-id", "d9"]).returncode == 0
    point.rmdir()
    assert_nothing_left(sandbox, base)


def killed_at(box: Sandbox, args: list[str], step: str) -> None:
    """Run jobns args with a pause point at step, and SIGKILL it there."""
    proc = box.popen(
        args, env={"JOBNS_TEST_PAUSE_IN": step}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _kill_when_stopped(proc)


def _kill_when_stopped(proc: subprocess.Popen[str]) -> None:
    for _ in range(300):
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                break
        if proc.poll() is not None:
            raise AssertionError(
                f"exited {proc.returncode} before its pause point: {proc.communicate()}"
            )
        time.sleep(0.05)
    else:
        raise AssertionError("never reached its pause point")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def test_shm_size_from_a_fraction_of_the_memory_cgroup(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    limit = sandbox.root / "cg-%j"
    (sandbox.root / "cg-43").write_text(f"{8 * MI}\n")
    sandbox.write_config(
        f'[capacity]\nshm_memory_fraction = 0.5\nmemory_cgroup = "{limit}"\nshm_max = "3MiB"\n'
    )
    assert sandbox.run(["setup", "--job-id", "43", "--user", users[0].name]).returncode == 0
    st = os.statvfs(sandbox.shm / "job-43")
    assert st.f_blocks * st.f_frsize == 3 * MI  # half of 8 MiB, capped at shm_max
    (sandbox.root / "cg-44").write_text("max\n")
    assert sandbox.run(["setup", "--job-id", "44", "--user", users[0].name]).returncode == 0
    assert " - tmpfs jobns-shm-44 " not in Path("/proc/self/mountinfo").read_text()
    for job in ("43", "44"):
        assert sandbox.run(["teardown", "--job-id", job]).returncode == 0
    assert sandbox.leftovers() == []


def test_status_shows_capacity_backing_and_use(sandbox: Sandbox, users: list[OsUser]) -> None:
    base = disk_config(sandbox)
    assert setup(sandbox, "d10", users[0], "tmp capacity=64MiB; shm capacity=1MiB").returncode == 0
    r = sandbox.run(
        ["run", "--job-id", "d10", "--", "sh", "-c", "head -c 3000000 /dev/urandom > /tmp/x"],
        user=users[0],
    )
    assert r.returncode == 0, r.stderr
    r = sandbox.run(["status"])
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("d10 ")]
    assert "tmp 64.0MiB disk, shm 1.0MiB tmpfs" in line, line
    used = line.split()[5]  # JOB USER STATE DATE TIME USED
    assert used.endswith("MiB") and 2.5 <= float(used[:-3]) < 10, line
    assert sandbox.run(["teardown", "--job-id", "d10"]).returncode == 0
    assert_nothing_left(sandbox, base)


def test_a_held_file_system_does_not_stop_teardown_and_is_shut_down(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Rule 6: alice keeps a file of her disk capacity open from the host; teardown still
    detaches it and unlinks the image at once, the held file system is shut down (her
    reads fail), and the loop device goes when she lets go."""
    alice = users[0]
    base = disk_config(sandbox)
    assert setup(sandbox, "d11", alice, "tmp capacity=64MiB").returncode == 0
    tmp = sandbox.local / "job-d11" / "tmp"
    holder = subprocess.Popen(
        [
            "sh",
            "-c",
            "head -c 40000000 /dev/urandom > big; exec 3<big; echo ready; "
            "read x; cat <&3 > /dev/null; echo rc=$?",
        ],
        cwd=tmp,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **Sandbox.creds(alice),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        subprocess.run(["sync"], check=True)
        image = base / "jobns-local-d11.img"
        assert image.stat().st_blocks * 512 > 30 * MI
        r = sandbox.run(["teardown", "--job-id", "d11"])
        assert r.returncode == 0, r.stderr
        assert not image.exists() and loop_mounts(sandbox) == []
        assert len(loops_under(base)) == 1  # she still holds it
        out, err = holder.communicate("\n", timeout=30)
        assert "rc=0" not in out, (out, err)  # shut down: her reads fail
    finally:
        holder.kill()
        holder.wait()
    assert_nothing_left(sandbox, base)


@pytest.mark.parametrize(("fstype", "too_small"), [("ext4", 60 * 1024), ("xfs", 300 * MI - 4096)])
def test_the_file_system_minimums_hold_for_this_mkfs(
    tmp_path: Path, fstype: str, too_small: int
) -> None:
    """launcher.model.config.FS_MIN_BYTES against the real mkfs, with make_fs's options: the
    minimum is made (and mounts, with room for the job's directories); below the real
    limit mkfs fails, which is why setup rounds a smaller request up."""
    from jobns.launcher.backing import diskimage
    from jobns.launcher.model.config import FS_MIN_BYTES
    from jobns.launcher.system.errors import JobnsError

    image = tmp_path / "x.img"
    image.touch()
    os.truncate(image, too_small)
    with pytest.raises(JobnsError, match=f"mkfs.{fstype}") as e:
        diskimage.make_fs(str(image), fstype, 0, 0)
    assert "\n" not in str(e.value)  # one line, not mkfs.xfs's usage text
    os.truncate(image, FS_MIN_BYTES[fstype])
    diskimage.make_fs(str(image), fstype, 0, 0)
    point = tmp_path / "m"
    point.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    try:
        for d in ("tmp", "var_tmp", "tmp/pmix", "tmp/pmix/a", "tmp/pmix/b"):
            (point / d).mkdir()
        (point / "tmp" / "f").write_bytes(b"x" * 4096)
        assert os.statvfs(point).f_favail >= 50
    finally:
        subprocess.run(["umount", str(point)], check=True)
