"""Checked at submission, attacked (issue 34, the test owed to its first part): the ordinary
user alice submits hostile batch scripts of several MiB to a cluster whose slurmctld runs
jobns's burst_buffer.lua (BurstBufferType=burst_buffer/lua, as in
tests/e2e/test_rig_submit_check.py), on every release the rig runs.

slurmctld calls slurm_bb_job_process holding its locks, so the checker must not hold it
for long on any script Slurm takes. What bounds it, and what this proves on a real
slurmctld:
  4 MiB    Slurm's own max_script_size (SchedulerParameters, default 4 MiB): a script one
           byte over it is refused by slurmctld itself, before any Lua runs; a script of
           exactly 4 MiB reaches burst_buffer.lua, which reads up to 4 MiB (MAX_SCRIPT),
           and is judged like a small one.
  64 KiB   jobns_directives.lua judges only the lines that end within the script's first
           64 KiB (MAX_JUDGED): a bad #JOBNS line whose last byte is byte 65536 is refused
           at sbatch with the message `jobns check` (the prolog's parser) gives; one byte
           later, the same line is accepted. A 2 or 3 MiB directive line, with or without
           MiB of #JOBNS junk after it, is therefore accepted, though `jobns check` refuses
           it. Left to `jobns bb setup` (slurmscriptd, before any node is allocated), which
           reads the whole script with jobns's own parser: the job is held, reason
           BurstBufferOperation, with the message `jobns check` gives, and no node ran it.
Every submission gets its clear outcome (a job id, or sbatch's error naming jobns's or
Slurm's reason) within 60 s; afterwards slurmctld answers `scontrol ping` and `sinfo`
within 10 s, and a small job of alice's runs and prints ok.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from containers.images import Release
from containers.rig import Rig
from containers.slurm import WORK, SlurmCluster
from tests.e2e.rig.burst_buffer import deployed

pytestmark = pytest.mark.docker

ALICE = "alice"
KiB, MiB = 1 << 10, 1 << 20
MAX_JUDGED = 64 * KiB  # jobns_directives.lua: lines ending past it are not judged
MAX_SCRIPT = 4 * MiB  # Slurm's default max_script_size; burst_buffer.lua reads this much
SUBMIT_BOUND = 60.0  # seconds for sbatch's answer to a hostile script
PING_BOUND = 10.0  # seconds for slurmctld to answer afterwards

HEAD = "#!/bin/sh\n#BB_LUA\n"  # asks for the burst buffer: slurm_bb_job_process checks it
BAD = "#JOBNS tmpp capacity=1G"  # an unknown verb: refused wherever it is judged
JUNK = "#JOBNS junk verb=1 and more words\n"
# What the job would run: none of these jobs reaches a node.
BODY = "jobns run -- echo in-jobns\necho ok\n"
SMALL = "#!/bin/sh\necho ok\n"
JOBNS_TOML = 'shared_base = "/lustre/bb"\n[burst_buffer]\nenabled = true\n'
TOO_BIG = "Batch job submission failed: Pathname of a file, directory or other parameter too long"


def ending_at(last: int) -> str:
    """HEAD, then BAD on line 3 padded with spaces so that its last byte is byte `last`
    (1-based) of the script, then BODY."""
    pad = last - len(HEAD) - len(BAD)
    assert pad >= 0
    return HEAD + BAD + " " * pad + "\n" + BODY


def sized(top: str, size: int) -> str:
    """top, comment lines (64 bytes, one longer or shorter), then BODY: `size` bytes."""
    rest = size - len(top) - len(BODY)
    full, extra = divmod(rest, 64)
    if extra == 1:
        full, extra = full - 1, extra + 64
    lines = ["#" + "f" * 62 + "\n"] * full + (["#" + "f" * (extra - 2) + "\n"] if extra else [])
    script = top + "".join(lines) + BODY
    assert len(script) == size
    return script


# name: (the script, how it ends): "jobns" refused at sbatch by burst_buffer.lua with
# `jobns check`'s message; "held" accepted at sbatch, then held by `jobns bb setup` with
# that message; "slurm" refused by slurmctld's max_script_size before any Lua.
CASES: dict[str, tuple[Callable[[], str], str]] = {
    "3MiB-of-junk-lines": (lambda: HEAD + JUNK * (3 * MiB // len(JUNK)) + BODY, "jobns"),
    "2MiB-line-then-1MiB-of-junk-lines": (
        lambda: HEAD + "#JOBNS " + "x" * (2 * MiB) + "\n" + JUNK * (MiB // len(JUNK)) + BODY,
        "held",
    ),
    "3MiB-directive-line": (
        lambda: HEAD + "#JOBNS shm capacity=" + "9" * (3 * MiB) + "GiB\n" + BODY,
        "held",
    ),
    "bad-line-ending-at-64KiB": (lambda: ending_at(MAX_JUDGED), "jobns"),
    "bad-line-ending-1-byte-past-64KiB": (lambda: ending_at(MAX_JUDGED + 1), "held"),
    "4MiB-script-bad-line-3": (lambda: sized(HEAD + BAD + "\n", MAX_SCRIPT), "jobns"),
    "4MiB-plus-1-byte-script": (lambda: sized(HEAD + BAD + "\n", MAX_SCRIPT + 1), "slurm"),
}


@pytest.fixture(scope="module")
def cluster(docker_client: Any, release: Release, release_image: str) -> Iterator[SlurmCluster]:
    with Rig(release_image, hostnames=["ctl", "node1"], client=docker_client) as rig:
        c = deployed(rig, ["node1"], toml=JOBNS_TOML)
        c.start()
        yield c


def submit(cluster: SlurmCluster, path: str) -> tuple[int, str, str, float]:
    """sbatch the script at `path` as alice; (exit status, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    r = cluster.controller.exec(
        ["sbatch", "--parsable", f"--chdir={WORK}", f"--output={WORK}/slurm-%j.out", path],
        user=ALICE,
        timeout=SUBMIT_BOUND + 30,
    )
    return r.exit_code, r.stdout, r.stderr, time.monotonic() - t0


def jobns_says(cluster: SlurmCluster, path: str) -> str:
    """What the prolog's parser (`jobns check`, on the node, no bound on a line) says
    about the script at `path`: it refuses every script here."""
    r = cluster.computes[0].exec(["jobns", "check", "--script", path], user=ALICE, timeout=60)
    assert r.exit_code == 125, r.stdout + r.stderr
    prefix = "jobns: check: jobns setup would refuse the job: "
    assert r.stderr.startswith(prefix) and r.stderr.count("\n") == 1, r.stderr
    return r.stderr[len(prefix) :].strip()


def still_serving(cluster: SlurmCluster) -> None:
    """slurmctld answers root's scontrol ping and sinfo within PING_BOUND, and runs a
    small job of alice's."""
    for argv in (["scontrol", "ping"], ["sinfo", "-h"]):
        t0 = time.monotonic()
        r = cluster.controller.exec(argv, timeout=PING_BOUND)
        took = time.monotonic() - t0
        assert r.exit_code == 0 and took < PING_BOUND, (argv, r, took, cluster.logs())
    assert "is UP" in cluster.controller.exec(["scontrol", "ping"], timeout=PING_BOUND).stdout
    job_id = cluster.sbatch(ALICE, SMALL)
    assert cluster.output(job_id).split() == ["ok"]


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_script_gets_a_clear_answer_in_bounded_time(
    cluster: SlurmCluster, name: str
) -> None:
    make, outcome = CASES[name]
    script = make()
    assert len(script) > MAX_JUDGED and len(script) <= MAX_SCRIPT + 1, len(script)
    path = f"{WORK}/attack-{name}-{time.monotonic_ns()}.sh"
    cluster.controller.put_file(path, script, mode=0o755)
    del script
    code, out, err, took = submit(cluster, path)
    assert took < SUBMIT_BOUND, (name, took, err)
    if outcome == "slurm":
        # slurmctld's job_create_request: "strlen(script) too big (N > 4194304)".
        assert code != 0 and not out.strip(), (out, err)
        assert TOO_BIG in err and "jobns" not in err, err
        log = cluster.controller.exec(["cat", "/var/log/slurm/slurmctld.log"], timeout=10)
        assert f"strlen(script) too big ({MAX_SCRIPT + 1} > {MAX_SCRIPT})" in log.stdout, log
    elif outcome == "jobns":
        says = jobns_says(cluster, path)
        assert says.startswith("script line 3: "), says
        assert code != 0 and not out.strip(), (out, err)
        assert f"burst_buffer/lua: jobns: {says}\n" in err, err
        assert "Burst Buffer request invalid" in err, err
    else:
        # Past the 64 KiB bound: not judged at submission; `jobns bb setup` reads the
        # whole script before any node is allocated and holds the job.
        says = jobns_says(cluster, path)
        assert says.startswith("script line 3: "), says
        assert code == 0 and out.strip().isdigit(), (out, err)
        job_id = out.strip()
        # Held: priority 0, jobns's line in its SystemComment (and, spaces written as
        # '_', as its reason).
        said = f"jobns: bb setup job {job_id}: {says[:100]}"
        deadline = time.monotonic() + 120
        while True:
            shown = cluster.controller.exec(["scontrol", "show", "job", job_id], timeout=30)
            if said in shown.stdout.partition("SystemComment=")[2]:
                break
            assert time.monotonic() < deadline, (said, shown.stdout, cluster.logs())
            time.sleep(0.5)
        assert "JobState=PENDING" in shown.stdout, shown.stdout  # no node ran it
        assert "Priority=0 " in shown.stdout, shown.stdout
        cluster.scancel(job_id)
    still_serving(cluster)
