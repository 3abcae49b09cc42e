"""Fixtures for the docker rig tests (tests/e2e/test_rig_*.py).

The rig needs root and a running dockerd (ci/start-docker). Off CI a missing one
skips with the reason; with CI=true it fails: a CI run must never pass as "all
skipped". An image build failure always fails: that is a real defect.

`rig_image` is the default release's node (bookworm: Slurm 22.05, Python 3.11).
`release` is parametrised over the Slurm releases of containers.images.RELEASES
(bookworm 22.05, trixie 24.11, forky 26.05), or those JOBNS_RIG_RELEASES names
(comma-separated); `release_image` is its node image.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from containers import images
from containers.errors import RigError
from containers.rig import Rig, labelled

ON_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> NoReturn:
    if ON_CI:
        pytest.fail(f"{reason} (CI=true: the docker rig tests must run, not skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Any:
    if os.geteuid() != 0:
        unavailable("the docker rig needs root (debootstrap, the docker socket)")
    from containers.dockerapi import connect

    try:
        return connect()
    except RigError as e:
        unavailable(str(e))


@pytest.fixture(scope="session")
def rig_image(docker_client: Any) -> str:
    """The node image tag (built on first use, ~1.5 min; then reused in seconds)."""
    try:
        return images.build(docker_client).node
    except RigError as e:
        pytest.fail(f"build the rig images: {e}", pytrace=False)


def rig_releases() -> list[str]:
    """JOBNS_RIG_RELEASES (e.g. "forky" or "bookworm,trixie"), else every release."""
    names = [n.strip() for n in os.environ.get("JOBNS_RIG_RELEASES", "").split(",") if n.strip()]
    for name in names:
        images.release(name)  # an unknown name fails collection, naming the choices
    return names or list(images.RELEASES)


@pytest.fixture(scope="module", params=rig_releases())
def release(request: pytest.FixtureRequest) -> images.Release:
    """One Slurm release per parameter; module-scoped so that a module's clusters of one
    release are up together and removed before the next release's start."""
    return images.release(str(request.param))


@pytest.fixture(scope="module")
def release_image(docker_client: Any, release: images.Release) -> str:
    try:
        return images.build(docker_client, release_name=release.suite).node
    except RigError as e:
        pytest.fail(f"build the {release.suite} rig images: {e}", pytrace=False)


@pytest.fixture(scope="module")
def rig(docker_client: Any, rig_image: str) -> Iterator[Rig]:
    """Two nodes (node1, node2) sharing /lustre; removed when the module is done."""
    with Rig(rig_image, 2, client=docker_client) as r:
        yield r
    left = {k: v for k, v in labelled(docker_client, r.run_id).items() if v}
    assert not left, f"rig {r.run_id} left {left}"
