"""Pure parts of disk capacities: --tmp parsing, loop_config layout, image names, the
file systems' smallest sizes (rounding, config validation), stale-device lines."""

from __future__ import annotations

import os

import pytest

from jobns.launcher.backing import diskimage
from jobns.launcher.lifecycle import metrics
from jobns.launcher.model import capacity, config, jobsize
from jobns.launcher.model.config import Config, parse
from jobns.launcher.model.directives import DirectiveError, parse_script
from jobns.launcher.system import loop
from jobns.launcher.system.errors import JobnsError, UserError

MI = 1024**2


def cfg(text: str) -> Config:
    return Config(parse(text, "/t.toml"), "/t.toml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7 7 0\n", None),
        ("7 7 500\n", 500 * MI),  # MiB without a unit, as --tmp
        ("7 7 500M\n", 500 * MI),
        ("7 7 2G\n", 2 * 1024 * MI),
        ("7 7 1.50G\n", 1536 * MI),  # squeue without --noconvert
        ("7 7 1.5T\n", int(1.5 * 1024**4)),
        ("8 6_1 9M\n7 6_2 3M\n6 6_[3-5] 5M\n", 3 * MI),  # an array: the row of job 7
        ("7 7 4294967293M\n", 4294967293 * MI),  # the largest Slurm holds
    ],
)
def test_parse_squeue(text: str, expected: int | None) -> None:
    assert jobsize.parse_squeue(text, "7") == (expected, "")


def test_parse_squeue_by_the_array_task_id() -> None:
    assert jobsize.parse_squeue("9 6_2 3M\n", "6_2") == (3 * MI, "")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "8 8 5M\n",  # another job
        "7 7 x\n",
        "7 7 inf\n",
        "7 7 nan\n",
        "7 7 1e30\n",
        "7 7 -1\n",
        "7 7 4294967294M\n",  # NO_VAL
        "7 7 5P\n",
        "7 7 \u0663M\n",
        "7 7 5M\n7 7 6M\n",  # two answers for one job
        "JobId=7 JobName=x MinTmpDiskNode=5M\n",  # scontrol's format: never read
        "7 7 5M extra\n",
        "7 7 5M\n" * 20000,
    ],
)
def test_parse_squeue_refuses_what_squeue_does_not_print(text: str) -> None:
    size, problem = jobsize.parse_squeue(text, "7")
    assert size is None and problem and problem.isprintable()


def test_loop_config_is_the_kernel_struct() -> None:
    # struct loop_config: 4 + 4 + sizeof(struct loop_info64) (232) + 8 * 8
    assert loop._CONFIG.size == 304


def test_image_names_and_their_job() -> None:
    path = diskimage.image_path("/scratch/", "local", "12_3.x")
    assert path == "/scratch/jobns-local-12_3.x.img"
    assert diskimage.job_of_image(path) == "12_3.x"
    assert diskimage.job_of_image("/scratch/other.img") is None
    assert diskimage.job_of_image("/scratch/jobns-local.img") is None


def test_loop_info64_is_the_kernel_struct() -> None:
    assert loop._INFO64.size == 232  # sizeof(struct loop_info64), LOOP_GET_STATUS64


def test_file_system_minimums() -> None:
    # Measured (launcher.model.capacity): ext4 needs 104 KiB, 1 MiB leaves inodes to spare;
    # mkfs.xfs refuses anything below 300 MiB.
    assert config.FS_MIN_BYTES == {"ext4": MI, "xfs": 300 * MI}
    assert capacity.disk_minimum(cfg('[capacity]\ntmp_backing = "disk"\n')) == MI
    xfs = cfg('[capacity]\ntmp_backing = "disk"\nfs_type = "xfs"\n')
    assert capacity.disk_minimum(xfs) == 300 * MI
    assert capacity.disk_minimum(cfg('[capacity]\nfs_type = "xfs"\n')) == 1  # tmpfs


@pytest.mark.parametrize(
    ("size", "minimum", "gran", "expected"),
    [
        (1, MI, 1, MI),
        (4096, MI, 1, MI),
        (MI - 1, MI, 1, MI),
        (MI, MI, 1, MI),
        (MI + 1, MI, 1, MI + 1),  # at or above the minimum: untouched, odd or not
        (4096, 300 * MI, 1, 300 * MI),
        (4096, 300 * MI, 7 * MI, 301 * MI),  # still a multiple of the granularity
        (5, 1, 1, 5),
    ],
)
def test_at_least(size: int, minimum: int, gran: int, expected: int) -> None:
    assert capacity.at_least(size, minimum, gran) == expected


@pytest.mark.parametrize(
    ("extra", "asked", "expected"),
    [
        ("", "4KiB", MI),
        ("", "1", MI),
        ("", "5000001", 5000001),
        ('fs_type = "xfs"\n', "64MiB", 300 * MI),
        ('fs_type = "xfs"\ngranularity = "7MiB"\n', "4KiB", 301 * MI),
        ('tmp_max = "1MiB"\n', "4KiB", MI),  # rounded up to exactly the maximum: fits
    ],
)
def test_a_small_disk_capacity_is_planned_at_its_file_systems_minimum(
    extra: str, asked: str, expected: int
) -> None:
    c = cfg(f'[capacity]\ntmp_backing = "disk"\n{extra}')
    d = parse_script(f"#JOBNS tmp capacity={asked}\n", granularity=capacity.granularity(c))
    assert capacity.plan(c, d, "local").tmp == expected
    # A site default is rounded up the same way; tmpfs capacities never are.
    dflt = cfg(f'[capacity]\ntmp_backing = "disk"\ntmp_default = "{asked}"\n{extra}')
    assert capacity.plan(dflt, None, "local").tmp == expected
    tmpfs = cfg('[capacity]\ngranularity = "1"\n')
    assert capacity.plan(tmpfs, parse_script("#JOBNS tmp capacity=4KiB\n"), "local").tmp == 4096


def test_the_rounded_size_is_checked_against_tmp_max() -> None:
    c = cfg('[capacity]\ntmp_backing = "disk"\ntmp_max = "2MiB"\nfs_type = "ext4"\n')
    with pytest.raises(DirectiveError, match="tmp_max"):
        capacity.plan(c, parse_script("#JOBNS tmp capacity=3MiB\n"), "local")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '[[dirs]]\npath = "/scratch"\nbase = "/var/x"\nbacking = "disk"\nsize = "4KiB"\n',
            "[[dirs]] path = '/scratch': size = '4KiB' (4096 bytes) is smaller than ext4's",
        ),
        (
            '[capacity]\nfs_type = "xfs"\n[[dirs]]\npath = "/scratch"\nbase = "/var/x"\n'
            'backing = "disk"\nsize = "64MiB"\n',
            "smaller than xfs's smallest file system, 314572800 bytes (300 MiB",
        ),
        (
            '[capacity]\ntmp_backing = "disk"\nfs_type = "xfs"\ntmp_max = "100MiB"\n',
            "[capacity] tmp_max = '100MiB' (104857600 bytes) is smaller than xfs's",
        ),
    ],
)
def test_a_site_size_below_the_file_systems_minimum_is_a_config_error(
    text: str, needle: str
) -> None:
    with pytest.raises(JobnsError) as e:
        parse(text, "/t.toml")
    assert needle in str(e.value) and "fix: give at least" in str(e.value), e.value


@pytest.mark.parametrize(
    "text",
    [
        '[[dirs]]\npath = "/scratch"\nbase = "/var/x"\nbacking = "disk"\nsize = "1MiB"\n',
        '[[dirs]]\npath = "/scratch"\nbase = "/var/x"\nbacking = "tmpfs"\nsize = "4KiB"\n',
        '[capacity]\ntmp_max = "100MiB"\nfs_type = "xfs"\n',  # tmpfs-backed: no minimum
        '[capacity]\ntmp_backing = "disk"\ntmp_max = "1MiB"\n',
    ],
)
def test_site_sizes_at_or_above_the_minimum_are_fine(text: str) -> None:
    parse(text, "/t.toml")


def test_lo_device_decodes_like_st_dev() -> None:
    """LOOP_GET_STATUS64's lo_device is new_encode_dev(); identity() compares it with
    os.stat's st_dev: the decoding must give the same device for large numbers too."""
    for major, minor in ((8, 1), (259, 3), (253, 300), (0, 70000)):
        encoded = (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)  # new_encode_dev
        assert loop.decode_dev(encoded) == os.makedev(major, minor)


def test_stale_device_line_and_metrics() -> None:
    entry: dict[str, object] = {
        "device": "/dev/loop3",
        "image": "/scratch/jobns-local-7.img",
        "job_id": "7",
        "bytes": 64 * MI,
    }
    line = diskimage.stale_line(entry)
    assert line.startswith("/dev/loop3 is still attached to the deleted disk capacity ")
    assert "of job 7" in line and "64.0 MiB" in line and "node cap" in line
    assert "fuser -vm /dev/loop3" in line
    text = metrics.stale_disk_text([entry, entry])
    assert "jobns_stale_disk_capacities 2\n" in text
    assert f"jobns_stale_disk_capacity_bytes {128 * MI}\n" in text
    assert metrics.stale_disk_text([]).count(" 0\n") == 2


def test_a_tmp_request_from_slurm_over_tmp_max_is_the_users_error() -> None:
    """sbatch --tmp over the site's cap refuses her job (UserError); a prolog that
    exited 125 for it drained the node (issue 20)."""
    c = cfg('[capacity]\ntmp_max = "100MiB"\n')
    with pytest.raises(UserError, match="the job's --tmp request"):
        capacity.plan(c, None, "local", scheduler={"tmp": 1 << 30})
    # the site's own default over its cap stays the site's fault
    bad = cfg('[capacity]\ntmp_max = "100MiB"\ntmp_default = "1GiB"\n')
    with pytest.raises(DirectiveError) as e:
        capacity.plan(bad, None, "local")
    assert not isinstance(e.value, UserError)
