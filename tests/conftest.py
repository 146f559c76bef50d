"""Test harness: a private redis-server for the session, flushed before every test.

Tests never touch a Redis on 127.0.0.1:6379. ``redis_server`` can be stopped and
restarted by fault tests that use ``own_redis_server`` (a server of their own, so the
rest of the suite is unaffected).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd.connection import connect
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses
from tests.topologies import ClusterGroup

# The postgres_table fixture; the dashboard and browser fixtures (tests/web.py).
pytest_plugins = ("tests.postgres", "tests.web")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


# Modules whose tests also run against a Redis Cluster (3 primaries with a replica
# each): the ``redis`` fixture is parametrised with "cluster" for them.
CLUSTER_MODULES = frozenset(
    {
        "test_client",
        "test_limit_fetch",
        "test_poison_suspects",
        "test_capsule",
        "test_fair_tenant",
        "test_unique",
        "test_batch",
        "test_outbox",
        "test_capacity",
        "test_periodic",
        "test_limiters",
        "test_api_pages",
        "test_poison",
        "test_aio_client",
        "test_async_jobs",
        "test_limiters_aio",
        "test_api",
        "test_metrics_exporter",
        "test_poller",
        "test_iteration",
    }
)


# Environment variables limitd reads: a developer's shell often exports REDIS_URL, and
# the suite must not depend on it (tests that need one set it themselves).
LIMITD_ENVIRONMENT = ("LIMITD_REDIS_URL", "REDIS_URL", "LIMITD_CONFIG", "LIMITD_FRESH_CAPSULE")
LIMITD_ENVIRONMENT_PREFIXES = ("LIMITD_FAIR_TENANT_", "LIMITD_ENCRYPTION_")


def hermetic_environment() -> list[str]:
    """Remove from this process (and so from every process the suite starts) the
    variables limitd reads; returns their names."""
    names = [
        name
        for name in os.environ
        if name in LIMITD_ENVIRONMENT or name.startswith(LIMITD_ENVIRONMENT_PREFIXES)
    ]
    for name in names:
        del os.environ[name]
    return names


def pytest_configure(config: pytest.Config) -> None:
    hermetic_environment()
    config.addinivalue_line(
        "markers",
        "standalone_only(reason): in a module of CLUSTER_MODULES, not run against the "
        "cluster (it checks what only the standalone layout has)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    if "redis" not in metafunc.fixturenames or module not in CLUSTER_MODULES:
        return
    if metafunc.definition.get_closest_marker("standalone_only") is not None:
        return
    metafunc.parametrize("redis", ["standalone", "cluster"], indirect=True)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGroup]:
    group = ClusterGroup(tmp_path_factory.mktemp("cluster"))
    group.start()
    yield group
    group.stop()


@pytest.fixture
def redis(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    """A flushed Redis, the default client's: the session's server, or (for the
    modules above, parametrised) the session's cluster, through ``connect``, which
    attaches the cluster key layout to its client (``keys.of``)."""
    if getattr(request, "param", "standalone") == "cluster":
        yield request.getfixturevalue("clustered")
        return
    yield from _as_default(redis_server.client())


@pytest.fixture
def clustered(redis_cluster: ClusterGroup) -> Iterator[redis_py.Redis]:
    """The session's cluster, flushed, as the default client's Redis."""
    yield from _as_default(connect(redis_cluster.url))


def _as_default(conn: redis_py.Redis) -> Iterator[redis_py.Redis]:
    conn.flushall()
    limitd.set_default_client(limitd.Client(conn))
    yield conn
    limitd.set_default_client(None)
    conn.close()


@pytest.fixture(autouse=True)
def _quiet_job_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="limitd")


@pytest.fixture
def supervisor(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts ``limitd start`` (with the given arguments) in the module's ``app_dir``, on
    the session's Redis; whatever still runs at the end is killed."""
    processes = LimitdProcesses(app_dir, redis_server.url)
    yield processes.start
    processes.kill_all()
