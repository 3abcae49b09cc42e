"""Extra private directories ([[dirs]], issue 12) for real: as root, with ordinary users,
real binds, tmpfs and loop-mounted images."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, job_mounts
from tests.integration.test_disk_capacity import free_bytes, killed_at, loops_under

pytestmark = pytest.mark.root

MI = 1024**2


class Dirs:
    """The sandbox with three [[dirs]] entries: a plain directory (noexec), a tmpfs of
    8 MiB, and a disk image of 32 MiB (ro unless asked otherwise)."""

    def __init__(self, box: Sandbox, disk_options: str = '["ro"]') -> None:
        self.box = box
        self.plain, self.tmpfs, self.disk = (box.root / n for n in ("xplain", "xtmpfs", "xdisk"))
        self.bases = (self.plain, self.tmpfs, self.disk)
        for d in self.bases:
            d.mkdir(mode=0o755)
        self.targets = tuple(box.root / "mnt" / n for n in ("scratch", "fast", "data"))
        for t in self.targets:
            t.mkdir(parents=True)
        self.write(disk_options)

    def write(self, disk_options: str = '["ro"]', before: str = "") -> None:
        p, f, d = self.targets
        self.box.write_config(
            before + f'[[dirs]]\npath = "{p}"\nbase = "{self.plain}"\noptions = ["noexec"]\n'
            f'[[dirs]]\npath = "{f}"\nbase = "{self.tmpfs}"\nbacking = "tmpfs"\nsize = "8MiB"\n'
            f'[[dirs]]\npath = "{d}"\nbase = "{self.disk}"\nbacking = "disk"\nsize = "32MiB"\n'
            f"options = {disk_options}\n"
        )

    def left(self) -> list[str]:
        """Anything of a job in the extra bases, on the host: trees, images, mounts, loops
        (once the epilogs' release processes are done)."""
        self.box.wait_released()
        out = [str(p) for b in self.bases for p in b.iterdir()]
        for _ in range(50):  # autoclear and the release process finish asynchronously
            if not loops_under(self.disk):
                break
            time.sleep(0.1)
        out += loops_under(self.disk)
        out += job_mounts(self.box)
        out += [str(p) for t in self.targets for p in t.iterdir()]  # the host's own, untouched
        return out + self.box.leftovers()


@pytest.fixture
def dirs(sandbox: Sandbox) -> Iterator[Dirs]:
    d = Dirs(sandbox)
    yield d


def setup(box: Sandbox, job: str, user: OsUser) -> subprocess.CompletedProcess[str]:
    return box.run(["setup", "--job-id", job, "--user", user.name])


def in_job(box: Sandbox, job: str, user: OsUser, script: str) -> subprocess.CompletedProcess[str]:
    return box.run(["run", "--job-id", job, "--", "sh", "-c", script], user=user)


def mount_line(mountinfo: str, target: Path) -> list[str]:
    """The mountinfo fields of the one mount at target (other output lines are skipped),
    with the optional fields dropped: [5] the mount's options, [7] fstype, [8] source."""
    (fields,) = [
        f for ln in mountinfo.splitlines() if len(f := ln.split()) > 9 and f[4] == str(target)
    ]
    sep = fields.index("-")
    return [*fields[:6], "-", *fields[sep + 1 :]]


def test_a_set_up_job_sees_its_own_extra_directories_with_their_options(
    dirs: Dirs, users: list[OsUser]
) -> None:
    alice, bob = users
    box = dirs.box
    plain, fast, data = dirs.targets
    assert setup(box, "x1", alice).returncode == 0
    assert setup(box, "x2", bob).returncode == 0
    for base in dirs.bases:  # the job's tree on the host: hers, 0700
        st = (base / "job-x1").stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (alice.uid, 0o700)
    r = in_job(
        box,
        "x1",
        alice,
        f"echo a > {plain}/f && echo b > {fast}/f && cat /proc/self/mountinfo; "
        f"cp /bin/true {plain}/t; {plain}/t; echo exec=$?; "
        f"touch {data}/f; echo write=$?; stat -c %u {plain} {fast} {data}",
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # The flags really landed (mountinfo's per-mount options, field 6).
    p, f, d = (mount_line(out, t)[5].split(",") for t in dirs.targets)
    assert {"nosuid", "nodev", "noexec", "rw"} <= set(p), p
    assert {"nosuid", "nodev", "rw"} <= set(f) and "noexec" not in f, f
    assert {"nosuid", "nodev", "ro"} <= set(d), d
    assert mount_line(out, fast)[7:9] == ["tmpfs", "jobns-dir-x1"]
    assert mount_line(out, data)[7] == "ext4" and mount_line(out, data)[8].startswith("/dev/loop")
    assert "exec=126" in out and "Permission denied" in r.stderr  # noexec
    assert "write=1" in out and "Read-only file system" in r.stderr  # ro
    assert out.split()[-3:] == [str(alice.uid)] * 3
    assert (dirs.plain / "job-x1" / "f").read_text() == "a\n"
    assert (dirs.tmpfs / "job-x1" / "f").read_text() == "b\n"
    # Another job on the node sees its own, empty, and the host's directories are unchanged.
    r = in_job(box, "x2", bob, f"ls -A {plain} {fast} {data}")
    assert r.returncode == 0 and sorted(r.stdout.split()) == sorted(
        f"{t}:" for t in dirs.targets
    ), r.stdout
    assert [list(t.iterdir()) for t in dirs.targets] == [[], [], []]
    # A second step of the same job sees the first's files.
    r = in_job(box, "x1", alice, f"cat {plain}/f {fast}/f")
    assert r.stdout == "a\nb\n"
    for job in ("x1", "x2"):
        r = box.run(["teardown", "--job-id", job])
        assert r.returncode == 0 and r.stderr == "", r.stderr
    assert dirs.left() == []


@pytest.mark.parametrize("layout", ["shared_tmpdir", "shared_tmpdir=per-node"])
def test_shared_layouts_keep_extra_directories_node_local(
    dirs: Dirs, users: list[OsUser], layout: str
) -> None:
    """A job on the cluster file system still gets node-local extra directories, with
    their backings (a disk image is refused only for the shared /tmp, not here)."""
    alice = users[0]
    box = dirs.box
    r = box.run(["setup", "--job-id", "l1", "--user", alice.name, "--directives", layout])
    assert r.returncode == 0, r.stderr
    _, fast, data = dirs.targets
    r = in_job(box, "l1", alice, f"cat /proc/self/mountinfo; echo s > /tmp/s; echo f > {fast}/f")
    assert r.returncode == 0, r.stderr
    assert mount_line(r.stdout, fast)[7] == "tmpfs" and mount_line(r.stdout, data)[7] == "ext4"
    assert (dirs.tmpfs / "job-l1" / "f").read_text() == "f\n"
    assert list(box.shared.rglob("s")), "the job's /tmp is on the shared base"
    assert box.run(["teardown", "--job-id", "l1"]).returncode == 0
    assert dirs.left() == []


def test_tmpfs_and_disk_backings_are_enospc_at_their_size(dirs: Dirs, users: list[OsUser]) -> None:
    alice = users[0]
    box = dirs.box
    dirs.write("[]")  # the disk writable, to fill it
    _, fast, data = dirs.targets
    assert setup(box, "x3", alice).returncode == 0
    image = dirs.disk / "jobns-dir-x3.img"
    assert image.stat().st_size == 32 * MI and image.stat().st_uid == 0
    node_before = free_bytes(dirs.disk)
    r = in_job(
        box,
        "x3",
        alice,
        f"dd if=/dev/zero of={fast}/big bs=64k count=1000 status=none; echo t=$?; "
        f"dd if=/dev/zero of={data}/big bs=64k count=1000 status=none; echo d=$?; "
        f"stat -c %s {fast}/big {data}/big",
    )
    assert r.stderr.count("No space left on device") == 2, r.stderr
    t, d, tsize, dsize = r.stdout.split()
    assert (t, d) == ("t=1", "d=1")
    assert int(tsize) == 8 * MI
    assert 24 * MI < int(dsize) <= 32 * MI
    assert node_before - free_bytes(dirs.disk) <= 32 * MI  # in the image, nowhere else
    status = box.run(["status"])
    assert f"{fast} tmpfs 8.0MiB/8.0MiB" in status.stdout, status.stdout
    assert f"{data} disk " in status.stdout and "/32.0MiB" in status.stdout
    doc = json.loads(box.run(["status", "--json"]).stdout)
    (job,) = doc["jobs"]
    assert {t["target"]: t["backing"] for t in job["trees"] if "target" in t} == {
        str(p): b for p, b in zip(dirs.targets, ("directory", "tmpfs", "disk"), strict=True)
    }
    assert box.run(["teardown", "--job-id", "x3"]).returncode == 0
    assert not image.exists()
    assert dirs.left() == []


def test_dry_run_of_setup_touches_nothing(dirs: Dirs, users: list[OsUser]) -> None:
    r = dirs.box.run(["setup", "--job-id", "x4", "--user", users[0].name, "--dry-run"])
    assert r.returncode == 0, r.stderr
    plain, fast, data = dirs.targets
    assert f"# extra private directory {fast}: backing tmpfs, options nosuid,nodev" in r.stdout
    assert f"bind   {dirs.plain}/job-x4 -> {plain}  (nosuid,nodev,noexec;" in r.stdout
    assert f"image  {dirs.disk}/jobns-dir-JOB.img: sparse file of {32 * MI} bytes" in r.stdout
    assert f"bind   {dirs.disk}/job-x4 -> {data}  (nosuid,nodev,ro;" in r.stdout
    assert dirs.left() == []


def test_standalone_run_makes_plain_directories(dirs: Dirs, users: list[OsUser]) -> None:
    """No prolog: no size and no mount of its own, ever (nothing would unmount it)."""
    alice = users[0]
    box = dirs.box
    _, fast, data = dirs.targets
    script = "cat /proc/self/mountinfo; echo x > {}/f; echo w=$?".format
    # Root (a site launcher) makes all three, as plain directories with their options.
    r = box.run(["run", "--job-id", "s1", "--user", alice.name, "--", "sh", "-c", script(fast)])
    assert r.returncode == 0, r.stderr
    for target, base in zip(dirs.targets, dirs.bases, strict=True):
        fields = mount_line(r.stdout, target)
        assert fields[3] == f"{base}/job-s1", fields  # a bind of the plain tree
        assert fields[7] != "tmpfs" and "loop" not in fields[8], fields
    assert "ro" in mount_line(r.stdout, data)[5].split(",")
    assert "w=0" in r.stdout
    assert dirs.left() == []  # removed with its last task; no image was ever made
    # An ordinary user cannot make trees in root's bases: left out, said once each.
    r = box.run(["run", "--job-id", "s2", "--", "sh", "-c", script(fast)], user=alice)
    assert r.returncode == 0
    assert r.stderr.count("is not private in this task") == 3, r.stderr
    assert all(
        not [ln for ln in r.stdout.splitlines() if str(t) in ln.split()[4:5]] for t in dirs.targets
    )
    # In a base she may write (sticky, like /tmp) she gets a private plain directory.
    dirs.tmpfs.chmod(0o1777)
    r = box.run(["run", "--job-id", "s3", "--", "sh", "-c", script(fast)], user=alice)
    assert r.returncode == 0 and r.stderr.count("is not private") == 2, r.stderr
    fields = mount_line(r.stdout, fast)
    assert fields[7] != "tmpfs" and fields[3].endswith("/job-s3")
    dirs.tmpfs.chmod(0o755)
    assert dirs.left() == []


def test_the_record_is_the_truth_and_the_cdi_spec_carries_the_options(
    dirs: Dirs, users: list[OsUser]
) -> None:
    """The job's CDI spec has the extra directories with their options; once set up,
    a job keeps its extra directories even if the site drops [[dirs]] from the config
    (tasks, status and teardown read the record, never today's config)."""
    alice = users[0]
    box = dirs.box
    cdi = box.root / "cdi"
    cdi.mkdir(mode=0o755)
    dirs.write(before=f'[cdi]\ndir = "{cdi}"\n')
    assert setup(box, "c1", alice).returncode == 0
    doc = json.loads((cdi / "jobns-c1.json").read_text())
    mounts = {m["containerPath"]: m for m in doc["devices"][0]["containerEdits"]["mounts"]}
    plain, fast, data = dirs.targets
    assert mounts[str(plain)]["options"] == ["rbind", "nosuid", "nodev", "noexec"]
    assert (
        mounts[str(plain)]["hostPath"]
        == f"{box.state}/mounts/c1/cdi/3{str(plain).replace('/', '-')}"
    )
    assert mounts[str(fast)]["options"] == ["rbind", "nosuid", "nodev"]
    assert mounts[str(data)]["options"] == ["rbind", "nosuid", "nodev", "ro"]
    box.write_config(f'[cdi]\ndir = "{cdi}"\n')  # [[dirs]] gone from the site's config
    r = in_job(box, "c1", alice, f"cat /proc/self/mountinfo; echo b > {fast}/f")
    assert r.returncode == 0, r.stderr
    assert mount_line(r.stdout, fast)[7] == "tmpfs"
    assert "noexec" in mount_line(r.stdout, plain)[5].split(",")
    assert f"{fast} tmpfs" in box.run(["status"]).stdout
    r = box.run(["teardown", "--job-id", "c1"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert os.listdir(cdi) == []
    assert dirs.left() == []


STEPS = [
    "staging-in",
    "image-made",
    "fs-made",
    "loop-attached",
    "mounted",
    "covered",
    "pre-run",
]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("then", ["recover", "teardown", "gc"])
def test_sigkill_of_setup_then_recover_teardown_or_gc_leaves_nothing(
    dirs: Dirs, users: list[OsUser], step: str, then: str
) -> None:
    alice = users[0]
    box = dirs.box
    killed_at(box, ["setup", "--job-id", "k1", "--user", alice.name], step)
    if then == "recover":
        r = box.run(["recover"])
        assert r.returncode == 0 and "running" in r.stdout, (r.stdout, r.stderr)
        _, fast, _ = dirs.targets
        r = in_job(box, "k1", alice, f"grep -c ' {fast} ' /proc/self/mountinfo")
        assert r.stdout == "1\n", (r.stdout, r.stderr)
        r = box.run(["teardown", "--job-id", "k1"])
    elif then == "teardown":
        r = box.run(["teardown", "--job-id", "k1"])
    else:
        r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert dirs.left() == []


@pytest.mark.parametrize("step", ["post-run", "teardown", "capacity-detached"])
def test_sigkill_of_teardown_then_teardown_again(
    dirs: Dirs, users: list[OsUser], step: str
) -> None:
    box = dirs.box
    assert setup(box, "k2", users[0]).returncode == 0
    killed_at(box, ["teardown", "--job-id", "k2"], step)
    r = box.run(["teardown", "--job-id", "k2"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert dirs.left() == []


def test_gc_without_any_record_reclaims_trees_images_and_loops(
    dirs: Dirs, users: list[OsUser]
) -> None:
    """/run wiped (a reboot) while a job was set up: no record names anything any more."""
    box = dirs.box
    assert setup(box, "k3", users[0]).returncode == 0
    assert setup(box, "k4", users[1]).returncode == 0  # alive: kept
    # What a reboot leaves: no namespace, no tmpfs, no record; the images' loop mount
    # may survive where /run is not the only thing lost (here: kept, to be detached).
    subprocess.run(["umount", "-l", str(box.state / "jobs" / "k3" / "ns" / "mnt")], check=False)
    subprocess.run(["umount", "-l", str(box.state / "jobs" / "k3" / "ns" / "user")], check=False)
    subprocess.run(["umount", "-l", str(dirs.tmpfs / "job-k3")], check=True)
    subprocess.run(["rm", "-rf", str(box.state / "jobs" / "k3")], check=True)
    r = box.run(["gc", "--no-slurm"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"removed the disk capacity {dirs.disk}/jobns-dir-k3.img" in r.stdout, r.stdout
    for base in dirs.bases:
        assert f"removing {base}/job-k3 (no job record, unused)" in r.stdout, r.stdout
        assert sorted(p.name for p in base.iterdir() if "k4" not in p.name) == []
    assert (dirs.disk / "jobns-dir-k4.img").exists() and len(loops_under(dirs.disk)) == 1
    assert box.run(["teardown", "--job-id", "k4"]).returncode == 0
    assert dirs.left() == []


def test_a_missing_mount_point_fails_setup_as_the_sites_error(
    dirs: Dirs, users: list[OsUser]
) -> None:
    dirs.targets[2].rmdir()
    r = setup(dirs.box, "m1", users[0])
    assert r.returncode == 125, r.stderr
    assert f"over {dirs.targets[2]}: No such file or directory; it must be" in r.stderr, r.stderr
    assert "jobns doctor" in r.stderr
    assert dirs.box.run(["teardown", "--job-id", "m1"]).returncode == 0
    dirs.targets[2].mkdir()
    assert dirs.left() == []


def test_doctor_checks_each_path_and_base(dirs: Dirs, users: list[OsUser]) -> None:
    box = dirs.box
    r = box.run(["doctor", "--slurm-conf", "/nonexistent"])
    for t in dirs.targets:
        assert f"ok: [[dirs]] path {t}: a directory" in r.stdout, r.stdout
    dirs.targets[0].rmdir()
    os.chown(dirs.plain, users[0].uid, users[0].gid)
    dirs.disk.chmod(0o1777)
    r = box.run(["doctor", "--slurm-conf", "/nonexistent"])
    assert r.returncode == 125
    assert f"problem: [[dirs]] path {dirs.targets[0]}: No such file or directory; fix: mkdir" in (
        r.stdout
    )
    assert f"{dirs.plain} belongs to uid {users[0].uid}; fix: chown root" in r.stdout, r.stdout
    assert f"[[dirs]] base {dirs.disk} of {dirs.targets[2]} (disk) is writable by others" in (
        r.stdout
    )
    dirs.targets[0].mkdir()
    os.chown(dirs.plain, 0, 0)
    dirs.disk.chmod(0o755)


def test_the_pre_run_program_fills_a_read_only_directory_through_jobns_fill(
    dirs: Dirs, users: list[OsUser]
) -> None:
    """Who fills an `ro` directory: the site's pre-run program (root), through
    $JOBNS_FILL<path>, a writable view of each directory with options that exists only
    while it runs. Its files are there for the job (read-only, and executable where
    noexec is not set); the host path is read-only for root too; nothing of the view is
    left once the job runs."""
    alice = users[0]
    box = dirs.box
    plain, _, data = dirs.targets
    prog = box.root / "pre-run.sh"
    seen = box.root / "seen"
    prog.write_text(
        "#!/bin/sh\nset -e\n"
        f'ls -A "$JOBNS_FILL{box.root}/mnt" > {seen}\n'
        f'echo reference > "$JOBNS_FILL{data}/ref"\n'
        f"printf '#!/bin/sh\\necho tool ran\\n' > \"$JOBNS_FILL{data}/tool\"\n"
        f'chmod 755 "$JOBNS_FILL{data}/tool"\n'
        f'echo note > "$JOBNS_FILL{plain}/note"\n'
        f"echo x > {dirs.disk}/job-$JOBNS_JOB_ID/direct 2>/dev/null && exit 7\n"
        "exit 0\n"
    )
    prog.chmod(0o755)
    dirs.write(before=f'[lifecycle]\npre_run = "{prog}"\n')
    r = setup(box, "f1", alice)
    assert r.returncode == 0, r.stderr
    assert seen.read_text().split() == ["data", "scratch"]  # the two with options
    assert not (box.state / "mounts" / "f1").exists()
    assert [m for m in job_mounts(box) if "/mounts/" in m] == []
    r = in_job(box, "f1", alice, f"cat {data}/ref {plain}/note; {data}/tool; echo x > {data}/mine")
    assert r.stdout == "reference\nnote\ntool ran\n", (r.stdout, r.stderr)
    assert "Read-only file system" in r.stderr
    st = (dirs.disk / "job-f1" / "ref").stat()
    assert st.st_uid == 0  # the program's files stay root's: she cannot change them
    assert box.run(["teardown", "--job-id", "f1"]).returncode == 0
    assert dirs.left() == []
