"""[[dirs]] in jobns.toml: what a site may declare and what is refused (no root)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jobns.launcher.model.config import Config, load, parse
from jobns.launcher.system.errors import JobnsError
from tests.conftest import JOBNS, require

GOOD = '[[dirs]]\npath = "/scratch/local"\nbase = "/local/jobns"\n'


def entry(**keys: str) -> str:
    body = {"path": '"/scratch/local"', "base": '"/local/jobns"', **keys}
    return "[[dirs]]\n" + "".join(f"{k} = {v}\n" for k, v in body.items() if v)


def test_a_plain_entry_defaults_to_a_directory_with_nosuid_nodev_only() -> None:
    (d,) = load_text(GOOD).dirs
    assert (d.path, d.base, d.backing, d.size, d.options) == (
        "/scratch/local",
        "/local/jobns",
        "directory",
        None,
        (),
    )


def test_sizes_are_seed_003_units_and_stored_as_bytes() -> None:
    doc = parse(
        entry(backing='"tmpfs"', size='"8MiB"', options='["ro", "noexec", "ro"]')
        + '[[dirs]]\npath = "/local"\nbase = "/data/jobns"\nbacking = "disk"\nsize = "2GB"\n',
        "t.toml",
    )
    # parse() hands bytes onward (and to root's cache): tasks never parse a size.
    entries = doc["dirs"]
    assert isinstance(entries, list)
    assert [e["size"] for e in entries] == [8 * 1024**2, 2 * 1000**3]
    a, b = load_text(
        entry(backing='"tmpfs"', size='"8MiB"', options='["ro", "noexec", "ro"]')
        + '[[dirs]]\npath = "/local"\nbase = "/data/jobns"\nbacking = "disk"\nsize = 4194304\n'
    ).dirs
    assert (a.backing, a.size, a.options) == ("tmpfs", 8 * 1024**2, ("noexec", "ro"))
    assert (b.backing, b.size) == ("disk", 4 * 1024**2)


def load_text(text: str) -> Config:
    return Config(parse(text, "t.toml"), "t.toml")


BAD = [
    # the path
    (entry(path='"scratch"'), "must be an absolute, normalised path"),
    (entry(path='"/scratch/../etc"'), "must be an absolute, normalised path"),
    (entry(path='"/scratch/./x"'), "must be an absolute, normalised path"),
    (entry(path='"/scratch//x"'), "must be an absolute, normalised path"),
    (entry(path='"/scratch/x/"'), "must be an absolute, normalised path"),
    (entry(path='"/scratch/\\u001b[2Jx"'), "must be an absolute, normalised path"),
    (entry(path='"/"'), "must be"),
    (entry(path='"/tmp"'), "already private to every job"),
    (entry(path='"/tmp/x"'), "already private to every job"),
    (entry(path='"/var/tmp/x"'), "already private to every job"),
    (entry(path='"/var"'), "already private to every job"),  # would hide /var/tmp's bind
    (entry(path='"/dev/shm/x"'), "already private to every job"),
    (entry(path='"/proc/x"'), "/proc belongs to the kernel"),
    (entry(path='"/sys"'), "/sys belongs to the kernel"),
    (entry(path='"/dev/x"'), "/dev belongs to the kernel"),
    (entry(path='"/run/jobns/x"'), "overlaps state_dir"),
    (entry(path='"/run"'), "overlaps state_dir"),
    (GOOD + GOOD.replace("/local/jobns", "/local/other"), "is, holds or lies under"),
    (GOOD + entry(path='"/scratch/local/x"', base='"/local/other"'), "is, holds or lies under"),
    (GOOD + entry(path='"/scratch"', base='"/local/other"'), "is, holds or lies under"),
    # the base
    (entry(base='"/"'), "must be an absolute, normalised path other than /"),
    (entry(base='"local"'), "must be an absolute, normalised path"),
    (entry(base='"/tmp/jobns"'), "overlaps local_base"),
    (entry(base='"/dev/shm/jobns"'), "overlaps shm_base"),
    ('local_base = "/local/jobns/x"\n' + GOOD, "overlaps local_base"),
    ('shared_base = "/local"\n' + GOOD, "overlaps shared_base"),
    ('[capacity]\nscratch_base = "/local/jobns"\n' + GOOD, "overlaps [capacity] scratch_base"),
    (entry(base='"/var/lib/jobns/scratch"'), "overlaps [capacity] scratch_base"),
    (entry(base='"/run/jobns/dirs"'), "overlaps state_dir"),
    (GOOD + entry(path='"/local2"', base='"/local/jobns/x"'), "overlaps the base of"),
    (GOOD + entry(path='"/local2"', base='"/local"'), "overlaps the base of"),
    # backing, size, options, keys
    (entry(size='"1GiB"'), "a size needs backing"),
    (entry(backing='"tmpfs"'), 'backing = "tmpfs" needs a size'),
    (entry(backing='"disk"'), 'backing = "disk" needs a size'),
    (entry(backing='"disk"', size='"2N"'), "a node count (N) is not a size"),
    (entry(backing='"disk"', size='"lots"'), "size = 'lots'"),
    (entry(backing='"tmpfs"', size="0"), "must be >= 1"),
    (entry(backing='"zfs"'), "must be one of"),
    (entry(options='["exec"]'), "must be one of"),
    (entry(options='"noexec"'), "must be of type array"),
    (entry(mode='"0755"'), "mode"),
    ('[[dirs]]\nbase = "/local/jobns"\n', "path"),
    ('[[dirs]]\npath = "/scratch/local"\n', "base"),
    ('dirs = "/scratch"\n', "must be of type array"),
]


@pytest.mark.parametrize(("text", "needle"), BAD)
def test_refused_with_one_line_naming_the_problem(text: str, needle: str) -> None:
    with pytest.raises(JobnsError) as e:
        parse(text, "/etc/jobns/jobns.toml")
    msg = str(e.value)
    assert needle in msg, msg
    assert msg.startswith("read config /etc/jobns/jobns.toml: ") and "\n" not in msg


def test_a_good_site_config_loads(tmp_path: Path) -> None:
    p = tmp_path / "j.toml"
    p.write_text(
        'local_base = "/var/lib/jobns/local"\n'
        + entry(backing='"disk"', size='"200GiB"', options='["noexec"]')
        + '[[dirs]]\npath = "/local"\nbase = "/var/lib/jobns/dirs"\n'
    )
    cfg = load(str(p), {})
    assert [(d.path, d.backing) for d in cfg.dirs] == [
        ("/scratch/local", "disk"),
        ("/local", "directory"),
    ]


def test_a_bad_entry_is_the_sites_error_exit_125(tmp_path: Path) -> None:
    """Any command reading the config fails in one line, exit 125 (the node's problem)."""
    require(Path(JOBNS).exists(), f"{JOBNS} is not installed (run ci/install-python)")
    p = tmp_path / "j.toml"
    p.write_text(entry(path='"/tmp/scratch"'))
    r = subprocess.run(
        [JOBNS, "run", "--config", str(p), "--job-id", "1", "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 125 and r.stdout == ""
    assert r.stderr.startswith("jobns: read config ") and r.stderr.count("\n") == 1
    assert "already private to every job" in r.stderr
