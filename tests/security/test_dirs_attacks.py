"""Attacks on extra private directories ([[dirs]]): bob (another user) against alice's
job, and against the node through a site path he can reach. A squatted tree is moved
aside and never used; a link planted on a [[dirs]] path is never bound through, even by
root in an enforced job's namespace, and it refuses only the job; nobody but alice sees
into her extra directories, whatever their backing."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import job_mounts
from tests.security.conftest import (
    MIB,
    NS_JOIN,
    World,
    mounts,
    no_crash,
    refused,
    shmem_bytes,
    snapshot,
)
from tests.security.test_setup_attacks import entries, moved_intact, squat

pytestmark = pytest.mark.root


class Site:
    """Two [[dirs]] entries with world-writable sticky bases (like /tmp: a site that lets
    standalone users make trees there): a plain directory and a 4 MiB tmpfs; optionally a
    disk-backed third (its base root's: it holds images). Mount points under mnt/."""

    def __init__(self, world: World, disk: bool = False, mnt_mode: int = 0o755) -> None:
        root = world.box.root
        self.world = world
        self.mnt = root / "mnt"
        self.mnt.mkdir()
        self.mnt.chmod(mnt_mode)
        self.bases = [root / "xplain", root / "xtmpfs"]
        self.targets = [self.mnt / "scratch", self.mnt / "fast"]
        entries = [
            f'[[dirs]]\npath = "{self.targets[0]}"\nbase = "{self.bases[0]}"\n',
            f'[[dirs]]\npath = "{self.targets[1]}"\nbase = "{self.bases[1]}"\n'
            'backing = "tmpfs"\nsize = "4MiB"\n',
        ]
        if disk:
            self.bases.append(root / "xdisk")
            self.targets.append(self.mnt / "data")
            entries.append(
                f'[[dirs]]\npath = "{self.targets[2]}"\nbase = "{self.bases[2]}"\n'
                'backing = "disk"\nsize = "16MiB"\n'
            )
        for i, base in enumerate(self.bases):
            base.mkdir()
            base.chmod(0o755 if i == 2 else 0o1777)
        self.enforce = False
        self.entries = "".join(entries)
        self.write()

    def write(self, enforce: bool = False) -> None:
        self.enforce = enforce
        slurm = "[slurm]\nenforce = true\n" if enforce else ""
        self.world.box.write_config(slurm + self.entries)

    def make_targets(self) -> None:
        for t in self.targets:
            t.mkdir()

    def left(self) -> list[str]:
        self.world.box.wait_released()  # the epilogs' release processes are done
        return [str(p) for b in self.bases for p in b.iterdir()] + job_mounts(self.world.box)


@pytest.mark.parametrize("kind", ["dir", "symlink", "exact", "file"])
def test_squatted_extra_dir_trees_are_moved_aside_and_never_used(world: World, kind: str) -> None:
    """Attack: bob makes <base>/job-N in each [[dirs]] base he can write (a directory
    with a file, a link to a root directory, jobns's exact shape but his, a file) before
    alice's job N. Defence: setup exits 0, alice's extra directories are fresh, empty and
    hers; bob's entries are renamed aside, still his and unchanged, and survive
    teardown; the link's target is never touched."""
    alice, bob = world.alice, world.bob
    site = Site(world)
    site.make_targets()
    decoy = world.decoy()
    decoy_before = snapshot(decoy)
    for base in site.bases:
        squat(world, base, "job-60", kind, False, decoy)
    before = {base: snapshot(base) for base in site.bases}
    r = world.setup("60")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    scratch, fast = site.targets
    r = world.run(
        "60", f"ls -A {scratch} {fast}; echo mine > {scratch}/a; echo mine > {fast}/b", alice
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(f"{t}:" for t in site.targets), r.stdout
    moved = []
    for base in site.bases:
        (aside,) = entries(base, "job-60~moved-")
        moved.append(str(aside))
        assert aside.lstat().st_uid == bob.uid, f"{aside} was chowned"
        moved_intact(before[base], aside, "job-60")
        tree = base / "job-60"
        assert tree.is_dir() and not tree.is_symlink() and tree.stat().st_uid == alice.uid
    assert (site.bases[0] / "job-60" / "a").read_text() == "mine\n"
    assert snapshot(decoy) == decoy_before
    r = world.teardown("60")
    assert r.returncode == 0, r.stderr
    assert sorted(site.left()) == sorted(moved)
    assert snapshot(decoy) == decoy_before


def test_bob_cannot_read_alices_extra_directories(world: World) -> None:
    """Attack: bob looks for alice's files in her extra directories from the host (the
    trees, the tmpfs, the disk image and its loop device) and from a job of his own.
    Defence: her trees are 0700 and hers, the image is root's 0600; bob's job sees only
    his own, empty, directories."""
    alice, bob = world.alice, world.bob
    site = Site(world, disk=True)
    site.make_targets()
    assert world.setup("61").returncode == 0
    assert world.setup("62", user=bob).returncode == 0
    script = "; ".join(f"echo secret > {t}/s; chmod 644 {t}/s" for t in site.targets)
    r = world.run("61", script, alice)
    assert r.returncode == 0, r.stderr
    for base in site.bases:
        tree = base / "job-61"
        st = tree.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o700)
        r = world.as_user(bob, ["sh", "-c", f"ls {tree}; cat {tree}/s"])
        assert r.returncode != 0 and "secret" not in r.stdout, r.stdout
        assert r.stderr.count("Permission denied") == 2, r.stderr
    image = site.bases[2] / "jobns-dir-61.img"
    st = image.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode) & 0o077) == (0, 0)
    (loop,) = [src for t, fs, src in mounts() if t == str(site.bases[2] / "job-61")]
    for path in (image, Path(loop)):
        r = world.as_user(bob, ["sh", "-c", f"head -c 1 {path} >/dev/null"])
        assert r.returncode != 0 and "Permission denied" in r.stderr, (path, r.stderr)
    # His own job: his own empty directories at the same paths, nothing of hers.
    r = world.run("62", f"ls -A {' '.join(map(str, site.targets))}", bob)
    assert "secret" not in r.stdout
    assert sorted(r.stdout.split()) == sorted(f"{t}:" for t in site.targets), r.stdout
    # Nor can he join her job to look.
    r = world.run("61", "cat " + " ".join(f"{t}/s" for t in site.targets), bob)
    assert r.returncode == 125 and "secret" not in r.stdout, r.stdout
    for job in ("61", "62"):
        assert world.teardown(job).returncode == 0
    assert site.left() == []


@pytest.mark.parametrize("enforce", [False, True], ids=["voluntary", "enforced"])
@pytest.mark.parametrize("where", ["target", "parent"])
def test_a_link_planted_on_an_extra_dir_path_is_never_bound_through(
    world: World, enforce: bool, where: str
) -> None:
    """Attack: the site's mount points lie under a directory bob may write (mnt/, mode
    1777: the misconfiguration jobns doctor reports); before alice's job he plants a
    symbolic link to a root directory at the mount point itself, or at a directory above
    it. In an enforced job root binds in root's namespace: following the link would put
    alice's tree over that directory there (her own /etc, read by setuid programs).
    Defence: setup never binds through a link; alice's job is refused, never the node
    (setup exits 0; a refusal records bob's uid); the decoy is never mounted over;
    teardown leaves nothing; doctor names mnt/."""
    alice, bob = world.alice, world.bob
    site = Site(world, mnt_mode=0o1777)
    site.write(enforce)
    decoy = world.decoy()
    (decoy / "scratch").mkdir()
    (decoy / "fast").mkdir()
    decoy_before = snapshot(decoy)
    if where == "target":
        plant = [(site.targets[0], decoy / "scratch"), (site.targets[1], decoy / "fast")]
        site.targets[1].mkdir()  # the tmpfs's mount point is fine; the link alone refuses
        plant = plant[:1]
    else:
        # mnt/ itself is root's and sticky: bob can only add a name. A path through his
        # own link: mnt/sub -> decoy, and the site's entries under mnt/sub/.
        sub = site.mnt / "sub"
        site.targets = [sub / "scratch", sub / "fast"]
        site.entries = site.entries.replace(f"{site.mnt}/", f"{sub}/")
        site.write(enforce)
        plant = [(sub, decoy)]
    for link, dest in plant:
        r = world.as_user(bob, ["ln", "-s", str(dest), str(link)])
        assert r.returncode == 0, r.stderr
    r = world.setup("63")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    assert f"belongs to uid {bob.uid}, not root" in r.stderr, r.stderr
    assert "refused" in r.stderr
    assert [t for t, _, _ in mounts() if t.startswith(str(decoy))] == []
    assert snapshot(decoy) == decoy_before
    refused(world.run("63", "true", user=None if enforce else alice))
    assert world.teardown("63").returncode == 0
    assert snapshot(decoy) == decoy_before
    assert site.left() == []
    r = world.box.run(["doctor", "--slurm-conf", "/nonexistent"])
    assert f"{site.mnt} (uid 0, mode 1777) lets another user replace" in r.stdout, r.stdout


# ------------------------------------------------ ro and noexec on every path (issue 20, 9)

PROG = "#!/bin/sh\necho ran-her-program\n"

# argv: PID TARGET...: enter the user and mount namespaces of PID (a task of her own
# voluntary job: they are hers) and try to remount each TARGET read-write and exec.
NS_REMOUNT = (
    NS_JOIN
    + r"""
for target in sys.argv[2:]:
    # MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV: rw and exec again
    r = libc.mount(None, target.encode(), None, 32 | 4096 | 2 | 4, None)
    print(target, "remounted" if r == 0 else os.strerror(ctypes.get_errno()))
"""
)


class Flagged:
    """Three [[dirs]] entries with options: a plain directory `ro` and a 4 MiB tmpfs
    `noexec` in sticky world-writable bases (like /tmp), a 16 MiB disk `ro,noexec`
    (its base root's); mount points under mnt/."""

    def __init__(self, world: World, enforce: bool, pre_run: str = "") -> None:
        root = world.box.root
        self.world = world
        self.enforce = enforce
        self.bases = [root / "fro", root / "fnx", root / "fdisk"]
        self.targets = [root / "mnt" / n for n in ("ro", "nx", "both")]
        for base, mode in zip(self.bases, (0o1777, 0o1777, 0o755), strict=True):
            base.mkdir()
            base.chmod(mode)
        for t in self.targets:
            t.mkdir(parents=True)
        ro, nx, both = self.targets
        slurm = "[slurm]\nenforce = true\n" if enforce else ""
        lifecycle = f'[lifecycle]\npre_run = "{pre_run}"\n' if pre_run else ""
        world.box.write_config(
            slurm
            + lifecycle
            + f'[[dirs]]\npath = "{ro}"\nbase = "{self.bases[0]}"\noptions = ["ro"]\n'
            + f'[[dirs]]\npath = "{nx}"\nbase = "{self.bases[1]}"\nbacking = "tmpfs"\n'
            + 'size = "4MiB"\noptions = ["noexec"]\n'
            + f'[[dirs]]\npath = "{both}"\nbase = "{self.bases[2]}"\nbacking = "disk"\n'
            + 'size = "16MiB"\noptions = ["noexec", "ro"]\n'
        )

    def run(self, job: str, script: str) -> subprocess.CompletedProcess[str]:
        """A task of the job: started by root (which joins, then becomes alice) when the
        site enforces namespaces, by alice herself otherwise."""
        return self.world.run(job, script, user=None if self.enforce else self.world.alice)

    def trees(self, job: str) -> list[Path]:
        return [base / f"job-{job}" for base in self.bases]

    def left(self) -> list[str]:
        return [str(p) for b in self.bases for p in b.iterdir()] + job_mounts(self.world.box)


def attempts(dirs: list[Path]) -> str:
    """A shell script that, for each directory, tries to write a new file, to put a
    program there and run it, and to run the program already there (prog); one line
    per attempt that worked."""
    out = []
    for d in dirs:
        out.append(
            f"echo x > {d}/new 2>/dev/null && echo wrote {d}/new; "
            f"printf '{PROG}' > {d}/mine 2>/dev/null && chmod +x {d}/mine 2>/dev/null; "
            f"{d}/mine 2>/dev/null; {d}/prog 2>/dev/null; "
            f"ls {d} >/dev/null 2>&1 || echo unreadable {d}"
        )
    return "; ".join(out)


@pytest.mark.parametrize("enforce", [False, True], ids=["voluntary", "enforced"])
def test_ro_and_noexec_hold_on_every_path_from_the_host(world: World, enforce: bool) -> None:
    """Attack (issue 20, finding 9): alice's job has an `ro` directory, a `noexec` one
    and one with both. Inside the job they hold at their paths; she tries the other
    ways in: from a login shell on the host, through <base>/job-ID (her tree, in a sticky
    base), she writes a file and copies in a program and runs it, and runs the program
    her job put in the noexec directory; then the same from a user namespace of her
    own, and from inside the job through <base>/job-ID; in the voluntary mode she also
    tries to remount her job's views read-write and exec in the namespace she owns.
    Defence: the job's content is reachable only through a cover setup made flagged
    (ro/noexec, nosuid,nodev) before anyone could open it: every attempt fails, in both
    modes; she can still read her directories from the host."""
    alice = world.alice
    site = Flagged(world, enforce)
    ro, nx, both = site.targets
    r = world.setup("90")
    assert r.returncode == 0, r.stderr
    no_crash(r)
    # The job's own view: ro and noexec hold there (as before); it puts a program in nx.
    r = site.run(
        "90",
        f"printf '{PROG}' > {nx}/prog && chmod +x {nx}/prog; "
        f"{nx}/prog; echo x > {ro}/f || echo ro-held; echo x > {both}/f || echo both-held",
    )
    assert "ran-her-program" not in r.stdout and "ro-held" in r.stdout, r.stdout + r.stderr
    assert "both-held" in r.stdout, r.stdout
    trees = site.trees("90")
    # Only the noexec-only directory may be written (by its paths inside the job or not).
    allowed = {f"wrote {d}/new" for d in (nx, trees[1])}
    # From the host, as alice, by the trees' paths.
    r = world.as_user(alice, ["sh", "-c", attempts(trees)])
    assert set(r.stdout.splitlines()) <= allowed, r.stdout
    # From a user and mount namespace of her own, made on the host now.
    r = world.as_user(alice, ["unshare", "-Urm", "sh", "-c", attempts(trees)])
    assert set(r.stdout.splitlines()) <= allowed, r.stdout
    # From inside the job, by the trees' paths rather than the directories' own.
    r = site.run("90", attempts(trees))
    assert set(r.stdout.splitlines()) <= allowed, r.stdout
    if not enforce:
        # Her job's namespace is hers: she may remount in it, but not drop these flags.
        _, pid = world.task("90", alice)
        r = world.python(alice, NS_REMOUNT, str(pid), *map(str, site.targets), *map(str, trees))
        assert "remounted" not in r.stdout and r.stdout.count("not permitted") == 6, r.stdout
        r = site.run("90", attempts([*site.targets, *trees]))
        assert set(r.stdout.splitlines()) <= allowed, r.stdout
    # What she may do: read them from the host (the job's content, as the job sees it).
    r = world.as_user(alice, ["ls", *map(str, trees)])
    assert r.returncode == 0 and "prog" in r.stdout, r.stderr
    # Nobody else can.
    r = world.as_user(world.bob, ["ls", *map(str, trees)])
    assert r.returncode != 0 and r.stderr.count("Permission denied") == 3, r.stderr
    for p in world.procs:
        p.kill()
    r = world.teardown("90")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert site.left() == []


def test_her_process_inside_a_covered_capacity_cannot_keep_its_memory(world: World) -> None:
    """Rule 6 with a cover: alice fills her `noexec` tmpfs directory (4 MiB here: the
    whole of it) and keeps a host process with its working directory in it, through the
    cover. Teardown detaches the cover by its recorded id first, then empties and
    detaches the tmpfs as for any capacity: it exits 0, the memory is given back, her
    process sees an empty directory, and nothing is left."""
    alice = world.alice
    site = Flagged(world, enforce=False)
    nx = site.targets[1]
    assert world.setup("91").returncode == 0
    r = site.run("91", f"dd if=/dev/zero of={nx}/fill bs=1M count=3 2>&1")
    assert r.returncode == 0, r.stdout
    tree = site.trees("91")[1]
    out = world.w / "ls-after"
    holder = world.start(
        alice,
        [
            "sh",
            "-c",
            f"cd {tree} && echo ready && while [ ! -e {world.w}/go ]; do sleep 0.05; done; "
            f"ls -A . > {out}",
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    before = shmem_bytes()
    r = world.teardown("91")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert before - shmem_bytes() >= 2 * MIB
    (world.w / "go").touch()
    holder.wait(timeout=30)
    assert out.read_text() == ""
    assert site.left() == []
