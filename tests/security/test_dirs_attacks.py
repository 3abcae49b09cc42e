"""Attacks on extra private directories ([[dirs]]): bob (another user) against alice's
job, and against the node through a site path he can reach. A squatted tree is moved
aside and never used; a link planted on a [[dirs]] path is never bound through, even by
root in an enforced job's namespace, and it refuses only the job; nobody but alice sees
into her extra directories, whatever their backing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.conftest import job_mounts
from tests.security.conftest import World, mounts, no_crash, refused, snapshot
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
