"""The Debian packages of ci/build-deb on rig nodes: build, a local repository of the
Debian packages they need, an offline install, and a smoke test.

    debs = build(out)                                        # ci/build-deb on this host
    repo = dependency_repo(client, image, out / "repo", [*map(str, debs), "openssh-server"])
    with Rig(image, hostnames=["node1"]) as rig:             # a jobns-rig-base image
        install(rig.node("node1"), debs, repo, extra=("openssh-server",))
        smoke(rig.node("node1"))                             # RigError on a failure

The repository holds exactly what apt on this host resolves for the image's installed
packages (its dpkg status): the node installs with no network at all (a rig's network is
internal), so what jobns needs besides its own two .debs is provably Debian's. That
needs this host's apt to know the image's suite (bookworm here). The packages are built
per suite (its python3, its libslurm-dev): build_in runs ci/build-deb inside a node

    built = build_in(node, out, dependency_repo(client, image, out / "bd", source=REPO))

For another suite (trixie, forky) pass repo=None to build_in and install: apt then uses
the image's own sources, so the node must reach that suite's archive.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from containers.errors import RigError
from containers.rig import ExecResult, Node

REPO = Path(__file__).resolve().parents[1]
NODE_DEBS = "/var/tmp/jobns-debs"
NODE_REPO = "/var/tmp/jobns-repo"
PACKAGES = ("jobns", "jobns-slurm")
SMOKE_USER = "jobnssmoke"


def build(out: Path) -> list[Path]:
    """ci/build-deb into out: [jobns_*.deb, jobns-slurm_*.deb]."""
    r = subprocess.run(
        [str(REPO / "ci" / "build-deb"), str(out)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        raise RigError(f"ci/build-deb {out}: exit {r.returncode}\n{r.stderr[-4000:]}")
    return [_one(out, f"{name}_*.deb") for name in PACKAGES]


def _one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise RigError(f"expected one {pattern} in {directory}, found {found}")
    return found[0]


def image_status(client: Any, image: str) -> bytes:
    """/var/lib/dpkg/status of an image: what is installed there.

    Copied out of a created (never started) container: the output of a `cat` run with
    remove=True can come back cut short on a loaded host (the container is removed
    while its log is read), and apt then resolves against half a status file (seen in
    CI: "Encountered status field in a non-version description")."""
    container = client.containers.create(image, ["true"], network_mode="none")
    try:
        stream, _ = container.get_archive("/var/lib/dpkg/status")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile("status")
            if member is None:
                raise RigError(f"{image}: /var/lib/dpkg/status is not a file")
            return member.read()
    finally:
        container.remove(force=True)


def dependency_repo(
    client: Any, image: str, out: Path, packages: Sequence[str] = (), source: Path | None = None
) -> Path:
    """A flat apt repository in out of the Debian packages a node of `image` lacks for
    `apt-get install PACKAGES` (names or .deb files) and, with source, for `apt-get
    build-dep SOURCE` (ci/build-deb's build dependencies): resolved and downloaded by
    this host's apt as if its dpkg status were the image's (the host's own state is
    neither read nor changed)."""
    archives = out / "archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    status = out / "status"
    status.write_bytes(image_status(client, image))
    apt = [
        "apt-get",
        "-q",
        "-y",
        f"-o=Dir::State::status={status}",
        f"-o=Dir::Cache::archives={archives}/",
        "-o=Dir::Cache::pkgcache=",
        "-o=Dir::Cache::srcpkgcache=",
        "-o=Debug::NoLocking=true",
        "-o=APT::Install-Recommends=false",
        "--download-only",
    ]
    runs = [["install", *packages]] if packages else []
    runs += [["build-dep", f"{source.resolve()}/"]] if source is not None else []
    for args in runs:
        r = subprocess.run([*apt, *args], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RigError(f"resolve {args[0]} {args[1:]} for {image}: {r.stdout}{r.stderr}")
    scan = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=archives, capture_output=True, check=False
    )
    if scan.returncode != 0:
        raise RigError(f"dpkg-scanpackages in {archives}: {scan.stderr.decode()}")
    (archives / "Packages").write_bytes(scan.stdout)
    return archives


def put_files(node: Node, directory: str, files: Sequence[Path]) -> None:
    """Copy files into one directory of a node (one tar stream)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            tar.add(str(f), arcname=f.name)
    node.exec(["mkdir", "-p", directory]).check(f"mkdir {directory} in {node.hostname}")
    if not node.container.put_archive(directory, buf.getvalue()):
        raise RigError(f"copy {len(files)} files to {node.hostname}:{directory}: refused")


def install(
    node: Node, debs: Sequence[Path], repo: Path | None, extra: Sequence[str] = ()
) -> ExecResult:
    """`apt-get install ./jobns_*.deb ./jobns-slurm_*.deb [extra]` on a node, as a site
    does; from the local repository only (no network) when one is given."""
    put_files(node, NODE_DEBS, list(debs))
    apt = ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=120", *local_sources(node, repo)]
    node.exec([*apt, "update"], timeout=300).check(f"apt-get update on {node.hostname}")
    argv = [
        *apt,
        "--no-install-recommends",
        "install",
        *(f"{NODE_DEBS}/{d.name}" for d in debs),
        *extra,
    ]
    return node.exec(["env", "DEBIAN_FRONTEND=noninteractive", *argv], timeout=600).check(
        f"{shlex.join(argv)} on {node.hostname}"
    )


def local_sources(node: Node, repo: Path | None) -> list[str]:
    """Copy repo to the node; the apt options that make it apt's only source there
    (none without a repo: the image's own sources)."""
    if repo is None:
        return []
    put_files(node, NODE_REPO, sorted(p for p in repo.iterdir() if p.is_file()))
    node.put_file(f"{NODE_REPO}/local.list", f"deb [trusted=yes] file:{NODE_REPO} ./\n")
    return [
        "-o",
        f"Dir::Etc::sourcelist={NODE_REPO}/local.list",
        "-o",
        "Dir::Etc::sourceparts=/nonexistent",
    ]


def build_in(node: Node, out: Path, repo: Path | None = None) -> list[Path]:
    """ci/build-deb run inside a node (its suite's python3 and libslurm-dev), from a copy
    of this checkout; the two .debs copied back into out. repo: a dependency_repo with
    the build dependencies (source=REPO) as apt's only source; None: the image's own."""
    src, dest = "/var/tmp/jobns-src", "/var/tmp/jobns-built"
    buf = io.BytesIO()
    skip = {".git", ".pybuild", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(
            str(REPO),
            arcname=".",
            filter=lambda t: (
                None if set(Path(t.name).parts) & skip or t.name.endswith(".pyc") else t
            ),
        )
    node.exec(["mkdir", "-p", src]).check(f"mkdir {src} in {node.hostname}")
    if not node.container.put_archive(src, buf.getvalue()):
        raise RigError(f"copy the checkout to {node.hostname}:{src}: refused")
    opts = " ".join(local_sources(node, repo))
    node.exec(["env", f"JOBNS_APT_OPTS={opts}", f"{src}/ci/build-deb", dest], timeout=900).check(
        f"ci/build-deb in {node.hostname}"
    )
    found = []
    for name in PACKAGES:
        path = node.exec(["sh", "-c", f"ls {dest}/{name}_*.deb"]).check(name).stdout.strip()
        stream, _ = node.container.get_archive(path)
        target = out / Path(path).name
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(target.name)  # one regular file: nothing to trust
            if member is None:
                raise RigError(f"copy {path} from {node.hostname}: not a file")
            target.write_bytes(member.read())
        found.append(target)
    return found


SMOKE = r"""
set -eu
fail() { echo "smoke: $*" >&2; exit 1; }
v=$(jobns --version) || fail "jobns --version failed"
case $v in "jobns "*) ;; *) fail "jobns --version printed '$v'" ;; esac
[ "$(command -v jobns)" = /usr/bin/jobns ] || fail "jobns is not /usr/bin/jobns"
for f in /usr/share/man/man1/jobns.1.gz /usr/share/containers/oci/hooks.d/jobns.json \
         /etc/jobns/jobns.toml /etc/jobns/slurm/prolog; do
    [ -e "$f" ] || fail "$f is missing"
done
! ls /etc/systemd/system/*.wants/jobns* 2>/dev/null || fail "a jobns unit was enabled"
id SMOKE_USER >/dev/null 2>&1 || useradd -m -s /bin/sh SMOKE_USER
printf 'Prolog=/bin/true\n' > /var/tmp/smoke-slurm.conf
set +e
jobns doctor --slurm-conf /var/tmp/smoke-slurm.conf > /var/tmp/doctor.out 2>&1
rc=$?
set -e
cat /var/tmp/doctor.out
[ $rc = 0 ] || [ $rc = 125 ] || fail "jobns doctor exited $rc"
grep -q '^jobns doctor: ' /var/tmp/doctor.out || fail "jobns doctor printed no verdict"
grep -q 'make it exec /usr/bin/jobns setup' /var/tmp/doctor.out \
    || fail "jobns doctor's hint does not name /usr/bin/jobns"
! grep -qi 'traceback\|internal error' /var/tmp/doctor.out || fail "jobns doctor crashed"
jobns setup --job-id 4242 --user SMOKE_USER
task='echo smoke > /tmp/f; cat /tmp/f; echo $TMPDIR; ls /dev/shm | wc -l'
out=$(su SMOKE_USER -s /bin/sh -c "jobns run --job-id 4242 -- sh -c '$task'")
[ "$out" = "$(printf 'smoke\n/tmp\n0')" ] || fail "jobns run printed '$out'"
[ -d /tmp/job-4242 ] || fail "no /tmp/job-4242 while the job is set up"
jobns teardown --job-id 4242
[ ! -e /tmp/job-4242 ] && [ ! -e /dev/shm/job-4242 ] || fail "teardown left the job's trees"
echo smoke: ok
""".replace("SMOKE_USER", SMOKE_USER)


def smoke(node: Node) -> str:
    """The installed packages work on a node: jobns --version, jobns doctor (and its
    hints name /usr/bin/jobns), a job set up, run as an ordinary user and torn down.
    Returns the output; RigError with it on a failure."""
    r = node.exec(["sh", "-c", SMOKE], timeout=120)
    if r.exit_code != 0:
        raise RigError(f"package smoke test on {node.hostname}:\n{r.stdout}{r.stderr}")
    return r.stdout
