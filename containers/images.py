"""Node images built with no container registry, cached by a hash of their inputs.

Three images, each tagged `<name>:<first 16 hex of the sha256 of its inputs>`:
  jobns-rig-base  debootstrap'd Debian bookworm (minbase + python3, venv, Slurm,
                  munge, ...), imported with `docker import`.   inputs: suite,
                  variant, package list, mirror, architecture, RECIPE
  jobns-rig-deps  + /opt/jobns/venv with the runtime deps (offline, from wheels
                  built on the host), users alice (1001) and bob (1002), Slurm
                  and munge directories.                inputs: Dockerfile + wheels
  jobns-rig-node  + the jobns wheel; /usr/local/bin/jobns. inputs: Dockerfile + wheel
An image whose tag exists is reused, so only a changed input rebuilds (a jobns
edit rebuilds just the small top layer). Layers are built with network_mode=none:
nothing in a build talks to the network; only debootstrap on the host does, to the
Debian mirror the host's apt already uses.

    python -m containers.images build [--force] [--mirror URL]
    python -m containers.images prune        # drop rig images other than the current set
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from containers import labels, wheels
from containers.dockerapi import connect, not_found
from containers.errors import RigError

SUITE = "bookworm"
VARIANT = "minbase"
# What the nodes need from Debian. python3 is 3.11.2 like the host's /usr/bin/python3,
# which is what makes host-built wheels (python-prctl is compiled) fit the image.
PACKAGES = (
    "python3",
    "python3-venv",  # the interpreter every user can run, and venv
    "libcap2",  # python-prctl's shared library
    "slurm-wlm",
    "munge",  # a Slurm cluster in the rig (controller + nodes)
    "procps",
    "iproute2",  # ps/pkill for tests, ip to check `--net none`
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the build *procedure* changes in a way the inputs above do not show.
RECIPE = "3"

BASE, DEPS, NODE = "jobns-rig-base", "jobns-rig-deps", "jobns-rig-node"
USERS = (("alice", 1001), ("bob", 1002))
VENV = "/opt/jobns/venv"
WHEEL_DIR = "/opt/jobns/wheels"
SPANK_PLUGIN = "jobns_spank.so"
REPO = Path(__file__).resolve().parents[1]

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class ImageSet:
    base: str
    deps: str
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


def base_tag(mirror: str) -> str:
    packages = ",".join(sorted(PACKAGES))
    return f"{BASE}:{digest(RECIPE, SUITE, VARIANT, packages, mirror, architecture())}"


def image_exists(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except not_found():
        return False
    return True


def _debootstrap(root: Path, mirror: str, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise RigError(
            "build base image: debootstrap is not installed (apt-get install -y debootstrap)"
        )
    debs = wheels.cache_dir() / "debootstrap-debs"  # downloaded .debs survive a recipe change
    debs.mkdir(parents=True, exist_ok=True)
    cmd = [
        "debootstrap",
        f"--variant={VARIANT}",
        f"--include={','.join(PACKAGES)}",
        f"--cache-dir={debs}",
        SUITE,
        str(root),
        mirror,
    ]
    log(f"images: {' '.join(cmd)}")
    logfile = root.parent / "debootstrap.log"
    with open(logfile, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
        raise RigError(
            f"build base image: debootstrap exited {rc} (mirror {mirror}; set "
            f"--mirror or JOBNS_RIG_MIRROR if it is wrong):\n{tail}"
        )


def _trim(root: Path) -> None:
    """Drop what the image does not need and what leaks the build host's identity."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "var/log/*.log"):
        for p in root.glob(pattern):
            if p.is_file():
                p.unlink()
    # debootstrap copies these from the host; docker mounts its own at run time
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/resolv.conf").write_text("")


def build_base(client: Any, mirror: str, force: bool, log: Log) -> tuple[str, bool]:
    tag = base_tag(mirror)
    if not force and image_exists(client, tag):
        return tag, False
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=wheels.cache_dir()) as tmp:
        root = Path(tmp) / "root"
        _debootstrap(root, mirror, log)
        _trim(root)
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
                    f"LABEL {labels.IMAGE}=base {labels.INPUTS}={version}",
                ],
            )
        except Exception as e:
            raise RigError(f"build base image: docker import of {tar}: {e}") from None
    if not image_exists(client, tag):
        raise RigError(f"build base image: docker import reported success but {tag} is missing")
    return tag, True


def _build_layer(
    client: Any, kind: str, repo: str, dockerfile: str, files: list[Path], force: bool, log: Log
) -> tuple[str, bool]:
    """Build `dockerfile` with `files` in its context, tagged by a hash of both."""
    h = digest(RECIPE, dockerfile, *sorted(f"{p.name}={_file_digest(p)}" for p in files))
    tag = f"{repo}:{h}"
    if not force and image_exists(client, tag):
        return tag, False
    import docker.errors

    with tempfile.TemporaryDirectory(prefix=f"ctx-{kind}-") as ctx:
        (Path(ctx) / "Dockerfile").write_text(dockerfile)
        (Path(ctx) / "wheels").mkdir()
        for p in files:
            shutil.copy2(p, Path(ctx) / "wheels" / p.name)
        log(f"images: docker build {tag}")
        try:
            client.images.build(
                path=ctx,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                labels={labels.IMAGE: kind, labels.INPUTS: h},
            )
        except docker.errors.BuildError as e:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in e.build_log)
            raise RigError(
                f"build {kind} image {tag}: {e.msg}\n{chr(10).join(tail.splitlines()[-20:])}"
            ) from None
        except docker.errors.APIError as e:
            raise RigError(f"build {kind} image {tag}: {e}") from None
    return tag, True


def _file_digest(path: Path) -> str:
    if path.suffix == ".whl":
        return wheels.wheel_digest(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spank_plugin(out_dir: Path) -> Path:
    """The jobns SPANK plugin, built on the host by ci/build-spank against Debian's
    libslurm-dev (the image's Slurm is the same Debian 22.05)."""
    out = out_dir / SPANK_PLUGIN
    r = subprocess.run(
        [str(REPO / "ci" / "build-spank"), "--output", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RigError(f"build the jobns SPANK plugin: {r.stderr.strip()}")
    return out


def deps_dockerfile(base: str, requirements: list[str]) -> str:
    users = " \\\n && ".join(
        f"useradd --create-home --user-group --uid {uid} --shell /bin/bash {name}"
        for name, uid in USERS
    )
    return f"""\
FROM {base}
COPY wheels/ {WHEEL_DIR}/
# --no-index: the build has no network; every wheel was built on the host
RUN /usr/bin/python3 -m venv {VENV} \\
 && {VENV}/bin/python -m pip install --no-index --no-cache-dir --disable-pip-version-check \\
    --find-links {WHEEL_DIR} {" ".join(shlex.quote(r) for r in requirements)}
# ordinary job users: alice runs jobs via `--user alice` and unprivileged via su
RUN {users}
# Slurm and munge state directories (the rig's Slurm cluster renders slurm.conf later)
RUN mkdir -p /etc/jobns /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge \\
 && chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
"""


def node_dockerfile(deps: str, wheel: str) -> str:
    return f"""\
FROM {deps}
COPY wheels/{wheel} {WHEEL_DIR}/
# the SPANK plugin, where ci/slurm/plugstack.conf names it (used by SlurmCluster(enforce=True))
COPY wheels/{SPANK_PLUGIN} /opt/jobns/lib/{SPANK_PLUGIN}
# /usr/local/bin is on every user's PATH (su resets PATH): ordinary users find jobns too
RUN {VENV}/bin/python -m pip install --no-index --no-deps --no-cache-dir \\
    --disable-pip-version-check --force-reinstall {WHEEL_DIR}/{wheel} \\
 && ln -sf {VENV}/bin/jobns /usr/local/bin/jobns
"""


def build(
    client: Any | None = None, *, force: bool = False, mirror: str | None = None, log: Log = _stderr
) -> ImageSet:
    """Build (or reuse) base, deps and node images; returns their tags and timings."""
    client = client or connect()
    mirror = mirror or os.environ.get("JOBNS_RIG_MIRROR") or host_mirror()
    times: dict[str, float] = {}
    built: list[str] = []

    t = time.monotonic()
    base, new = build_base(client, mirror, force, log)
    times["base"] = time.monotonic() - t
    built += [base] if new else []

    t = time.monotonic()
    reqs = wheels.runtime_requirements()
    dep_dir = wheels.dependency_wheels(reqs)
    dep_wheels = sorted(dep_dir.glob("*.whl"))
    with tempfile.TemporaryDirectory(prefix="jobns-wheel-") as wdir:
        jobns = wheels.jobns_wheel(Path(wdir))
        plugin = spank_plugin(Path(wdir))
        times["wheels"] = time.monotonic() - t

        t = time.monotonic()
        deps, new = _build_layer(
            client, "deps", DEPS, deps_dockerfile(base, reqs), dep_wheels, force, log
        )
        built += [deps] if new else []
        node, new = _build_layer(
            client, "node", NODE, node_dockerfile(deps, jobns.name), [jobns, plugin], force, log
        )
        built += [node] if new else []
        times["layers"] = time.monotonic() - t
    return ImageSet(base, deps, node, times, built)


def prune(client: Any, keep: ImageSet, log: Log = _stderr) -> list[str]:
    """Remove rig images (by label) that are not in `keep`, newest layers first."""
    current = {keep.base, keep.deps, keep.node}
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
    b = sub.add_parser("build", help="build or reuse base, deps and node images")
    b.add_argument("--force", action="store_true", help="rebuild even if the tags exist")
    b.add_argument("--mirror", help="Debian mirror (default: the host's apt sources)")
    p = sub.add_parser("prune", help="remove rig images other than the current set")
    p.add_argument("--mirror", help="Debian mirror (default: the host's apt sources)")
    args = ap.parse_args(argv)
    try:
        t = time.monotonic()
        images = build(force=getattr(args, "force", False), mirror=args.mirror)
        total = time.monotonic() - t
        if args.cmd == "prune":
            prune(connect(), images)
            return 0
        print(f"base  {images.base}\ndeps  {images.deps}\nnode  {images.node}")
        phases = "  ".join(f"{k} {v:.1f}s" for k, v in images.timings.items())
        print(
            f"built {', '.join(images.built) or 'nothing (all cached)'}; "
            f"{phases}  total {total:.1f}s"
        )
    except RigError as e:
        print(f"containers.images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
