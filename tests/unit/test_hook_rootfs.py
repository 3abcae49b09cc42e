"""Reaching a container's root file system and its mount points without following a user's
links (jobns/hook/rootfs.py), and whose container it is (jobns/hook/identity.py,
jobns/hook/bundle.py): no root needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobns.hook import bundle as bundle_mod
from jobns.hook import rootfs
from jobns.hook.identity import check_named, check_owner, user_of
from jobns.launcher.model.job import User
from jobns.launcher.system.errors import JobnsError


def same_dir(fd: int, path: Path) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    os.close(fd)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_open_root_follows_links_like_the_kernel(tmp_path: Path) -> None:
    """Links of root's (or, run by a user, her own) are followed: relative, absolute,
    through '..', chained."""
    real = tmp_path / "data" / "img"
    real.mkdir(parents=True)
    (tmp_path / "rel").symlink_to("data/img")
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "back").symlink_to("../data")
    (tmp_path / "chain").symlink_to("rel")
    for path in ("data/img", "rel", "abs", "up/back/img", "chain", "up/../data/./img"):
        assert same_dir(rootfs.open_root(f"{tmp_path}/{path}"), real), path


def test_open_root_refuses_loops_files_and_missing(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "file").write_text("x")
    with pytest.raises(JobnsError, match="too many levels of symbolic links"):
        rootfs.open_root(f"{tmp_path}/loop")
    with pytest.raises(JobnsError, match=f"{tmp_path}/file is not a directory"):
        rootfs.open_root(f"{tmp_path}/file/x")
    with pytest.raises(JobnsError, match=f"{tmp_path}/nope: No such file or directory"):
        rootfs.open_root(f"{tmp_path}/nope/rootfs")


@pytest.mark.parametrize(
    ("link", "needle"),
    [
        ("tmp", "refuse {r}/tmp: it is a symbolic link (to '/etc')"),
        ("var", "refuse {r}/var: it is a symbolic link (to '/etc')"),
        ("var/tmp", "refuse {r}/var/tmp: it is a symbolic link (to '/etc')"),
        ("dev", "refuse {r}/dev: it is a symbolic link (to '/etc')"),
        ("dev/shm", "refuse {r}/dev/shm: it is a symbolic link (to '/etc')"),
    ],
)
def test_check_refuses_a_link_on_the_way_and_makes_nothing(
    tmp_path: Path, link: str, needle: str
) -> None:
    r = tmp_path / "rootfs"
    for d in ("tmp", "var/tmp", "dev/shm"):
        (r / d).mkdir(parents=True)
    real = r / link
    real.rename(real.with_name(real.name + ".real"))
    real.symlink_to("/etc")
    before = sorted(p.name for p in r.rglob("*"))
    with pytest.raises(JobnsError) as e:
        rootfs.check(str(r), ["/tmp", "/var/tmp", "/dev/shm"])
    assert str(e.value) == str(e.value).splitlines()[0]
    assert needle.format(r=r) in str(e.value)
    assert sorted(p.name for p in r.rglob("*")) == before


def test_check_accepts_missing_mount_points_and_refuses_files(tmp_path: Path) -> None:
    r = tmp_path / "rootfs"
    r.mkdir()
    rootfs.check(str(r), ["/tmp", "/var/tmp", "/dev/shm"])  # the runtime makes them
    assert list(r.iterdir()) == []
    (r / "var").write_text("not a directory")
    with pytest.raises(JobnsError, match=f"refuse {r}/var: it is not a directory"):
        rootfs.check(str(r), ["/var/tmp"])


def test_resolve_makes_missing_mount_points_and_remove_made_takes_them_back(tmp_path: Path) -> None:
    r = tmp_path / "rootfs"
    (r / "dev").mkdir(parents=True)
    made: list[tuple[int, str, str]] = []
    root = rootfs.open_root(str(r))
    old = os.umask(0)
    try:
        targets = [rootfs.resolve(root, str(r), t, made) for t in ("/tmp", "/var/tmp")]
    finally:
        os.umask(old)
        os.close(root)
    assert [m[2] for m in made] == [f"{r}/tmp", f"{r}/var", f"{r}/var/tmp"]
    assert ((r / "tmp").stat().st_mode & 0o7777, (r / "var").stat().st_mode & 0o7777) == (
        0o1777,
        0o755,
    )
    for t in targets:
        os.close(t.fd)
        os.close(t.parent_fd)
    assert rootfs.remove_made(made) == []
    assert sorted(p.name for p in r.iterdir()) == ["dev"]


# --- whose container it is -----------------------------------------------------------


def test_live_maps_are_read_like_the_kernel_writes_them(tmp_path: Path) -> None:
    m = tmp_path / "uid_map"
    m.write_text("         0     100000      65536\n     65536       1001          1\n")
    assert bundle_mod._map_live(str(m), 0, "uid") == 100000
    assert bundle_mod._map_live(str(m), 1000, "uid") == 101000
    assert bundle_mod._map_live(str(m), 65536, "uid") == 1001
    with pytest.raises(JobnsError, match=r"the container's uid 65537 .* is not mapped"):
        bundle_mod._map_live(str(m), 65537, "uid")
    m.write_text("")  # a namespace whose maps were never written
    with pytest.raises(JobnsError, match="is not mapped"):
        bundle_mod._map_live(str(m), 0, "uid")


def test_live_host_ids_without_a_user_namespace_are_the_ids() -> None:
    assert bundle_mod.live_host_ids(os.getpid(), 1234, 5678) == (1234, 5678)
    with pytest.raises(JobnsError, match="not a live process"):
        bundle_mod.live_host_ids(1 << 30, 0, 0)


def test_unnamed_user_is_the_containers_own() -> None:
    user, named = user_of({}, {}, (4242, 4343))
    assert (user.uid, user.gid, named) == (4242, 4343, "")
    user, named = user_of({"org.jobns.user": "0"}, {}, (4242, 4343))
    assert (user.uid, named) == (0, "annotation org.jobns.user")


def test_refusals_name_the_container_both_uids_and_the_fix() -> None:
    alice = User("alice", 1001, 1001, (1001,), "/")
    check_named("container c", 1001, alice, "annotation org.jobns.user")
    check_named("container c", 1002, alice, "")  # not named: nothing to compare
    with pytest.raises(JobnsError) as e:
        check_named("container c", 1002, alice, "SLURM_JOB_USER in process.env")
    assert str(e.value) == (
        "container c runs as uid 1002 (process.user, mapped to the host), but SLURM_JOB_USER "
        "in process.env names alice (uid 1001) as the job user; jobns gives a job's "
        "directories only to containers of the job's user: run the container as uid 1001 "
        "(process.user in config.json, podman --user 1001:1001)"
    )
    check_owner("bundle /b", 1001, "J", alice)
    with pytest.raises(JobnsError) as e:
        check_owner("bundle /b", 0, "J", alice)
    assert str(e.value).startswith(
        "bundle /b runs as uid 0 (process.user, mapped to the "
        "host), but job J belongs to alice (uid 1001); "
    )
    assert "(root in a container is not the job's user)" in str(e.value)
    root = User("root", 0, 0, (0,), "/")
    check_owner("container c", 0, "J", root)
