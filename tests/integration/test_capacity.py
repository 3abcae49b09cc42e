"""#JOBNS shm|tmp capacity=, for real: size-limited tmpfs on the job's trees (root)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import OsUser, Sandbox, assert_refused, job_mounts

pytestmark = pytest.mark.root

KI, MI, GI, TI, PI = 1024, 1024**2, 1024**3, 1024**4, 1024**5
PAGE = os.sysconf("SC_PAGE_SIZE")


def script(box: Sandbox, *directives: str, word: str = "JOBNS") -> Path:
    path = box.root / f"job-{len(list(box.root.glob('job-*.sh')))}.sh"
    body = [
        "#!/bin/sh",
        "#SBATCH --nodes=1",
        *(f"#{word} {d}" for d in directives),
        "#SBATCH --time=5",
        "srun hostname",
    ]
    path.write_text("\n".join(body) + "\n")
    return path


def setup_with(
    box: Sandbox, job: str, user: OsUser, *directives: str, word: str = "JOBNS"
) -> subprocess.CompletedProcess[str]:
    return box.run(
        [
            "setup",
            "--job-id",
            job,
            "--user",
            user.name,
            "--script",
            str(script(box, *directives, word=word)),
        ]
    )


def record(box: Sandbox, job: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((box.state / "jobs" / job / "state.json").read_text())
    return doc


def fs_size(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def tmpfs_at(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln for ln in f if ln.split()[4] == str(path) and " - tmpfs " in ln]


def assert_clean(box: Sandbox) -> None:
    """Nothing of any job is left: no directory, no mount, no state (a job rejected
    before setup began never made its state directory)."""
    assert box.leftovers() == []
    assert job_mounts(box) == []
    jobs = box.state / "jobs"
    assert not jobs.exists() or sorted(os.listdir(jobs)) == []


def teardown(box: Sandbox, job: str) -> None:
    r = box.run(["teardown", "--job-id", job])
    assert r.returncode == 0, r.stderr


def test_writing_past_shm_capacity_is_enospc_and_node_shm_untouched(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    r = setup_with(sandbox, "c1", alice, "shm capacity=1MiB")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    node_before = os.statvfs("/dev/shm")
    # 2 MiB into a 1 MiB /dev/shm, as the job user, through a joined task.
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "c1",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/shm/big bs=64k count=32; echo rc=$?; "
            "echo still > /dev/shm/small; echo small=$?; "
            "stat -c %s /dev/shm/big; df -B1 --output=size /dev/shm | tail -1",
        ],
        user=alice,
    )
    assert r.returncode == 0, r.stderr
    assert "No space left on device" in r.stderr
    out = r.stdout.split()
    assert "rc=1" in out and "small=1" in out  # full is full, for every write
    big, size = int(out[-2]), int(out[-1])
    assert big <= MI and size == MI
    # The node's /dev/shm did not take the job's bytes: they are in the job's own tmpfs.
    node_after = os.statvfs("/dev/shm")
    assert (node_before.f_bfree - node_after.f_bfree) * node_after.f_frsize < MI // 2
    (line,) = tmpfs_at(sandbox.shm / "job-c1")
    assert "nosuid" in line and "nodev" in line and "jobns-shm-c1" in line
    assert (sandbox.shm / "job-c1" / "big").stat().st_uid == alice.uid
    # Other steps of the job see the same limited /dev/shm.
    r = sandbox.run(["run", "--job-id", "c1", "--", "stat", "-c", "%s", "/dev/shm/big"], user=alice)
    assert r.stdout.strip() == str(big)
    teardown(sandbox, "c1")
    assert tmpfs_at(sandbox.shm / "job-c1") == []
    assert_clean(sandbox)


def test_tmp_capacity_covers_tmp_and_var_tmp_together(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    alice = users[0]
    assert setup_with(sandbox, "c2", alice, "tmp capacity=2MiB").returncode == 0
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "c2",
            "--",
            "sh",
            "-c",
            "head -c 1500000 /dev/zero > /tmp/a && echo a-ok; "
            "head -c 1000000 /dev/zero > /var/tmp/b || echo b-full; "
            "ls -ld /tmp /var/tmp | cut -c1-10",
        ],
        user=alice,
    )
    assert r.stdout.split()[:2] == ["a-ok", "b-full"], (r.stdout, r.stderr)
    assert r.stdout.split()[2:] == ["drwxrwxrwt", "drwxrwxrwt"]
    assert fs_size(sandbox.local / "job-c2") == 2 * MI
    assert record(sandbox, "c2")["capacities"] == {"shm": None, "tmp": 2 * MI}
    teardown(sandbox, "c2")
    assert_clean(sandbox)


CASES = [  # (capacity text, granularity config line, expected bytes)
    ("4096", "", 4096),
    ("5000", "", 5000),
    ("1.5K", "", 1536),
    *[
        (f"3{s}", "", 3 * u)
        for s, u in (
            ("K", KI),
            ("KiB", KI),
            ("M", MI),
            ("MiB", MI),
            ("G", GI),
            ("GiB", GI),
            ("T", TI),
            ("TiB", TI),
            ("P", PI),
            ("PiB", PI),
            ("KB", 10**3),
            ("MB", 10**6),
            ("GB", 10**9),
            ("TB", 10**12),
            ("PB", 10**15),
        )
    ],
    ("1500K", 'granularity = "1MiB"', 2 * MI),  # rounded up to the next multiple
    ("2MiB", 'granularity = "1MiB"', 2 * MI),  # a multiple stays
    ("1", 'granularity = "1MiB"', MI),  # below one granule: one granule
    ("1001", "granularity = 1000", 2000),  # a plain number of bytes
    ("1MB", 'granularity = "64KiB"', 16 * 64 * KI),
    ("0.5GB", 'granularity = "1GB"', 10**9),
]


@pytest.mark.parametrize(("text", "gran", "expected"), CASES)
def test_every_suffix_and_granularity_end_to_end(
    sandbox: Sandbox, users: list[OsUser], text: str, gran: str, expected: int
) -> None:
    sandbox.write_config(f"[capacity]\n{gran}\n" if gran else "")
    r = setup_with(sandbox, "c3", users[0], f"shm capacity={text}")
    assert r.returncode == 0, r.stderr
    assert record(sandbox, "c3")["capacities"] == {"shm": expected, "tmp": None}
    # tmpfs holds whole pages: the kernel rounds the size up to one.
    assert fs_size(sandbox.shm / "job-c3") == -(-expected // PAGE) * PAGE
    teardown(sandbox, "c3")
    assert_clean(sandbox)


@pytest.mark.parametrize(
    ("directives", "needle"),
    [
        (["shm capacity=2N"], "line 3: '#JOBNS shm capacity=2N': capacity '2N' is a node count"),
        (["tmp capacity=1N"], "line 3: '#JOBNS tmp capacity=1N'"),
        (["shm capacity=2gib"], "line 3: '#JOBNS shm capacity=2gib'"),
        (["shm capacity=0"], "must be greater than zero"),
        (["shm capacity=-1K"], "not a number"),
        (["shm capacity=1MiB", "shm capacity=2MiB"], "line 4"),
        (["shm"], "line 3: '#JOBNS shm': shm needs capacity="),
        (["tmp capacity=1MiB", "shared_tmpdir"], "tmp capacity needs the local layout"),
        (["shm capacity=3MiB"], "more than this site allows (shm_max"),
    ],
)
def test_invalid_capacities_refuse_the_job_naming_the_line(
    sandbox: Sandbox, users: list[OsUser], directives: list[str], needle: str
) -> None:
    sandbox.write_config('[capacity]\nshm_max = "2MiB"\n')
    r = setup_with(sandbox, "c4", users[0], *directives)
    assert r.stderr.count("\n") == 1
    assert_refused(sandbox, "c4", users[0], r, needle)


def test_unknown_keys_and_directives_refuse_the_job(sandbox: Sandbox, users: list[OsUser]) -> None:
    """Issue 30, finding 7: a key or a directive jobns does not know would have run the job
    otherwise than she wrote (a misspelt `capcity` gave the default): it refuses the job,
    naming the line (before: a warning in the prolog's log only)."""
    alice = users[0]
    r = setup_with(sandbox, "c5", alice, "shm capacity=1MiB pool=fast")
    assert_refused(sandbox, "c5", alice, r, "unknown key 'pool' for shm")
    r = setup_with(sandbox, "c5b", alice, "frob x=1")
    assert_refused(sandbox, "c5b", alice, r, "'frob'")


def test_a_size_with_a_space_refuses_the_job(sandbox: Sandbox, users: list[OsUser]) -> None:
    """Issue 30, finding 7: `--comment "jobns: shm capacity=2 GiB"` gave a 4 KiB /dev/shm
    with a warning only in the prolog's log; now the job is refused with the fix, and
    the error names the comment, where she wrote it."""
    alice = users[0]
    r = sandbox.run(
        ["setup", "--job-id", "c5c", "--user", alice.name],
        env={"SLURM_JOB_COMMENT": "jobns: shm capacity=2 GiB"},
    )
    assert_refused(sandbox, "c5c", alice, r, "capacity=2GiB")
    assert "--comment" in r.stderr, r.stderr


def test_a_comment_meant_for_jobns_without_its_colon_refuses_the_job(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """Issue 30, finding 7: `jobns shm capacity=1MiB` (no colon) was ignored without a
    word; an ordinary comment that mentions jobns still is."""
    alice = users[0]
    r = sandbox.run(
        ["setup", "--job-id", "c5d", "--user", alice.name],
        env={"SLURM_JOB_COMMENT": "jobns shm capacity=1MiB"},
    )
    assert_refused(sandbox, "c5d", alice, r, "jobns:")
    r = sandbox.run(
        ["setup", "--job-id", "c5e", "--user", alice.name],
        env={"SLURM_JOB_COMMENT": "testing jobns today"},
    )
    assert r.returncode == 0 and "refused" not in r.stderr, r.stderr
    teardown(sandbox, "c5e")
    assert_clean(sandbox)


def test_configured_directive_word_and_site_default(sandbox: Sandbox, users: list[OsUser]) -> None:
    sandbox.write_config(
        '[directives]\nword = "BB_JOBNS"\n[capacity]\nshm_default = "3MiB"\ntmp_default = "5MiB"\n'
    )
    r = setup_with(sandbox, "c6", users[0], "shm capacity=1MiB", word="BB_JOBNS")
    assert r.returncode == 0, r.stderr
    assert fs_size(sandbox.shm / "job-c6") == MI  # asked for
    assert fs_size(sandbox.local / "job-c6") == 5 * MI  # the site default
    teardown(sandbox, "c6")
    # #JOBNS is now an ordinary comment: the defaults apply.
    r = setup_with(sandbox, "c7", users[0], "shm capacity=1MiB")
    assert r.returncode == 0, r.stderr
    assert fs_size(sandbox.shm / "job-c7") == 3 * MI
    teardown(sandbox, "c7")
    assert_clean(sandbox)


def test_capacity_through_directives_option_and_dry_run(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    r = sandbox.run(
        [
            "setup",
            "--job-id",
            "c8",
            "--user",
            users[0].name,
            "--dry-run",
            "--directives",
            "shm capacity=1MiB; tmp capacity=2MiB",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert "mount  tmpfs size=1048576 (1.0 MiB) on the shm tree" in r.stdout
    assert "mount  tmpfs size=2097152 (2.0 MiB) on the tmp tree" in r.stdout
    assert sandbox.leftovers() == []
    r = sandbox.run(
        [
            "setup",
            "--job-id",
            "c8",
            "--user",
            users[0].name,
            "--directives",
            "shm capacity=1MiB; tmp capacity=2MiB",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert fs_size(sandbox.shm / "job-c8") == MI and fs_size(sandbox.local / "job-c8") == 2 * MI
    # The prolog running twice is still idempotent; other capacities are other options.
    assert (
        sandbox.run(
            [
                "setup",
                "--job-id",
                "c8",
                "--user",
                users[0].name,
                "--directives",
                "shm capacity=1MiB; tmp capacity=2MiB",
            ]
        ).returncode
        == 0
    )
    r = sandbox.run(
        ["setup", "--job-id", "c8", "--user", users[0].name, "--directives", "shm capacity=4MiB"]
    )
    assert r.returncode == 125 and "already set up" in r.stderr
    assert "capacities: shm=1048576, tmp=2097152, now shm=4194304, tmp=none" in r.stderr
    assert "{" not in r.stderr, r.stderr  # words, not a Python dict
    teardown(sandbox, "c8")
    assert_clean(sandbox)


def test_standalone_run_ignores_capacities(sandbox: Sandbox, users: list[OsUser]) -> None:
    """Directives reach only setup: without it, the node's file systems apply."""
    sandbox.write_config('[capacity]\nshm_default = "1MiB"\n')
    r = sandbox.run(
        [
            "run",
            "--job-id",
            "c9",
            "--",
            "sh",
            "-c",
            "head -c 2000000 /dev/zero > /dev/shm/x && echo ok",
        ],
        user=users[0],
    )
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert_clean(sandbox)


def test_teardown_of_a_job_whose_capacity_tmpfs_is_busy_still_unmounts(
    sandbox: Sandbox, users: list[OsUser]
) -> None:
    """A process of the job's user on the host holding a file open in the tree does
    not stop teardown (the mount is detached) and nothing is left mounted."""
    alice = users[0]
    assert setup_with(sandbox, "c10", alice, "shm capacity=1MiB").returncode == 0
    holder = subprocess.Popen(["sleep", "300"], cwd=sandbox.shm / "job-c10", **Sandbox.creds(alice))
    try:
        teardown(sandbox, "c10")
    finally:
        holder.kill()
        holder.wait()
    assert tmpfs_at(sandbox.shm / "job-c10") == []
    assert job_mounts(sandbox) == []
