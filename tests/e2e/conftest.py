"""Fixtures for the docker rig tests (tests/e2e/test_rig_*.py).

The rig needs root and a running dockerd (ci/start-docker). Off CI a missing one
skips with the reason; with CI=true it fails: a CI run must never pass as "all
skipped". An image build failure always fails: that is a real defect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

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
    from containers import images

    try:
        return images.build(docker_client).node
    except RigError as e:
        pytest.fail(f"build the rig images: {e}", pytrace=False)


@pytest.fixture(scope="module")
def rig(docker_client: Any, rig_image: str) -> Iterator[Rig]:
    """Two nodes (node1, node2) sharing /lustre; removed when the module is done."""
    with Rig(rig_image, 2, client=docker_client) as r:
        yield r
    left = {k: v for k, v in labelled(docker_client, r.run_id).items() if v}
    assert not left, f"rig {r.run_id} left {left}"
