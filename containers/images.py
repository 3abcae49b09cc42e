"""Node images built with no container registry, one per Slurm release, cached by a
hash of their inputs.

For each release of RELEASES (Debian bookworm: Slurm 22.05, Python 3.11; trixie: 24.11,
3.13; forky: 26.05, 3.14) three images, each tagged `<name>:<first 16 hex of the sha256
of its inputs>`:
  jobns-rig-base  debootstrap'd Debian (minbase + Slurm, munge, python3 and jobns's
                  runtime dependencies as Debian packages, ci/build-deb's build
                  dependencies, sshd and pam_slurm_adopt, ...), imported with
                  `docker import`.        inputs: release, variant, package list,
                  mirror, architecture, RECIPE
  jobns-rig-debs  + jobns_*.deb and jobns-slurm_*.deb in DEB_DIR, built by ci/build-deb
                  (dpkg-buildpackage) against this release's python3 and libslurm-dev.
                  inputs: Dockerfile + the checkout's files but tests/ and containers/
  jobns-rig-node  the base + users alice (1001) and bob (1002), Slurm and munge
                  directories, and the two .debs installed as a site would
                  (install_jobns).          inputs: Dockerfile (names base and debs)
An image whose tag exists is reused, so only a changed input rebuilds (a jobns edit
rebuilds the debs and node images). Layers are built with network_mode=none: nothing in
a build talks to the network; only debootstrap on the host does, to the Debian mirror
the host's apt already uses. Nothing of the test tools (pytest, mypy, the docker SDK,
hypothesis) and nothing of the checkout is in a node.

    python -m containers.images build [--release NAME|all] [--force] [--mirror URL]
    python -m containers.images prune        # drop rig images other than the current set
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from containers import labels, wheels
from containers.dockerapi import connect, not_found
from containers.errors import RigError


@dataclass(frozen=True)
class Release:
    """A Debian suite and the Slurm and Python it ships."""

    suite: str
    slurm: str  # major.minor of its slurm-wlm
    python: str  # its python3
    # bookworm's debootstrap has no script for suites newer than trixie: name one
    script: str = ""
    # apt inside the image (by hand; the builds run none): an archive snapshot whose
    # Release file has expired needs Acquire::Check-Valid-Until=false
    expired_release: bool = False
    # what this release's nodes get beyond PACKAGES (an empty tuple leaves the base's
    # tag as it was before per-release lists existed: other releases do not rebuild)
    packages: tuple[str, ...] = ()


# Container runtimes of forky only (tests/e2e/test_rig_hpc_runtimes.py): charliecloud's
# ch-run (unprivileged), and Podman 5 with crun 1.28 (runc is in PACKAGES)
FORKY = ("charliecloud-runtime", "podman", "crun")
# MPI over Slurm's mpi/pmix (tests/e2e/test_rig_inside_mpi.py): Open MPI (mpicc, its
# libraries) and Debian's Python bindings of the PMIx client, to ask PMIx_Get inside a
# job. Only the releases whose Slurm has mpi/pmix (22.05: mpi_pmix_v4, Open MPI 4.1;
# 24.11: mpi_pmix_v5, Open MPI 5); forky's 26.05 has no mpi/pmix, and Open MPI 5 and
# later speak nothing else (no PMI-2): forky gets MPICH, whose PMI client speaks PMI-2
# to Slurm's mpi/pmi2 (MPICH_PMI2).
MPI = ("openmpi-bin", "libopenmpi-dev", "python3-pmix")
MPICH_PMI2 = ("mpich", "libmpich-dev")
RELEASES = {
    r.suite: r
    for r in (
        Release("bookworm", "22.05", "3.11", packages=MPI),
        Release("trixie", "24.11", "3.13", packages=MPI),
        Release(
            "forky",
            "26.05",
            "3.14",
            script="sid",
            expired_release=True,
            packages=FORKY + MPICH_PMI2,
        ),
    )
}
DEFAULT_RELEASE = "bookworm"  # the host's own suite: the non-Slurm rig tests use it
# The suite host_mirror() looks for in the host's apt sources; every release is fetched
# from that archive.
SUITE = DEFAULT_RELEASE
VARIANT = "minbase"
# What the nodes need from Debian, in every release.
PACKAGES = (
    "python3",  # the interpreter every user can run
    # jobns's runtime dependencies as the release ships them (the jobns package's Depends
    # names pyproject's minimums: dpkg checks them in install_jobns)
    "python3-pyroute2",
    "python3-jsonschema",
    "slurm-wlm",
    "munge",  # a Slurm cluster in the rig (controller + nodes)
    # ci/build-deb's build dependencies (debian/control, and build-essential, which
    # dpkg-checkbuilddeps adds): the packages are built in the image, offline, against
    # this release's python3 and libslurm-dev (build_debs)
    "build-essential",
    "dpkg-dev",
    "debhelper",
    "dh-python",
    "pybuild-plugin-pyproject",
    "python3-all",
    "python3-setuptools",
    "libslurm-dev",
    "libpam0g-dev",
    "procps",
    "iproute2",  # ps/pkill for tests, ip to check `--net none`
    "util-linux",
    "mount",
    "e2fsprogs",  # disk capacities: loop devices, mkfs.ext4
    "runc",
    "busybox-static",  # srun --container: rootless runc and a busybox bundle
    # ssh into a job's node (tests/e2e/test_ssh.py): sshd, the client (forky's sshd no
    # longer depends on it), and Slurm's PAM module that adopts a login into the user's
    # job (the release's own build; the names are the same in each release)
    "openssh-server",
    "openssh-client",
    "libpam-slurm-adopt",
    "xauth",  # srun --x11: Slurm runs xauth on the submit host and in the job
    # jobns's burst_buffer.lua runs `jobns bb` without a shell (fork and exec from
    # luaposix, for the Lua 5.1 slurmctld embeds): the controller's, in every release
    "lua-posix",
    # where SlurmUser is not root, burst_buffer.lua runs `sudo -n jobns bb ...`
    "sudo",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the build *procedure* changes in a way the inputs above do not show.
RECIPE = "5"

BASE, DEBS, NODE = "jobns-rig-base", "jobns-rig-debs", "jobns-rig-node"
USERS = (("alice", 1001), ("bob", 1002))
DEB_DIR = "/opt/jobns/debs"  # the two .debs, in the debs image and kept on every node
BUILD_SRC = "/var/tmp/jobns-src"  # the checkout's copy in the debs image's build
JOBNS = "/usr/bin/jobns"  # the packaged paths
MULTIARCH = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
SPANK_PLUGIN = "/usr/lib/{}/slurm-wlm/jobns_spank.so"  # .format(multiarch()): spank_plugin()
PLUGSTACK_D = "/etc/slurm/plugstack.conf.d/jobns.conf"
REPO = Path(__file__).resolve().parents[1]
# What of the checkout the packages are built from: all but the tests and the rig (an
# edit there rebuilds neither the packages nor the node images).
NOT_PACKAGED = ("tests/", "containers/", ".ci/")

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def release(name: str) -> Release:
    try:
        return RELEASES[name]
    except KeyError:
        raise RigError(
            f"rig release {name!r}: unknown; choose one of {', '.join(RELEASES)}"
        ) from None


@dataclass
class ImageSet:
    release: Release
    base: str
    node: str
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    built: list[str] = field(default_factory=list)  # tags built (not reused)
    debs: str = ""  # the image holding the release's two .debs in DEB_DIR


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def host_mirror(sources: str = "/etc/apt") -> str:
    """The Debian archive the host's apt uses for SUITE (deb822 or one-line lists)."""
    files = (
        sorted(glob.glob(f"{sources}/sources.list.d/*.sources"))
        + sorted(glob.glob(f"{sources}/sources.list.d/*.list"))
        + [f"{sources}/sources.list"]
    )
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if path.endswith(".sources"):
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    key, sep, value = line.partition(":")
                    if sep and not line.startswith(("#", " ")):
                        fields[key.strip().lower()] = value.strip()
                if SUITE in fields.get("suites", "").split() and fields.get("uris"):
                    return fields["uris"].split()[0].rstrip("/")
        else:
            for line in text.splitlines():
                words = [w for w in line.split() if not w.startswith("[")]
                # "deb [opts] URI SUITE COMPONENTS..." (options dropped above)
                if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                    return words[1].rstrip("/")
    return DEFAULT_MIRROR


def architecture() -> str:
    out = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "amd64"


def base_tag(mirror: str, rel: Release | None = None) -> str:
    rel = rel or RELEASES[DEFAULT_RELEASE]
    packages = ",".join(sorted(packages_of(rel)))
    inputs = (RECIPE, rel.suite, rel.script, str(rel.expired_release), VARIANT, packages)
    return f"{BASE}:{digest(*inputs, mirror, architecture())}"


def packages_of(rel: Release) -> tuple[str, ...]:
    """What debootstrap installs in the release's base image."""
    return PACKAGES + rel.packages


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except not_found():
        return False
    return True


def _debootstrap(root: Path, mirror: str, rel: Release, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise RigError(
            "build base image: debootstrap is not installed (apt-get install -y debootstrap)"
        )
    # downloaded .debs survive a recipe change; one directory per suite, so that builds
    # of two releases at once never write the same file
    debs = wheels.cache_dir() / "debootstrap-debs" / rel.suite
    debs.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(packages_of(rel))}",
        f"--cache-dir={debs}",
        rel.suite,
        str(root),
        mirror,
    ]
    if rel.script:
        cmd.append(f"/usr/share/debootstrap/scripts/{rel.script}")
    log(f"images: {' '.join(cmd)}")
    logfile = root.parent / "debootstrap.log"
    with open(logfile, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
        raise RigError(
            f"build the {rel.suite} base image: debootstrap exited {rc} (mirror {mirror}; "
            f"set --mirror or JOBNS_RIG_MIRROR if it is wrong):\n{tail}"
        )


def _trim(root: Path, rel: Release) -> None:
    """Drop what the image does not need and what leaks the build host's identity."""
    for pattern in (
        "var/cache/apt/archives/*.deb",
        "var/cache/apt/*.bin",
        "var/lib/apt/lists/*",
        "var/log/*.log",
    ):
        for p in root.glob(pattern):
            if p.is_file():
                p.unlink()
    # debootstrap copies these from the host; docker mounts its own at run time
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/resolv.conf").write_text("")
    if rel.expired_release:
        (root / "etc/apt/apt.conf.d/99jobns-rig-snapshot").write_text(
            'Acquire::Check-Valid-Until "false";\n'
        )


def build_base(
    client: Any, mirror: str, force: bool, log: Log, rel: Release | None = None
) -> tuple[str, bool]:
    rel = rel or RELEASES[DEFAULT_RELEASE]
    tag = base_tag(mirror, rel)
    if not force and image_exists(client, tag):
        return tag, False
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=wheels.cache_dir()) as tmp:
        root = Path(tmp) / "root"
        _debootstrap(root, mirror, rel, log)
        _trim(root, rel)
        tar = Path(tmp) / "rootfs.tar"
        # numeric owners: the image's passwd, not the host's, names them
        rc = subprocess.run(
            [
                "tar",
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
                "-C",
                str(root),
                "-cf",
                str(tar),
                ".",
            ],
            check=False,
        ).returncode
        if rc != 0:
            raise RigError(f"build base image: tar of {root} exited {rc}")
        repo, _, version = tag.partition(":")
        log(f"images: docker import {tar} as {tag}")
        try:
            client.api.import_image_from_file(
                str(tar),
                repository=repo,
                tag=version,
                changes=[
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    'CMD ["/bin/bash"]',
                    f"LABEL {labels.IMAGE}=base {labels.INPUTS}={version} "
                    f"{labels.RELEASE}={rel.suite}",
                ],
            )
        except Exception as e:
            raise RigError(f"build base image: docker import of {tar}: {e}") from None
    if not image_exists(client, tag):
        raise RigError(f"build base image: docker import reported success but {tag} is missing")
    return tag, True


def _build_layer(
    client: Any,
    kind: str,
    repo: str,
    dockerfile: str,
    files: Mapping[str, Path],
    force: bool,
    log: Log,
    rel: Release,
) -> tuple[str, bool]:
    """Build `dockerfile` with `files` ({path in the context: file}) in its context,
    tagged by a hash of both."""
    h = digest(RECIPE, dockerfile, *sorted(f"{k}={_file_digest(p)}" for k, p in files.items()))
    tag = f"{repo}:{h}"
    if not force and image_exists(client, tag):
        return tag, False
    import docker.errors

    with tempfile.TemporaryDirectory(prefix=f"ctx-{kind}-") as ctx:
        (Path(ctx) / "Dockerfile").write_text(dockerfile)
        for name, p in files.items():
            (Path(ctx) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, Path(ctx) / name)
        log(f"images: docker build {tag} ({rel.suite})")
        try:
            client.images.build(
                path=ctx,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                labels={labels.IMAGE: kind, labels.INPUTS: h, labels.RELEASE: rel.suite},
            )
        except docker.errors.BuildError as e:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in e.build_log)
            raise RigError(
                f"build {kind} image {tag} ({rel.suite}): {e.msg}\n"
                f"{chr(10).join(tail.splitlines()[-20:])}"
            ) from None
        except docker.errors.APIError as e:
            raise RigError(f"build {kind} image {tag} ({rel.suite}): {e}") from None
    return tag, True


def _file_digest(path: Path) -> str:
    if path.suffix == ".whl":
        return wheels.wheel_digest(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def multiarch() -> str:
    arch = architecture()
    return MULTIARCH.get(arch, f"{arch}-linux-gnu")


def spank_plugin() -> str:
    """Where the jobns-slurm package installs the SPANK plugin on the rig's nodes."""
    return SPANK_PLUGIN.format(multiarch())


def debs_dockerfile(base: str) -> str:
    """Build jobns_*.deb and jobns-slurm_*.deb in the release's base image, with
    ci/build-deb (dpkg-buildpackage), offline: every build dependency is in the base."""
    return f"""\
FROM {base}
COPY src/ {BUILD_SRC}/
RUN {BUILD_SRC}/ci/build-deb {DEB_DIR} && rm -rf {BUILD_SRC}
"""


def install_jobns(debs: str) -> str:
    """The Dockerfile steps that install jobns as a site would: the project's two
    packages, built for this release (debs_dockerfile), copied from the debs image and
    installed with dpkg, offline. Every dependency (the release's python3-pyroute2
    and python3-jsonschema at pyproject's minimums; its slurm-wlm-basic-plugins of the
    exact major.minor.micro the plugins were built for) is Debian's, in the base image: dpkg
    refuses the install, naming the package, if one is missing or too old. Nothing of
    the checkout is in the node; the .debs stay in DEB_DIR (a site's local copy)."""
    return f"""\
COPY --from={debs} {DEB_DIR}/ {DEB_DIR}/
RUN dpkg -i {DEB_DIR}/jobns_*.deb {DEB_DIR}/jobns-slurm_*.deb \\
 && dpkg -s jobns jobns-slurm >/dev/null
"""


def node_dockerfile(base: str, debs: str) -> str:
    users = " \\\n && ".join(
        f"useradd --create-home --user-group --uid {uid} --shell /bin/bash {name}"
        for name, uid in USERS
    )
    return f"""\
FROM {base}
# ordinary job users: alice runs jobs via `--user alice` and unprivileged via su
RUN {users}
# Slurm and munge state directories (the rig's Slurm cluster renders slurm.conf later)
RUN mkdir -p /etc/jobns /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge \\
 && chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
{install_jobns(debs)}"""


def package_sources() -> dict[str, Path]:
    """{src/PATH: file} for the checkout's files the packages are built from (git's
    tracked and untracked-but-not-ignored files, as ci/build-deb's copy would have)."""
    r = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if r.returncode != 0:
        raise RigError(f"list the checkout's files (git ls-files in {REPO}): {r.stderr!r}")
    names = sorted({n for n in r.stdout.decode().split("\0") if n})
    return {
        f"src/{n}": REPO / n
        for n in names
        if not n.startswith(NOT_PACKAGED) and (REPO / n).is_file()
    }


def build(
    client: Any | None = None,
    *,
    release_name: str = DEFAULT_RELEASE,
    force: bool = False,
    mirror: str | None = None,
    log: Log = _stderr,
) -> ImageSet:
    """Build (or reuse) the base and node images of one release; their tags and timings."""
    return build_all([release_name], client, force=force, mirror=mirror, log=log)[0]


def build_all(
    names: Sequence[str],
    client: Any | None = None,
    *,
    force: bool = False,
    mirror: str | None = None,
    log: Log = _stderr,
) -> list[ImageSet]:
    """Build (or reuse) the images of several releases: the base images at the same time
    (debootstrap waits on the network and on dpkg), then the node layers."""
    rels = [release(n) for n in names]
    client = client or connect()
    mirror = mirror or os.environ.get("JOBNS_RIG_MIRROR") or host_mirror()
    t = time.monotonic()

    def one_base(rel: Release) -> tuple[str, bool, float]:
        t0 = time.monotonic()
        tag, new = build_base(client, mirror, force, log, rel)
        return tag, new, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=len(rels)) as pool:
        bases = list(pool.map(one_base, rels))
    sets = [
        ImageSet(rel, tag, "", {"base": took}, [tag] if new else [])
        for rel, (tag, new, took) in zip(rels, bases, strict=True)
    ]
    log(f"images: base images of {', '.join(names)} in {time.monotonic() - t:.1f}s")
    sources = package_sources()
    for s in sets:
        t = time.monotonic()
        s.debs, new = _build_layer(
            client, "debs", DEBS, debs_dockerfile(s.base), sources, force, log, s.release
        )
        s.built += [s.debs] if new else []
        s.timings["debs"] = time.monotonic() - t
        t = time.monotonic()
        s.node, new = _build_layer(
            client, "node", NODE, node_dockerfile(s.base, s.debs), {}, force, log, s.release
        )
        s.built += [s.node] if new else []
        s.timings["node"] = time.monotonic() - t
    return sets


def prune(client: Any, keep: Sequence[ImageSet], log: Log = _stderr) -> list[str]:
    """Remove rig images (by label) that are not in `keep`, newest layers first."""
    current = {tag for s in keep for tag in (s.base, s.debs, s.node)}
    removed: list[str] = []
    for kind in ("node", "debs", "base"):
        for img in client.images.list(filters={"label": f"{labels.IMAGE}={kind}"}):
            tags = set(img.tags)
            if tags & current:
                continue
            for tag in tags or {img.id}:
                try:
                    client.images.remove(tag, noprune=False)
                    removed.append(tag)
                    log(f"images: removed {tag}")
                except Exception as e:  # in use by a running rig: keep it, say so
                    log(f"images: keep {tag}: {e}")
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m containers.images", description="Build the rig's node images (no registry)."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build or reuse the base and node images")
    b.add_argument("--force", action="store_true", help="rebuild even if the tags exist")
    p = sub.add_parser("prune", help="remove rig images other than those of every release")
    for parser in (b, p):
        parser.add_argument("--mirror", help="Debian mirror (default: the host's apt sources)")
    b.add_argument(
        "--release",
        default=DEFAULT_RELEASE,
        help=f"one of {', '.join(RELEASES)}, or all (default {DEFAULT_RELEASE})",
    )
    args = ap.parse_args(argv)
    names = list(RELEASES) if args.cmd == "prune" or args.release == "all" else [args.release]
    try:
        t = time.monotonic()
        sets = build_all(names, force=getattr(args, "force", False), mirror=args.mirror)
        total = time.monotonic() - t
        if args.cmd == "prune":
            prune(connect(), sets)
            return 0
        for s in sets:
            phases = "  ".join(f"{k} {v:.1f}s" for k, v in s.timings.items())
            r = s.release
            print(f"{r.suite} (Slurm {r.slurm}, Python {r.python}): base {s.base}")
            print(f"  debs {s.debs}  node {s.node}")
            print(f"  built {', '.join(s.built) or 'nothing (all cached)'}; {phases}")
        print(f"total {total:.1f}s")
    except RigError as e:
        print(f"containers.images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
