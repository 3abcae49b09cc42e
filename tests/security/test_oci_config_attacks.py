"""Attacks on the bundles `jobns oci-config` prepares for a job a prolog set up, run by
a real runtime (runc) as root: the job user swaps what config.json names between the
rewrite and the runtime's bind (issue 20, finding 7, as CDI had it)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import OsUser, Sandbox
from tests.e2e.test_oci_runtimes import Rig, busybox_rootfs, need
from tests.security.conftest import snapshot
from tests.security.test_cdi_attacks import beside_bobs_secrets, swap_back, swap_for_links

pytestmark = pytest.mark.root

CID = "swap"
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")


@pytest.fixture
def runc_rig(sandbox: Sandbox) -> Iterator[Rig]:
    need("runc")
    rig = Rig(sandbox, busybox_rootfs())
    yield rig
    root = ["runc", "--root", str(rig.runtime_root)]
    subprocess.run([*root, "delete", "-f", CID], capture_output=True)
    subprocess.run(["umount", "-l", str(sandbox.state)], capture_output=True)


def test_a_link_in_place_of_her_tree_never_redirects_her_bundles_binds(
    runc_rig: Rig, users: list[OsUser]
) -> None:
    """Attack: bob's job runs beside alice's; root's `jobns oci-config` (a site's
    wrapper, Slurm's RunTimeCreate run as root) prepares her container's bundle; then
    she renames her trees aside (<local>/job-A, <shm>/job-A: hers, in sticky bases) and
    puts links to bob's trees in their place, and runc (root) makes the bundle's binds.
    If config.json named her trees' paths, runc would follow her links and give her
    container bob's /tmp, /var/tmp and /dev/shm. Defence: oci-config names root's own
    mount points (<state_dir>/mounts/JOB/oci/..., root's all the way), onto which it
    bound her verified trees by fd: her container sees her own directories, bob's files
    are neither read nor written, and teardown leaves nothing."""
    rig = runc_rig
    alice = users[0]
    mine, his = rig.job(31), rig.job(32)
    box = rig.box
    pairs, before = beside_bobs_secrets(box, mine, his, users)
    script = (
        "for d in /tmp /var/tmp /dev/shm; do cat $d/s 2>/dev/null; "
        "echo pwned > $d/p 2>/dev/null; ls -A $d; done"
    )
    b = rig.bundle(CID, script, {"org.jobns.job-id": mine}, hooks={}, user=(alice.uid, alice.gid))
    swapped = False
    try:
        r = box.run(["oci-config", str(b)])
        assert r.returncode == 0, r.stderr
        swap_for_links(alice, pairs)
        swapped = True
        r = rig.run("runc", b, CID)
        assert "secret" not in r.stdout, r.stdout  # bob's files: not read...
        assert {p: snapshot(p) for _, p in pairs} == before  # ...nor written
        assert r.returncode == 0, r.stderr
        # Her container wrote into her own, real trees.
        assert (box.local / f"job-{mine}.away" / "tmp" / "p").read_text() == "pwned\n"
        assert (box.shm / f"job-{mine}.away" / "p").read_text() == "pwned\n"
        swap_back(alice, pairs)
        swapped = False
        doc = json.loads((b / "config.json").read_text())
        sources = [m["source"] for m in doc["mounts"] if m["destination"] in PRIVATE]
        assert len(sources) == 3, doc["mounts"]
        assert all(s.startswith(f"{box.state}/mounts/{mine}/oci/") for s in sources), sources
        # A second bundle of the job shares the mount points.
        r = box.run(["oci-config", str(b)])
        assert r.returncode == 0, r.stderr
        again = json.loads((b / "config.json").read_text())
        assert [m["source"] for m in again["mounts"] if m["destination"] in PRIVATE] == sources
    finally:
        if swapped:
            swap_back(alice, pairs)
        for job in (mine, his):
            assert box.run(["teardown", "--job-id", job]).returncode == 0
    assert box.leftovers() == [], box.leftovers()
    assert not (box.state / "mounts" / mine).exists()
