"""``wait_replicas``: pushes and fetches wait for replicas (``WAIT``) in the same round
trip, on real servers: a primary without replicas (every wait falls short) and a primary
with one replica (it has every confirmed write the moment the push returns)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.config import ConfigError, load_config
from limitd.connection import connect, loop_twin, replication
from limitd.connection.backoff import Backoff
from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.unique import middleware as unique
from tests.helpers import wait_for

ran: list[int] = []


@limitd.job(name="replication_test.Note")
def note(n: int) -> None:
    ran.append(n)


@limitd.job(name="replication_test.Once", unique_for=600)
def once(n: int) -> None:
    ran.append(n)


@pytest.fixture
def lonely(redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    """A client that waits for one replica, on a primary that has none."""
    conn = connect(f"{redis_server.url}?wait_replicas=1&wait_timeout=0.05")
    conn.flushall()
    limitd.set_default_client(limitd.Client(conn))
    yield conn
    limitd.set_default_client(None)


@pytest.fixture
def replica(redis_server: RedisServer, tmp_path: Path) -> Iterator[redis_py.Redis]:
    """A replica of ``redis_server``, linked."""
    redis_server.client().config_set("repl-diskless-sync-delay", 0)  # sync at once
    server = RedisServer(
        data_dir=str(tmp_path), extra_args=["--replicaof", "127.0.0.1", str(redis_server.port)]
    )
    server.start()
    client = server.client()
    wait_for(lambda: client.info("replication")["master_link_status"] == "up", timeout=15)
    yield client
    server.stop()


def test_the_url_carries_the_setting_and_bad_values_say_why() -> None:
    bare, wait = replication.split_url("redis://h:1/0?wait_replicas=2&wait_timeout=0.25&x=1")
    assert bare == "redis://h:1/0?x=1" and wait == replication.ReplicaWait(2, 0.25)
    assert replication.split_url("redis://h:1/0") == ("redis://h:1/0", None)
    sentinel_url = "redis+sentinel://a:1,b:2/svc/0?wait_replicas=1"
    assert replication.split_url(sentinel_url) == (
        "redis+sentinel://a:1,b:2/svc/0",
        replication.ReplicaWait(1),
    )
    for bad, words in [
        ("redis://h/0?wait_timeout=1", "without wait_replicas"),
        ("redis://h/0?wait_replicas=one", "whole number"),
        ("redis://h/0?wait_replicas=0", "at least 1"),
        ("redis://h/0?wait_replicas=1&wait_timeout=0", "above 0"),
    ]:
        with pytest.raises(ValueError, match=words):
            replication.split_url(bad)


def test_the_config_sets_it_and_says_what_is_wrong(tmp_path: Path) -> None:
    conf = tmp_path / "app.yml"
    conf.write_text("redis: {url: 'redis://h:1/0', wait_replicas: 1, wait_timeout: 0.2}\n")
    assert load_config([str(conf)]).redis.replica_wait == replication.ReplicaWait(1, 0.2)
    conf.write_text("redis: {url: 'redis://h:1/0', wait_timeout: 0.2}\n")
    with pytest.raises(ConfigError, match=r"redis\.wait_timeout.*wait_replicas"):
        load_config([str(conf)])
    conf.write_text("redis: {url: 'redis://h:1/0', wait_replicas: 0}\n")
    with pytest.raises(ConfigError, match=r"redis\.wait_replicas"):
        load_config([str(conf)])
    conf.write_text("redis: {url: 'redis://h:1/0?wait_replicas=x'}\n")
    with pytest.raises(ConfigError, match=r"redis\.url.*whole number"):
        load_config([str(conf)])


def test_a_push_no_replica_confirms_raises_but_stays_pushed(lonely: redis_py.Redis) -> None:
    with pytest.raises(replication.NotReplicated, match=r"Note: 0 of 1 replicas"):
        note.perform_async(1)
    assert lonely.llen(keys.of(lonely).queue("default")) == 1
    with pytest.raises(replication.NotReplicated):
        note.perform_bulk([[2], [3]])
    assert lonely.llen(keys.of(lonely).queue("default")) == 3


def test_a_unique_push_keeps_its_lock_when_replicas_fall_short(lonely: redis_py.Redis) -> None:
    with pytest.raises(replication.NotReplicated):
        once.perform_async(7)
    digest = unique.args_digest([7])
    assert (
        lonely.get(keys.of(lonely).unique_lock("replication_test.Once", "default", digest))
        is not None
    )
    assert once.perform_async(7) is None, "the pushed job still holds its lock"


def test_the_async_client_waits_too(lonely: redis_py.Redis) -> None:
    async def push() -> None:
        try:
            await note.aio.perform_async(4)
        finally:
            await loop_twin(lonely).aclose()

    with pytest.raises(replication.NotReplicated):
        asyncio.run(push())
    assert lonely.llen(keys.of(lonely).queue("default")) == 1


def test_a_fetch_replicas_do_not_confirm_still_runs_and_is_logged(
    lonely: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lonely.lpush(
        keys.of(lonely).queue("default"),
        *[
            f'{{"class":"replication_test.Note","args":[{n}],"jid":"j{n}","queue":"default"}}'
            for n in range(3)
        ],
    )
    ran.clear()
    with caplog.at_level(logging.WARNING, logger="limitd.fetch"):
        outcomes = Capsule(CapsuleConfig(), redis=lonely).drain()
    assert outcomes == {"done": 3} and sorted(ran) == [0, 1, 2]
    shortfalls = [r for r in caplog.records if "replicas confirmed" in r.getMessage()]
    assert len(shortfalls) == 1, "logged once a minute, not once per fetch"


def test_with_a_replica_a_confirmed_push_is_already_there(
    redis_server: RedisServer, replica: redis_py.Redis
) -> None:
    conn = connect(f"{redis_server.url}?wait_replicas=1&wait_timeout=5")
    client = limitd.Client(conn)
    queue = keys.of(replica).queue("default")
    before = replica.llen(queue)  # what earlier tests on this server left there
    for n in range(50):
        client.push({"class": "replication_test.Note", "args": [n]})
        assert replica.llen(queue) == before + n + 1


def test_backoff_doubles_to_its_cap_and_says_when_it_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = Backoff(logging.getLogger("limitd.test"), "fetch", first=0.25, cap=1.0)
    error = redis_py.ConnectionError("refused")
    with caplog.at_level(logging.WARNING, logger="limitd.test"):
        pauses = [backoff.failed(error) for _ in range(5)]
        backoff.succeeded()
        backoff.succeeded()
    assert pauses == [0.25, 0.5, 1.0, 1.0, 1.0]
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == "fetch failed (1 in a row), retrying in 0.25s: refused"
    assert messages[-1] == "fetch works again after 5 failures"
    assert len(messages) == 6
