"""Day one for an administrator (issue 32): a fresh bookworm node from the rig's images,
the two packages ci/build-deb made for bookworm, and the commands of docs/admin.md
"Deploying on a Slurm cluster", in its order, with `jobns doctor` run where an
administrator would run it: before Slurm is configured (exit 125, "run jobns doctor
again after configuring Slurm"), last (exit 0 once its one container-specific fix is
made), then an enforced job of an ordinary user's in its namespace, and a moved
state_dir, a missing plugin and a broken jobns.toml each a `problem:` with its fix.

The node is the release's debs image (the base image, Slurm and every dependency
installed from Debian, plus the two .debs in /opt/jobns/debs, nothing of jobns
installed), so this is the site's machine before step 1. The rig has no systemd: step 6
starts the helper as jobns-helper.service would (containers/slurm.py start_helper), and
the timers are left out. Each step's wall time is printed (pytest -s) and kept in
TIMES for the report.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from containers import images
from containers.rig import ExecResult, Node, Rig
from containers.slurm import ENFORCE_CONF, SlurmCluster

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
RELEASE = "bookworm"  # the cheapest image set; the steps are the same on every release
TOML = "/etc/jobns/jobns.toml"
PLUGSTACK_D = "/etc/slurm/plugstack.conf.d/jobns.conf"
# docs/admin.md's commands, as written there (test_the_docs_hold_these_commands)
EDIT_TOML = [
    "install -d -m 0755 /var/lib/jobns",
    f"""sed -i -e 's|^#local_base = "/tmp"|local_base = "/var/lib/jobns"|' {TOML}""",
    f"sed -i -e 's|^#\\[slurm\\]|[slurm]|' -e 's|^#enforce = false|enforce = true|' {TOML}",
]
ENABLE_PLUGIN = f"sed -i 's|^#required |required |' {PLUGSTACK_D}"
SLURM_CONF_LINES = ["Prolog=/etc/jobns/slurm/prolog", "Epilog=/etc/jobns/slurm/epilog"]
READY = "jobns doctor: this node is ready"
TIMES: dict[str, float] = {}


def test_the_docs_hold_these_commands() -> None:
    """The test runs what docs/admin.md tells the administrator, character for character."""
    docs = (REPO / "docs" / "admin.md").read_text()
    section = docs.split("## Deploying on a Slurm cluster", 1)[1].split("\n## ", 1)[0]
    for command in [*EDIT_TOML, ENABLE_PLUGIN, *SLURM_CONF_LINES, "jobns doctor"]:
        assert command in section, command
    # doctor comes last among the numbered steps
    steps = re.findall(r"^(\d)\. \*\*(.+?)\*\*", section, re.M)
    assert [n for n, _ in steps] == [str(i) for i in range(1, len(steps) + 1)]
    doctor_at = next(int(n) for n, title in steps if "jobns doctor" in title)
    assert all("jobns doctor" not in t for n, t in steps if int(n) > doctor_at + 1), steps


@pytest.fixture(scope="module")
def debs_image(docker_client: Any) -> str:
    t = time.monotonic()
    image = images.build(docker_client, release_name=RELEASE).debs
    TIMES["images (the debs layer is rebuilt when jobns changed)"] = time.monotonic() - t
    return image


@pytest.fixture
def node(docker_client: Any, debs_image: str) -> Iterator[tuple[Rig, Node]]:
    with Rig(debs_image, hostnames=["node1"], client=docker_client) as rig:
        yield rig, rig.node("node1")


def step(name: str, action: Callable[[], ExecResult | None]) -> ExecResult | None:
    t = time.monotonic()
    result = action()
    TIMES[name] = time.monotonic() - t
    return result


def doctor(node: Node) -> tuple[int, list[str]]:
    r = node.exec(["jobns", "doctor"], timeout=60)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r.exit_code, r.stdout.splitlines()


def problems(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("problem:")]


def sh(node: Node, script: str, what: str) -> ExecResult:
    return node.sh(script, timeout=300).check(what)


def test_day_one(node: tuple[Rig, Node]) -> None:
    rig, n = node
    t0 = time.monotonic()
    # The site's machine before step 1: Slurm's own directories and its users, no jobns
    # config (the rig writes one for its other tests).
    sh(
        n,
        "rm -rf /etc/jobns && mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "
        "&& chown -R munge:munge /var/log/munge /var/lib/munge /etc/munge "
        "&& useradd --create-home --user-group --uid 1001 --shell /bin/bash alice",
        "the node's own set-up",
    )

    # 1. Install: the files carry the release.
    debs = sh(n, f"cd {images.DEB_DIR} && ls jobns_*.deb jobns-slurm_*.deb", "ls").stdout.split()
    assert len(debs) == 2 and all("~deb12u1_" in d for d in debs), debs
    install = "apt-get install -y --no-install-recommends " + " ".join(f"./{d}" for d in debs)
    step(
        "1 install the two packages",
        lambda: sh(n, f"cd {images.DEB_DIR} && DEBIAN_FRONTEND=noninteractive {install}", install),
    )

    # Before Slurm is configured doctor is not satisfied, and says to come back.
    t = time.monotonic()
    code, lines = doctor(n)
    TIMES["jobns doctor before Slurm is configured"] = time.monotonic() - t
    print("\n--- jobns doctor before Slurm is configured:", *lines, sep="\n")
    assert code == 125, lines
    assert "Slurm is not configured yet (no /etc/slurm/slurm.conf)" in lines[-1], lines
    assert lines[-1].endswith("configuring Slurm"), lines
    assert "run jobns doctor again after" in lines[-1], lines

    # 2. jobns.toml, as the docs edit it.
    step("2 edit jobns.toml", lambda: sh(n, " && ".join(EDIT_TOML), "edit jobns.toml"))
    assert "[slurm]\nenforce = true" in n.get_file(TOML).decode()

    # 3.-6. slurm.conf (Prolog/Epilog), the plugin line, slurmd, the helper: a one-node
    # cluster (controller and compute on node1) as the rig makes one.
    cluster = SlurmCluster(rig, "node1", ["node1"], jobns=True, extra=ENFORCE_CONF)
    step("3 slurm.conf Prolog/Epilog (+ munge)", cluster.configure)
    conf = n.get_file("/etc/slurm/slurm.conf").decode()
    assert all(line in conf.splitlines() for line in SLURM_CONF_LINES), conf
    step("4 uncomment the plugin line", lambda: sh(n, ENABLE_PLUGIN, ENABLE_PLUGIN))
    step("5+6 start slurmctld, the helper, slurmd (wait idle)", lambda: cluster.start(60))

    # 7. doctor last. The one problem a container adds: its / is a private mount.
    t = time.monotonic()
    code, lines = doctor(n)
    found = problems(lines)
    if found:
        print("--- jobns doctor after step 6:", *lines, sep="\n")
        assert len(found) == 1 and "mount --make-rshared /" in found[0], lines
        sh(n, "mount --make-rshared /", "doctor's fix")
        code, lines = doctor(n)
    print("--- jobns doctor, last:", *lines, sep="\n")
    TIMES["7 jobns doctor"] = time.monotonic() - t
    assert (code, lines[-1]) == (0, READY), "\n".join(lines)
    # no loop devices in this container, and no disk backing: a note, with the host's fix
    if not any(ln.startswith("ok: loop devices") for ln in lines):
        assert any(ln.startswith("note: no /dev/loop-control") for ln in lines), lines
        assert any("this node is a container" in ln for ln in lines), lines
    TIMES["total, fresh node to ready"] = time.monotonic() - t0

    # 8. An ordinary user checks her directives, then her enforced job runs in its namespace.
    script = (
        "#!/bin/sh\n#SBATCH --comment='jobns: shm capacity=64MiB'\n"
        'echo "joined=$JOBNS_JOINED tmpdir=$TMPDIR"\n'
        "touch /tmp/day-one; ls -A /tmp\n"
        "df -k --output=size /dev/shm | tail -n 1\n"
    )
    n.put_file("/home/alice/job.sh", script, mode=0o644)
    r = n.exec(["jobns", "check", "--script", "/home/alice/job.sh"], user="alice")
    assert r.exit_code == 0 and "/dev/shm 64.0 MiB" in r.stdout, r
    t = time.monotonic()
    job = cluster.sbatch("alice", script)
    TIMES["8 an enforced job of alice's (sbatch to done)"] = time.monotonic() - t
    out = cluster.output(job).split()
    assert out[0].startswith(f"joined={job}:") and out[1] == "tmpdir=/tmp", out
    assert out[2:4] == ["day-one", "65536"], out  # her own /tmp, her 64 MiB /dev/shm
    assert sh(n, "ls -A /tmp", "ls /tmp").stdout.split().count("day-one") == 0

    # What doctor must call a problem, each with its fix; the node is ready again after.
    saved = n.get_file(TOML)
    broken = {
        "a moved state_dir": (
            f'sed -i \'s|^#state_dir = "/run/jobns"|state_dir = "/run/jobns-moved"|\' {TOML}',
            "state_dir differs between the files that name it",
        ),
        "a missing plugin": (
            f"sed -i 's|^required |#required |' {PLUGSTACK_D}",
            f"uncomment the 'required' line in {PLUGSTACK_D}",
        ),
        "a broken jobns.toml": (f"echo 'enforec = true' >> {TOML}", f"fix: correct {TOML}"),
    }
    for what, (edit, needle) in broken.items():
        sh(n, edit, what)
        code, lines = doctor(n)
        assert code == 125, (what, lines)
        hits = [p for p in problems(lines) if needle in p]
        print(f"--- {what}:", *problems(lines), lines[-1], sep="\n")
        assert len(hits) == 1 and "fix: " in hits[0], (what, lines)
        n.put_file(TOML, saved)
        sh(n, ENABLE_PLUGIN, "enable the plugin again")
        code, lines = doctor(n)
        assert (code, lines[-1]) == (0, READY), (what, lines)

    print("\nday one, wall time of each step:")
    for name, took in TIMES.items():
        print(f"  {took:6.1f}s  {name}")
