"""The Debian packages (issue 22): what ci/build-deb builds, and that a node installs and
runs them. (a) contents and dependencies from `dpkg-deb -c/-f`; (b) a rig container of
the jobns-rig-base image (bookworm) installs them with `apt-get install ./jobns_*.deb
./jobns-slurm_*.deb` from a local repository of Debian's packages only (no network), and
`jobns --version`, `jobns doctor` and a job set up, run and torn down work there
(containers/debs.py: smoke). The ssh half of a packaged node is tests/e2e/test_ssh.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from containers import debs as debs_mod
from containers.rig import Rig
from tests.e2e.sshnode import packages

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(docker_client: Any) -> tuple[str, list[Path], Path]:
    return packages(docker_client)


def contents(deb: Path) -> dict[str, str]:
    """path -> mode string of every file in a .deb."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True)
    return {line.split()[-1].lstrip("."): line.split()[0] for line in out.stdout.splitlines()}


def field(deb: Path, name: str) -> str:
    out = subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True)
    return out.stdout.strip()


def member(deb: Path, path: str) -> str:
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    out = subprocess.run(
        ["tar", "-xO", f".{path}"], input=tar.stdout, capture_output=True, check=True
    )
    return out.stdout.decode()


def test_jobns_holds_the_python_package_and_what_a_site_configures(
    built: tuple[str, list[Path], Path],
) -> None:
    jobns = built[1][0]
    files = contents(jobns)
    for path in (
        "/usr/bin/jobns",
        "/usr/lib/python3/dist-packages/jobns/launcher/commands/cli.py",
        "/usr/lib/python3/dist-packages/jobns/schemas/config.schema.json",
        "/usr/share/man/man1/jobns.1.gz",
        "/usr/share/containers/oci/hooks.d/jobns.json",
        "/etc/jobns/jobns.toml",
        "/etc/jobns/slurm/prolog",
        "/etc/jobns/slurm/epilog",
        "/etc/jobns/slurm/task-prolog",
        "/usr/share/doc/jobns/examples/oci.conf",
        # the untested container-runtime snippets (docs/containers.md)
        "/usr/share/doc/jobns/examples/90-jobns.fstab",
        "/usr/share/doc/jobns/examples/jobns-apptainer.conf",
    ):
        assert path in files, path
    units = {p.rsplit("/", 1)[1] for p in files if "/systemd/system/" in p} - {""}
    assert units == {p.name for p in (REPO / "jobns" / "systemd").iterdir()}
    assert files["/etc/jobns/slurm/prolog"].startswith("-rwxr-xr-x")
    # no test tools, no checkout-only code
    python = [p for p in files if "/dist-packages/" in p]
    assert not [p for p in python if re.search(r"/(tests|containers|ci)/|/test_", p)]
    # the entry point exactly as an installer writes it from [project.scripts]
    # (python3 -m installer / pip): jobns/launcher/commands/entry.py, the byte-code loader's start
    script = member(jobns, "/usr/bin/jobns")
    assert (
        script.startswith("#!/usr/bin/python3\n")
        and "from jobns.launcher.commands.entry import main" in script
    )
    # every file a site runs or edits names the packaged jobns, never the development venv
    for path in ("/usr/share/containers/oci/hooks.d/jobns.json", "/etc/jobns/slurm/prolog"):
        text = member(jobns, path)
        assert "/usr/bin/jobns" in text and "/opt/jobns" not in text, path
    for unit in units:
        text = member(jobns, next(p for p in files if p.endswith(f"/{unit}")))
        assert "/opt/jobns" not in text and ("ExecStart" not in text or "/usr/bin/jobns" in text)
    # the example configuration is all comments: installing it changes no default
    toml = member(jobns, "/etc/jobns/jobns.toml")
    assert all(not ln.strip() or ln.lstrip().startswith("#") for ln in toml.splitlines())


def test_jobns_depends_on_debians_python_modules(built: tuple[str, list[Path], Path]) -> None:
    jobns = built[1][0]
    assert field(jobns, "Architecture") == "all"
    depends = field(jobns, "Depends")
    # what the installed program imports (jsonschema: the config file, when it is
    # parsed), and nothing only the tests import
    assert "python3-pyroute2 (>= 0.7)" in depends, depends
    assert "python3-jsonschema (>= 4.10)" in depends, depends
    assert "python3-prctl" not in depends and "python3-hypothesis" not in depends, depends
    assert re.search(r"python3:any \(>= 3\.11", depends), depends
    assert "/etc/jobns/jobns.toml" in control_file(jobns, "conffiles")


def test_the_packages_carry_the_release_they_were_built_for(
    built: tuple[str, list[Path], Path],
) -> None:
    """Issue 32: 0.1.0~deb12u1 on bookworm (ci/deb-suffix), in the version and the file
    names, so that one apt repository holds every release's packages; the checkout's
    debian/changelog is not touched by the build."""
    suffix = subprocess.run(
        [str(REPO / "ci" / "deb-suffix")], capture_output=True, text=True, check=True
    ).stdout.strip()
    base = subprocess.run(
        ["dpkg-parsechangelog", "-l", str(REPO / "debian" / "changelog"), "-S", "Version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    jobns, slurm = built[1]
    for deb in (jobns, slurm):
        assert field(deb, "Version") == base + suffix, deb
        assert deb.name.startswith(f"{deb.name.split('_')[0]}_{base}{suffix}_"), deb.name
    assert f"jobns (= {base}{suffix})" in field(slurm, "Depends")
    assert "~" not in base  # the suffix is the build's, never committed


def control_file(deb: Path, name: str) -> str:
    out = subprocess.run(["dpkg-deb", "-I", str(deb), name], capture_output=True, text=True)
    return out.stdout


def test_jobns_slurm_holds_the_plugin_and_the_pam_module_for_this_slurm(
    built: tuple[str, list[Path], Path],
) -> None:
    slurm = built[1][1]
    files = contents(slurm)
    arch = subprocess.run(
        ["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True, check=True
    ).stdout.strip()
    plugin = f"/usr/lib/{arch}/slurm-wlm/jobns_spank.so"
    for path in (
        plugin,
        # Slurm's own plugin type, named from it (22.05: job_container/jobns)
        f"/usr/lib/{arch}/slurm-wlm/job_container_jobns.so",
        f"/usr/lib/{arch}/security/pam_jobns.so",
        "/etc/slurm/plugstack.conf.d/jobns.conf",
        "/usr/share/man/man8/pam_jobns.8.gz",
    ):
        assert path in files, path
    conf = member(slurm, "/etc/slurm/plugstack.conf.d/jobns.conf")
    active = [ln for ln in conf.splitlines() if ln.strip() and not ln.startswith("#")]
    assert active == [] and f"#required {plugin} state_dir=/run/jobns" in conf
    header = Path("/usr/include/slurm/slurm_version.h").read_text()
    num = int(re.search(r"define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+)", header).group(1), 16)  # type: ignore[union-attr]
    major, minor, micro = num >> 16 & 0xFF, num >> 8 & 0xFF, num & 0xFF
    depends = field(slurm, "Depends")
    # The job_container plugin loads only in the exact major.minor.micro it was built for.
    assert (
        f"slurm-wlm-basic-plugins (>= {major}.{minor:02d}.{micro}), "
        f"slurm-wlm-basic-plugins (<< {major}.{minor:02d}.{micro + 1})"
    ) in depends, depends
    assert "libpam0g" in depends and "jobns (= " in depends
    assert "/etc/slurm/plugstack.conf.d/jobns.conf" in control_file(slurm, "conffiles")


def test_a_node_installs_them_offline_and_jobns_works(
    docker_client: Any, built: tuple[str, list[Path], Path]
) -> None:
    base, debs, repo = built
    with Rig(base, hostnames=["node1"], client=docker_client) as rig:
        node = rig.node("node1")
        node.exec(["rm", "-f", "/etc/jobns/jobns.toml"]).check("remove the rig's jobns.toml")
        debs_mod.install(node, debs, repo)
        out = debs_mod.smoke(node)
        assert out.rstrip().endswith("smoke: ok"), out
        # the Slurm side is in place too: Debian's plugstack.conf includes our snippet
        inc = node.exec(["cat", "/etc/slurm/plugstack.conf"]).stdout
        assert "plugstack.conf.d/*.conf" in inc, inc


def test_ci_build_deb_runs_inside_a_rig_image(
    docker_client: Any, built: tuple[str, list[Path], Path], tmp_path: Path
) -> None:
    """The packages are built per suite, inside that suite's image: here bookworm's, with
    the build dependencies from a local repository (no network), then installed there."""
    base, host_debs, _repo = built
    build_deps = debs_mod.dependency_repo(
        docker_client, base, tmp_path / "bd", source=debs_mod.REPO
    )
    with Rig(base, hostnames=["node1"], client=docker_client) as rig:
        node = rig.node("node1")
        node.exec(["rm", "-f", "/etc/jobns/jobns.toml"]).check("remove the rig's jobns.toml")
        debs = debs_mod.build_in(node, tmp_path, build_deps)
        assert [d.name for d in debs] == [d.name for d in host_debs]
        assert contents(debs[0]).keys() == contents(host_debs[0]).keys()
        assert contents(debs[1]).keys() == contents(host_debs[1]).keys()
        debs_mod.install(node, debs, build_deps)  # its runtime deps were build deps too
        assert debs_mod.smoke(node).rstrip().endswith("smoke: ok")
