"""Connecting to dockerd, with an error that says how to start it.

`docker` costs 200-270 ms to import, so it is imported here, once, on first use.
"""

from __future__ import annotations

from typing import Any

from containers.errors import RigError

START_HINT = (
    "start it with ci/start-docker, or by hand: "
    "`dockerd >/var/log/dockerd.log 2>&1 &` then wait for `docker info`"
)


def connect(timeout: int = 120) -> Any:
    """A docker.DockerClient that has answered a ping (the SDK is untyped: Any)."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as e:
        raise RigError(f"connect to dockerd: {e}; {START_HINT}") from None
    return client


def not_found() -> type[Exception]:
    """docker.errors.NotFound, for callers that must not import docker eagerly."""
    import docker.errors

    nf: type[Exception] = docker.errors.NotFound
    return nf


def api_error() -> type[Exception]:
    import docker.errors

    err: type[Exception] = docker.errors.APIError
    return err
