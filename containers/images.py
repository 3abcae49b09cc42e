"""Node images built with no container registry, one per Slurm release, cached by a
hash of their inputs.

For each release of RELEASES (Debian bookworm: Slurm 22.05, Python 3.11; trixie: 24.11,
3.13; forky: 26.05, 3.14) two images, each tagged `<name>:<first 16 hex of the sha256 of
its inputs>`:
  jobns-rig-base  debootstrap'd Debian (minbase + Slurm, munge, python3 and jobns's
                  runtime dependencies as Debian packages, gcc and libslurm-dev for the
                  SPANK plugin, ...), imported with `docker import`.   inputs: release,
                  variant, package list, mirror, architecture, RECIPE
  jobns-rig-node  + users alice (1001) and bob (1002), Slurm and munge directories, the
                  jobns SPANK plugin compiled here by ci/build-spank against this
                  release's libslurm-dev, and jobns installed as a site would
                  (install_jobns).          inputs: Dockerfile + the files it copies
An image whose tag exists is reused, so only a changed input rebuilds (a jobns edit
rebuilds just the small top layer). Layers are built with network_mode=none: nothing in
a build talks to the network; only debootstrap on the host does, to the Debian mirror
the host's apt already uses. Nothing of the test tools (pytest, mypy, the docker SDK,
hypothesis) is in a node.

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


RELEASES = {
    r.suite: r
    for r in (
        Release("bookworm", "22.05", "3.11"),
        Release("trixie", "24.11", "3.13"),
        Release("forky", "26.05", "3.14", script="sid", expired_release=True),
    )
}
DEFAULT_RELEASE = "bookworm"  # the host's own suite: the non-Slurm rig tests use it
# The suite host_mirror() looks for in the host's apt sources; every release is fetched
# from that archive.
SUITE = DEFAULT_RELEASE
VARIANT = "minbase"
# What the nodes need from Debian, in every release.
PACKAGES = (
    "python3",
    "python3-venv",  # the interpreter every user can run, and venv
    # jobns's runtime dependencies as the release ships them (pyproject's minimums are
    # checked by pip when it installs the wheel: install_jobns)
    "python3-prctl",
    "python3-pyroute2",
    "python3-jsonschema",
    "slurm-wlm",
    "munge",  # a Slurm cluster in the rig (controller + nodes)
    "gcc",
    "libc6-dev",
    "libslurm-dev",  # the SPANK plugin is compiled in the image, against its Slurm
    "procps",
    "iproute2",  # ps/pkill for tests, ip to check `--net none`
    "util-linux",
    "mount",
    "e2fsprogs",  # disk capacities: loop devices, mkfs.ext4
    "runc",
    "busybox-static",  # srun --container: rootless runc and a busybox bundle
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the build *procedure* changes in a way the inputs above do not show.
RECIPE = "4"

BASE, NODE = "jobns-rig-base", "jobns-rig-node"
USERS = (("alice", 1001), ("bob", 1002))
VENV = "/opt/jobns/venv"
WHEEL_DIR = "/opt/jobns/wheels"
SRC_DIR = "/opt/jobns/src"  # ci/build-spank and hook/spank/, as a site's checkout has them
SPANK_PLUGIN = "/opt/jobns/lib/jobns_spank.so"  # where ci/slurm/plugstack.conf names it
REPO = Path(__file__).resolve().parents[1]
PLUGIN_SOURCES = ("ci/build-spank", "hook/spank/jobns_spank.c")

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
    packages = ",".join(sorted(PACKAGES))
    inputs = (RECIPE, rel.suite, rel.script, str(rel.expired_release), VARIANT, packages)
    return f"{BASE}:{digest(*inputs, mirror, architecture())}"


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
        f"--include={','.join(PACKAGES)}",
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


def install_jobns(wheel: str) -> str:
    """The Dockerfile steps that install jobns, as a site would, from the wheel in the
    context's wheels/ (issue 22 replaces this step with the project's .deb packages).

    jobns's runtime dependencies are the release's own Debian packages (in the base):
    a venv made by that release's python3 with --system-site-packages sees them, and pip
    installs only the wheel, offline; it still resolves the wheel's requirements against
    what Debian installed, so a release whose packages are older than pyproject's
    minimums fails here, naming the package. /usr/local/bin is on every user's PATH (su
    resets PATH): ordinary users find jobns too.
    """
    return f"""\
COPY wheels/{wheel} {WHEEL_DIR}/
RUN /usr/bin/python3 -m venv --system-site-packages {VENV} \\
 && {VENV}/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \\
    {WHEEL_DIR}/{wheel} \\
 && ln -sf {VENV}/bin/jobns /usr/local/bin/jobns \\
 && chmod -R a+rX /opt/jobns
"""


def node_dockerfile(base: str, wheel: str) -> str:
    users = " \\\n && ".join(
        f"useradd --create-home --user-group --uid {uid} --shell /bin/bash {name}"
        for name, uid in USERS
    )
    build_spank = f"{SRC_DIR}/{PLUGIN_SOURCES[0]}"
    return f"""\
FROM {base}
# ordinary job users: alice runs jobs via `--user alice` and unprivileged via su
RUN {users}
# Slurm and munge state directories (the rig's Slurm cluster renders slurm.conf later)
RUN mkdir -p /etc/jobns /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge \\
 && chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
# The SPANK plugin, compiled here against this release's libslurm-dev (a plugin built for
# another Slurm is refused by slurmd), where ci/slurm/plugstack.conf names it
COPY src/ {SRC_DIR}/
RUN {build_spank} --output {SPANK_PLUGIN}
{install_jobns(wheel)}"""


def plugin_sources() -> dict[str, Path]:
    return {f"src/{name}": REPO / name for name in PLUGIN_SOURCES}


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
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobns-wheel-") as wdir:
        jobns = wheels.jobns_wheel(Path(wdir))
        took = time.monotonic() - t
        files = {f"wheels/{jobns.name}": jobns, **plugin_sources()}
        for s in sets:
            t = time.monotonic()
            s.timings["wheel"] = took
            s.node, new = _build_layer(
                client,
                "node",
                NODE,
                node_dockerfile(s.base, jobns.name),
                files,
                force,
                log,
                s.release,
            )
            s.built += [s.node] if new else []
            s.timings["node"] = time.monotonic() - t
    return sets


def prune(client: Any, keep: Sequence[ImageSet], log: Log = _stderr) -> list[str]:
    """Remove rig images (by label) that are not in `keep`, newest layers first."""
    current = {tag for s in keep for tag in (s.base, s.node)}
    removed: list[str] = []
    for kind in ("node", "deps", "base"):
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
            print(f"{r.suite} (Slurm {r.slurm}, Python {r.python}): base {s.base}  node {s.node}")
            print(f"  built {', '.join(s.built) or 'nothing (all cached)'}; {phases}")
        print(f"total {total:.1f}s")
    except RigError as e:
        print(f"containers.images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
