"""Fuzz the site config (no root): TOML text -> validated dict -> Config -> everything that
reads it. A site's config is trusted, but a typo in it must be one clean line naming the
key, never a traceback in a prolog (which drains the node) or in every task."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobns.launcher.model import capacity
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.config import Config
from jobns.launcher.model.directives import Directives, Symbols, parse_directives
from jobns.launcher.model.environment import job_environment
from jobns.launcher.model.job import LAYOUTS, Job, User
from jobns.launcher.model.plan import Plan, build
from jobns.launcher.staging import model as staging
from jobns.launcher.system import jsonfast
from jobns.launcher.system.errors import JobnsError
from tests.fuzz.conftest import FuzzBox
from tests.fuzz.support import (
    capacity_text,
    config_text,
    fuzz,
    optional,
    outcome,
    toml_doc,
    tried,
)
from tests.schemas import SCHEMAS

SCHEMA = SCHEMAS["config.schema.json"]
JOB_USER = User("alice", 1000, 1000, (1000,), "/home/alice")


@pytest.fixture(scope="module")
def cache(box: FuzzBox) -> Iterator[str]:
    """Root's parsed-config cache, moved into the box: the node's own stays untouched."""
    path = str(box.root / "config.cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(config_mod, "CACHE_PATH", path)
        yield path


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)


def check_usable(config: Config) -> None:
    """What jobns hands to the kernel, execve or a job record must be representable
    there: every path and argument encodable without a NUL, every number finite."""
    paths = [
        config.local_base,
        config.shm_base,
        config.shared_base,
        config.state_dir,
        *config.staging.session_roots,
        *config.staging.stage_roots,
    ]
    if config.arc is not None:
        paths += [config.arc.scratchdir, config.arc.movetool, config.arc.shared_scratch]
    paths += [config.lifecycle.pre_run, config.lifecycle.post_run, *config.staging.stdio]
    for p in paths:
        data = os.fsencode(p)  # UnicodeEncodeError: unusable as a path or an argument
        assert b"\0" not in data, f"NUL in config value {p!r}"
    for number in (config.kill_wait, config.staging.timeout, config.lifecycle.program_timeout):
        assert math.isfinite(number), f"non-finite number {number!r} in the config"
    jsonfast.dumps([config.kill_wait, config.staging.timeout])  # as a job record holds them


def consume(config: Config, layout: str, shm: int | None) -> None:
    """Everything that reads a loaded config on the way to a job (all pure)."""
    for key in ("granularity", "shm_max", "tmp_max", "shm_default", "tmp_default"):
        got = outcome(capacity.config_size, config, key)
        assert got is None or isinstance(got, JobnsError) or (type(got) is int and got >= 1)
    directives = Directives(present=True, shm_capacity=shm)
    for d in (None, directives):
        outcome(capacity.plan, config, d, layout)
    outcome(parse_directives, "shm capacity=1GiB; shared_tmpdir", config.directive_word, 1)
    job = Job("42", JOB_USER, "node1", layout)
    plan = outcome(build, config, job)
    env = job_environment(config, job)
    for k, v in env.items():
        assert "\0" not in k + v and "=" not in k
    if isinstance(plan, Plan):
        plan.describe()
        symbols = Symbols(job_id="42", user="alice", workdir="/home/alice/job", job_name="j")
        built = outcome(staging.build, config, job, plan, None, None, symbols)
        if isinstance(built, tuple) and built[0] is not None:
            built[0].describe()
            jsonfast.dumps(built[0].record())


@fuzz()
@given(data=st.data(), layout=st.sampled_from(LAYOUTS), shm=optional(st.integers(1, 2**63 - 1)))
def test_config_parse_and_use(
    box: FuzzBox, data: st.DataObject, layout: str, shm: int | None
) -> None:
    text = data.draw(config_text(box.paths()))
    tried("config.parse")
    doc = outcome(config_mod.parse, text, "fuzz.toml")
    if isinstance(doc, JobnsError):
        return
    assert isinstance(doc, dict)
    config = Config(doc, "fuzz.toml")
    check_usable(config)
    consume(config, layout, shm)


@fuzz()
@given(data=st.data())
def test_config_load_from_file(box: FuzzBox, cache: str, data: st.DataObject) -> None:
    """load(): bytes on disk (any encoding), the cache root keeps, a second load."""
    raw = data.draw(
        st.one_of(
            config_text(box.paths()).map(lambda t: t.encode("utf-8", "surrogatepass")),
            st.binary(max_size=60),
        )
    )
    tried("config.load")
    path = box.write("load.toml", raw)
    first = outcome(config_mod.load, path, {})
    second = outcome(config_mod.load, path, {})  # from the cache when root
    if isinstance(first, Config):
        assert isinstance(second, Config) and second.raw == first.raw
        check_usable(first)
    else:
        assert isinstance(second, JobnsError) and str(second) == str(first)


@fuzz()
@given(
    key=st.sampled_from(["granularity", "shm_max", "tmp_max", "shm_default", "tmp_default"]),
    value=st.one_of(capacity_text(), st.integers(-(2**70), 2**70)),
    layout=st.sampled_from(LAYOUTS),
    shm=optional(st.integers(1, 2**63 - 1)),
)
def test_capacity_section(key: str, value: object, layout: str, shm: int | None) -> None:
    """[capacity]: every size spelling a site can write, through the whole capacity plan."""
    tried("config.capacity")
    text = toml_doc({"capacity": {key: value}})
    doc = outcome(config_mod.parse, text, "fuzz.toml")
    if isinstance(doc, dict):
        consume(Config(doc, "fuzz.toml"), layout, shm)
