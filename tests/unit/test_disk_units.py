"""Pure parts of disk capacities: --tmp parsing, loop_config layout, image names."""

from __future__ import annotations

import pytest

from jobns.launcher import diskimage, jobsize, loop

MI = 1024**2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("JobId=7 MinTmpDiskNode=0 Features=(null)", None),
        ("JobId=7 MinTmpDiskNode=500 Features=(null)", 500 * MI),  # MB without a suffix
        ("JobId=7 MinTmpDiskNode=500M", 500 * MI),
        ("JobId=7 MinTmpDiskNode=2G", 2 * 1024 * MI),
        ("JobId=7 MinTmpDiskNode=1.5T", int(1.5 * 1024**4)),
        ("JobId=7 MinTmpDiskNode=x", None),
        ("JobId=7", None),
    ],
)
def test_parse_tmp(text: str, expected: int | None) -> None:
    assert jobsize.parse_tmp(text) == expected


def test_loop_config_is_the_kernel_struct() -> None:
    # struct loop_config: 4 + 4 + sizeof(struct loop_info64) (232) + 8 * 8
    assert loop._CONFIG.size == 304


def test_image_names_and_their_job() -> None:
    path = diskimage.image_path("/scratch/", "local", "12_3.x")
    assert path == "/scratch/jobns-local-12_3.x.img"
    assert diskimage.job_of_image(path) == "12_3.x"
    assert diskimage.job_of_image("/scratch/other.img") is None
    assert diskimage.job_of_image("/scratch/jobns-local.img") is None
