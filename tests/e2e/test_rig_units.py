"""The rig's pure parts, without docker: mirror discovery, cache keys, labels, config."""

from __future__ import annotations

import os
import tomllib
import zipfile
from pathlib import Path

import pytest

from containers import images, labels
from containers.errors import RigError
from containers.rig import as_user, toml
from containers.wheels import wheel_digest


def test_host_mirror_reads_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert images.host_mirror(str(tmp_path)) == "http://mirror.example/debian"


def test_host_mirror_reads_one_line_lists_and_falls_back(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    assert images.host_mirror(str(tmp_path)) == images.DEFAULT_MIRROR
    (tmp_path / "sources.list").write_text(
        "deb [signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    )
    assert images.host_mirror(str(tmp_path)) == "http://other.example/debian"


def test_base_tag_depends_on_the_mirror_only_through_the_hash() -> None:
    a, b = images.base_tag("http://a/debian"), images.base_tag("http://b/debian")
    assert a != b and a.startswith(images.BASE + ":") and len(a.split(":")[1]) == 16
    assert images.base_tag("http://a/debian") == a


def test_wheel_digest_ignores_zip_timestamps(tmp_path: Path) -> None:
    def make(path: Path, when: tuple[int, int, int, int, int, int], body: bytes) -> Path:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(zipfile.ZipInfo("pkg/mod.py", date_time=when), body)
        return path

    one = make(tmp_path / "1.whl", (2020, 1, 1, 0, 0, 0), b"x = 1\n")
    two = make(tmp_path / "2.whl", (2024, 6, 6, 6, 6, 6), b"x = 1\n")
    three = make(tmp_path / "3.whl", (2020, 1, 1, 0, 0, 0), b"x = 2\n")
    assert wheel_digest(one) == wheel_digest(two) != wheel_digest(three)


def test_node_dockerfile_installs_the_packages_built_for_its_release() -> None:
    debs = images.debs_dockerfile("jobns-rig-base:abc")
    # dpkg-buildpackage (ci/build-deb) in the release's own base, from the copied sources
    assert debs.startswith("FROM jobns-rig-base:abc\n")
    assert f"{images.BUILD_SRC}/ci/build-deb {images.DEB_DIR}" in debs
    node = images.node_dockerfile("jobns-rig-base:abc", "jobns-rig-debs:def")
    assert node.startswith("FROM jobns-rig-base:abc\n") and "--uid 1001" in node
    install = images.install_jobns("jobns-rig-debs:def")
    assert install in node and "COPY --from=jobns-rig-debs:def" in install
    assert "dpkg -i" in install and "pip" not in node and "venv" not in node
    assert "build-spank" not in node


def test_the_packages_are_built_from_the_checkout_but_not_its_tests() -> None:
    names = set(images.package_sources())
    assert {"src/debian/rules", "src/ci/build-deb", "src/pyproject.toml"} <= names
    assert "src/jobns/slurm/spank/jobns_spank.c" in names
    assert not any(n.startswith(("src/tests/", "src/containers/")) for n in names)


def test_each_release_has_its_own_base_and_unknown_names_are_refused() -> None:
    tags = {images.base_tag("http://a/debian", r) for r in images.RELEASES.values()}
    assert len(tags) == len(images.RELEASES)
    assert images.base_tag("http://a/debian") == images.base_tag(
        "http://a/debian", images.release(images.DEFAULT_RELEASE)
    )
    with pytest.raises(RigError, match="bookworm, trixie, forky"):
        images.release("sid")


def test_owner_labels_tell_live_from_dead() -> None:
    assert labels.owner_alive(labels.owner_of())
    assert not labels.owner_alive(f"{labels.boot_id()}:{2**22 + 1}:0")
    assert not labels.owner_alive(f"another-boot:{os.getpid()}:0")
    assert not labels.owner_alive("garbage")
    assert not labels.owner_alive(None)


def test_toml_quotes_strings_and_keeps_numbers() -> None:
    config = {"shared_base": '/lustre/"x"', "kill_wait": 2.5, "n": 3, "b": True}
    text = toml(config)
    assert tomllib.loads(text) == config
    assert text == 'shared_base = "/lustre/\\"x\\""\nkill_wait = 2.5\nn = 3\nb = true\n'
    tables = {"kill_wait": 2, "capacity": {"tmp_backing": "disk"}, "slurm": {"enforce": True}}
    assert tomllib.loads(toml(tables)) == tables


def test_as_user_goes_through_su_for_others_only() -> None:
    assert as_user("root", ["id", "-u"]) == ["id", "-u"]
    assert as_user("alice", ["sh", "-c", "echo 'a b'"]) == [
        "su",
        "alice",
        "-s",
        "/bin/sh",
        "-c",
        "sh -c 'echo '\"'\"'a b'\"'\"''",
    ]
