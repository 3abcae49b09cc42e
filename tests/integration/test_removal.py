"""fs removal for real: the parallel fan-out removes everything and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobns.launcher.system import removal
from tests.conftest import require_root

pytestmark = pytest.mark.root


def test_wide_and_deep_tree_is_removed_without_following_links(tmp_path: Path) -> None:
    require_root()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    tree = tmp_path / "job-R"
    for i in range(12):  # wide enough to be shared out among threads
        d = tree / f"d{i}"
        d.mkdir(parents=True)
        for j in range(50):
            (d / f"f{j}").touch()
        (d / "link").symlink_to(outside)
        deep = d
        for _ in range(60):  # deeper than MAX_DEPTH below the fan-out level
            deep = deep / "x"
        deep.mkdir(parents=True)
        (deep / "bottom").touch()
    os.chmod(tree / "d3", 0o000)
    base = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert removal.remove_entry(base, "job-R", str(tree)) == []
    finally:
        os.close(base)
    assert not tree.exists()
    assert (outside / "keep").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["outside"]
