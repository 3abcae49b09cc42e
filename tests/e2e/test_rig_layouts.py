"""The three layouts of docs/design.md "Directory layouts" on two rig nodes sharing /lustre (a
docker volume).

  local     <local_base>/job-ID/{tmp,var_tmp} + <shm_base>/job-ID      (per node)
  shared    <shared_base>/job-ID/{tmp,var_tmp}                          (one for all nodes)
  per-node  <shared_base>/job-ID/<hostname>/{tmp,var_tmp}

Both nodes run one job at the same time; the job scripts meet at barriers on the
volume (outside the job trees), so every check runs while both jobs are alive.
Each layout runs in the three modes of tests/e2e/rig/jobs.py (root, root for
alice via --user, alice herself through a user namespace).
"""

from __future__ import annotations

import time

import pytest

from containers.rig import ExecResult, Node, Rig
from tests.e2e.rig.jobs import (
    MODES,
    SHARED_BASE,
    SYNC_BASE,
    UIDS,
    WAIT_FOR,
    concurrently,
    describe,
    in_background,
    new_job_id,
    run_job,
)

pytestmark = pytest.mark.docker

# $1 other node, $2 layout, $3 the job's directory on the volume, $4 expected uid,
# $5 barrier directory. Exit codes name the failed check (2-7), messages say what.
SHARED_JOB = (
    WAIT_FOR
    + """\
set -eu
me=$(hostname) other=$1 layout=$2 top=$3 uid=$4 sync=$5
if [ "$layout" = per-node ]; then mine=$top/$me/tmp theirs=$top/$other/tmp
else mine=$top/tmp theirs=$top/tmp; fi
echo "$me" > "/tmp/from-$me"
echo "$me" > "/var/tmp/var-from-$me"
[ -e "$mine/from-$me" ] || { echo "$me: /tmp/from-$me is not at $mine" >&2; exit 2; }
vmine=${mine%/tmp}/var_tmp
[ -e "$vmine/var-from-$me" ] || { echo "$me: /var/tmp is not at $vmine" >&2; exit 2; }
owner=$(stat -c %u "/tmp/from-$me")
[ "$owner" = "$uid" ] || { echo "$me: /tmp/from-$me owned by $owner, not $uid" >&2; exit 6; }
touch "$sync/ready-$me"
wait_for "$sync/ready-$other"          # both jobs run and have written their file
[ -e "$theirs/from-$other" ] || { echo "$me: no $theirs/from-$other on the volume" >&2; exit 4; }
if [ "$layout" = per-node ]; then
  [ ! -e "/tmp/from-$other" ] || { echo "$me: LEAK: /tmp/from-$other visible" >&2; exit 5; }
else
  [ -e "/tmp/from-$other" ] || { echo "$me: shared /tmp lacks from-$other" >&2; exit 5; }
fi
touch "$sync/checked-$me"
wait_for "$sync/checked-$other"        # neither job ends (and removes its tree) too early
"""
)

LOCAL_JOB = (
    WAIT_FOR
    + """\
set -eu
me=$(hostname) sync=$1
echo a > /tmp/a; echo b > /var/tmp/b; echo c > /dev/shm/c
touch "$sync/ready-$me"
wait_for "$sync/go-$me"                # the test looks at the node from outside meanwhile
"""
)


def make_sync(node: Node, job_id: str) -> str:
    sync = f"{SYNC_BASE}/{job_id}"
    node.exec(["install", "-d", "-m", "1777", SYNC_BASE, sync]).check(f"mkdir {sync}")
    return sync


def volume_entries(node: Node, job_id: str) -> list[str]:
    """Anything of this job left in the shared base, temporary names included."""
    r = node.exec(["ls", "-A", SHARED_BASE]).check(f"ls {SHARED_BASE}")
    return [n for n in r.stdout.split() if f"job-{job_id}" in n]


def run_pair(
    rig: Rig, job_id: str, mode: str, flags: list[str], layout: str
) -> dict[str, ExecResult]:
    sync = make_sync(rig.nodes[0], job_id)
    top = f"{SHARED_BASE}/job-{job_id}"
    n1, n2 = rig.node("node1"), rig.node("node2")
    r1, r2 = concurrently(
        [
            lambda: run_job(
                n1, job_id, mode, flags, SHARED_JOB, ["node2", layout, top, str(UIDS[mode]), sync]
            ),
            lambda: run_job(
                n2, job_id, mode, flags, SHARED_JOB, ["node1", layout, top, str(UIDS[mode]), sync]
            ),
        ]
    )
    results = {"node1": r1, "node2": r2}
    assert r1.exit_code == 0 and r2.exit_code == 0, describe(results)
    return results


@pytest.mark.parametrize("mode", MODES)
def test_per_node_each_node_has_its_own_directory(rig: Rig, mode: str) -> None:
    job_id = new_job_id()
    run_pair(rig, job_id, mode, ["--use-shared-tmpdir=per-node"], "per-node")
    assert volume_entries(rig.nodes[0], job_id) == [], "per-node tree left on the volume"
    for n in rig.nodes:
        n.exec(["test", "!", "-e", f"/dev/shm/job-{job_id}"]).check(f"/dev/shm/job-{job_id} gone")
        n.exec(["test", "!", "-e", f"/tmp/job-{job_id}"]).check("no local tree for a shared job")


@pytest.mark.parametrize("mode", MODES)
def test_shared_both_nodes_share_one_directory(rig: Rig, mode: str) -> None:
    job_id = new_job_id()
    run_pair(rig, job_id, mode, ["--use-shared-tmpdir"], "shared")
    assert volume_entries(rig.nodes[0], job_id) == [], "shared tree left on the volume"


@pytest.mark.parametrize("layout", ["shared", "per-node"])
@pytest.mark.parametrize("mode", MODES)
def test_no_rm_tmpdir_keeps_the_directories(rig: Rig, mode: str, layout: str) -> None:
    job_id = new_job_id()
    flag = "--use-shared-tmpdir" + ("=per-node" if layout == "per-node" else "")
    run_pair(rig, job_id, mode, [flag, "--no-rm-tmpdir"], layout)
    top = f"{SHARED_BASE}/job-{job_id}"
    node1 = rig.nodes[0]
    try:
        for host in ("node1", "node2"):
            where = f"{top}/{host}" if layout == "per-node" else top
            for path in (f"{where}/tmp/from-{host}", f"{where}/var_tmp/var-from-{host}"):
                node1.exec(["test", "-f", path]).check(f"{path} kept after the job")
        owner = node1.exec(["stat", "-c", "%u", top]).check(f"stat {top}").stdout.strip()
        assert owner == str(UIDS[mode]), f"{top} owned by {owner}"
    finally:
        node1.exec(["rm", "-rf", top])
    for n in rig.nodes:  # --no-rm-tmpdir is about the shared directories only
        n.exec(["test", "!", "-e", f"/dev/shm/job-{job_id}"]).check(f"/dev/shm/job-{job_id} gone")


@pytest.mark.parametrize("mode", MODES)
def test_local_layout_is_per_node_and_removed(rig: Rig, mode: str) -> None:
    job_id = new_job_id()
    sync = make_sync(rig.nodes[0], job_id)
    uid = str(UIDS[mode])

    def look_while_running() -> None:
        for n in rig.nodes:
            for _ in range(600):
                if n.exec(["test", "-e", f"{sync}/ready-{n.hostname}"]).exit_code == 0:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"{n.hostname}: job never became ready")
            for path in (
                f"/tmp/job-{job_id}/tmp/a",
                f"/tmp/job-{job_id}/var_tmp/b",
                f"/dev/shm/job-{job_id}/c",
            ):
                r = n.exec(["stat", "-c", "%u", path]).check(f"{n.hostname}: {path} exists")
                assert r.stdout.strip() == uid, f"{n.hostname}: {path} owned by {r.stdout}"
            for path in ("/tmp/a", "/var/tmp/b", "/dev/shm/c"):  # the node's own stay clean
                n.exec(["test", "!", "-e", path]).check(f"{n.hostname}: {path} not in the node's")
        assert volume_entries(rig.nodes[0], job_id) == [], "a local job wrote to the volume"
        for n in rig.nodes:
            n.exec(["touch", f"{sync}/go-{n.hostname}"]).check("release the job")

    def release_anyway() -> None:  # a failed look must not leave the jobs waiting 60 s
        for n in rig.nodes:
            n.exec(["touch", f"{sync}/go-{n.hostname}"])

    def look() -> None:
        try:
            look_while_running()
        finally:
            release_anyway()

    with in_background(look):
        r1, r2 = concurrently(
            [
                lambda: run_job(rig.node("node1"), job_id, mode, [], LOCAL_JOB, [sync]),
                lambda: run_job(rig.node("node2"), job_id, mode, [], LOCAL_JOB, [sync]),
            ]
        )
    assert r1.exit_code == 0 and r2.exit_code == 0, describe({"node1": r1, "node2": r2})
    for n in rig.nodes:
        for path in (f"/tmp/job-{job_id}", f"/dev/shm/job-{job_id}"):
            n.exec(["test", "!", "-e", path]).check(f"{n.hostname}: {path} removed")
