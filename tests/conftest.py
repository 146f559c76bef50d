"""Test harness: a private redis-server for the session, flushed before every test.

Tests never touch a Redis on 127.0.0.1:6379. ``redis_server`` can be stopped and
restarted by fault tests that use ``own_redis_server`` (a server of their own, so the
rest of the suite is unaffected).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis as redis_py

import limitd
from limitd.embedded import RedisServer

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


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    conn = redis_server.client()
    conn.flushall()
    limitd.set_default_client(limitd.Client(conn))
    yield conn
    limitd.set_default_client(None)
    conn.close()


@pytest.fixture(autouse=True)
def _quiet_job_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="limitd")
