"""Reliable push on a real redis-server that the tests stop and start on the same port:
while it is down, pushes return their jids and wait in memory; once it is back, every
one of them is written, in each thread's order, and runs.

Each test has a Redis of its own (``own_redis_server``): stopping it must not disturb
the other tests' server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import redis.asyncio
from prometheus_client import CollectorRegistry

import limitd
from limitd import keys
from limitd.aio.client import AsyncClient
from limitd.api import batch_status
from limitd.connection.embedded import RedisServer, free_port
from limitd.reliable_push import app
from limitd.reliable_push.hold import BufferFull
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.transactions import hold
from tests.helpers import wait_for

ran: list[tuple[int, int]] = []
ran_lock = threading.Lock()


@limitd.job(name="reliable_test.Record", queue="reliable")
def record(thread: int, seq: int) -> None:
    with ran_lock:
        ran.append((thread, seq))


@limitd.job(name="reliable_test.Once", queue="reliable", unique_for=600)
def once(key: str) -> None:
    pass


@pytest.fixture
def server(own_redis_server: RedisServer) -> Iterator[RedisServer]:
    """The test's Redis, with limitd's default client on it (short timeouts: a push to a
    stopped Redis fails at once)."""
    conn = own_redis_server.client(socket_connect_timeout=1, socket_timeout=2)
    limitd.set_default_client(limitd.Client(conn))
    ran.clear()
    yield own_redis_server
    buffer = app.current()
    app.disable()
    if buffer is not None:
        buffer.discard()  # its thread ends: no retries against a stopped server later
    limitd.set_default_client(None)
    conn.close()


def queued(server: RedisServer) -> list[dict[str, Any]]:
    """The jobs in the test queue, oldest first."""
    conn = server.client()
    try:
        bodies = conn.lrange(keys.of(conn).queue("reliable"), 0, -1)
    finally:
        conn.close()
    return [json.loads(body) for body in reversed(bodies)]


def drain(server: RedisServer) -> None:
    conn = server.client()
    try:
        Capsule(CapsuleConfig(concurrency=1, queues=["reliable"]), redis=conn).drain()
    finally:
        conn.close()


def test_off_by_default_a_push_with_redis_down_raises(server: RedisServer) -> None:
    server.stop()
    with pytest.raises(redis_py.ConnectionError):
        record.perform_async(0, 0)


def test_pushes_from_threads_while_redis_is_down_all_run_once_it_is_back(
    server: RedisServer,
) -> None:
    registry = CollectorRegistry()
    buffer = app.enable(max_buffered=1000, max_pause=0.5, registry=registry)
    assert record.perform_async(9, 0) is not None  # Redis up: written at once
    assert buffer.buffered_jobs == 0
    server.stop()
    threads, per_thread = 4, 50
    jids: dict[int, list[str | None]] = {n: [] for n in range(threads)}
    errors: list[BaseException] = []

    def push(n: int) -> None:
        try:
            for seq in range(per_thread):
                jids[n].append(record.perform_async(n, seq))
        except BaseException as exc:
            errors.append(exc)

    pushers = [threading.Thread(target=push, args=(n,)) for n in range(threads)]
    for thread in pushers:
        thread.start()
    for thread in pushers:
        thread.join(60)
    assert errors == []
    returned = {jid for n in jids for jid in jids[n]}
    assert None not in returned and len(returned) == threads * per_thread
    assert buffer.buffered_jobs == threads * per_thread
    assert registry.get_sample_value("limitd_client_buffered_pushes") == threads * per_thread
    assert registry.get_sample_value("limitd_client_pushes_buffered_total") == threads * per_thread

    server.start()
    wait_for(lambda: buffer.buffered_jobs == 0, timeout=30, message="the buffer to flush")
    assert registry.get_sample_value("limitd_client_buffered_pushes") == 0
    jobs = queued(server)
    assert {job["jid"] for job in jobs} == returned
    for n in range(threads):  # each thread's jobs in the order it pushed them
        assert [job["args"][1] for job in jobs if job["args"][0] == n] == list(range(per_thread))
    drain(server)
    assert sorted(ran) == sorted((n, seq) for n in range(threads) for seq in range(per_thread))


def test_a_full_buffer_raises_and_what_it_kept_is_still_written(server: RedisServer) -> None:
    buffer = app.enable(max_buffered=3, max_pause=0.5, registry=None)
    server.stop()
    kept = [record.perform_async(0, seq) for seq in range(3)]
    with pytest.raises(BufferFull) as raised:
        record.perform_async(0, 3)
    assert isinstance(raised.value, redis_py.ConnectionError)
    assert isinstance(raised.value.__cause__, redis_py.ConnectionError)
    with pytest.raises(BufferFull):
        record.perform_bulk([[0, 4], [0, 5]])
    server.start()
    wait_for(lambda: buffer.buffered_jobs == 0, timeout=30, message="the buffer to flush")
    assert [job["jid"] for job in queued(server)] == kept


def test_a_bad_argument_raises_at_the_caller_while_redis_is_down(server: RedisServer) -> None:
    app.enable(max_pause=0.5, registry=None)
    server.stop()
    record.perform_async(0, 0)  # kept
    with pytest.raises(TypeError):
        record.perform_async(0, object())  # type: ignore[arg-type]
    buffer = app.current()
    assert buffer is not None and buffer.buffered_jobs == 1


def test_a_push_a_middleware_halts_returns_none_with_the_buffer_on(server: RedisServer) -> None:
    app.enable(registry=None)
    assert once.perform_async("a") is not None
    assert once.perform_async("a") is None  # unique: a duplicate, halted
    assert once.perform_bulk([["a"], ["b"]])[0] is None


def test_a_transaction_still_holds_its_pushes_when_reliable_push_is_on(
    server: RedisServer,
) -> None:
    """The transaction's gate comes after reliable push's, yet sees the push first."""
    buffer = app.enable(registry=None)
    held = hold.Held()

    def provider() -> hold.Held:
        return held

    hold.add_provider(provider)
    try:
        jid = record.perform_async(0, 0)
        assert len(held) == 1 and buffer.buffered_jobs == 0 and queued(server) == []
    finally:
        hold.remove_provider(provider)
    held.run()  # the commit
    assert [job["jid"] for job in queued(server)] == [jid]


def test_async_pushes_are_kept_too(server: RedisServer) -> None:
    buffer = app.enable(max_pause=0.5, registry=None)
    server.stop()

    async def push() -> list[str | None]:
        return [await record.aio.perform_async(0, seq) for seq in range(3)]

    jids = asyncio.run(push())
    assert None not in jids and buffer.buffered_jobs == 3
    server.start()
    wait_for(lambda: buffer.buffered_jobs == 0, timeout=30, message="the buffer to flush")
    assert [job["jid"] for job in queued(server)] == jids


def test_an_async_client_the_app_built_pushes_with_reliable_push_on(server: RedisServer) -> None:
    """The gate runs the push through the async client's sync twin, which must not take
    the asyncio client's retry policy (it could not connect with it)."""
    app.enable(max_pause=0.5, registry=None)

    async def push() -> str | None:
        conn = redis_py.asyncio.Redis(port=server.port)
        try:
            client = AsyncClient(redis=conn)
            return await client.push(
                {"class": "reliable_test.Record", "args": [0, 1], "queue": "reliable"}
            )
        finally:
            await conn.aclose()

    jid = asyncio.run(push())
    assert [job["jid"] for job in queued(server)] == [jid]


def test_pushes_in_a_batch_block_go_straight_to_redis(server: RedisServer) -> None:
    """A batch closes in Redis when its block ends: its jobs must be in by then, not
    behind the pushes kept while Redis was away."""
    buffer = app.enable(max_pause=60.0, registry=None)
    server.stop()
    kept = record.perform_async(0, 0)
    assert buffer.jids() == [kept]
    server.start()  # the kept push may be written any moment from now: either way,
    batch = limitd.Batch()
    with batch.jobs():
        in_batch = record.perform_async(1, 0)
    assert in_batch in [job["jid"] for job in queued(server)], "written, not kept"
    conn = server.client()
    try:
        status = batch_status(conn, batch.bid)
        assert status is not None and (status.total, status.pending) == (1, 1)
        assert not status.complete, "closed with its job in, not before"
    finally:
        conn.close()
    server.stop()
    with pytest.raises(redis_py.ConnectionError), limitd.Batch().jobs():
        record.perform_async(2, 0)


def test_flush_before_exit_logs_the_lost_jobs(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    buffer = app.enable(max_pause=0.5, registry=None)
    server.stop()
    jids = [record.perform_async(0, seq) for seq in range(2)]
    with caplog.at_level(logging.ERROR, logger="limitd.reliable_push"):
        assert buffer.flush_before_exit(0.3) == 2
    assert "process exiting with 2 jobs kept in memory" in caplog.text
    assert all(str(jid) in caplog.text for jid in jids)


def test_a_process_exiting_with_redis_away_says_which_jobs_are_lost(tmp_path: Path) -> None:
    script = tmp_path / "web.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import logging
            import redis
            import limitd
            from limitd.reliable_push import app

            @limitd.job(name="reliable_test.Exit")
            def work(n: int) -> None:
                pass

            logging.basicConfig(level=logging.WARNING)
            conn = redis.Redis(port={free_port()}, socket_connect_timeout=1)
            limitd.set_default_client(limitd.Client(conn))
            app.enable(flush_at_exit=0.3, registry=None)
            for n in range(3):
                print(work.perform_async(n), flush=True)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    jids = done.stdout.split()
    assert len(jids) == 3
    assert "process exiting with 3 jobs kept in memory and not pushed" in done.stderr
    assert all(jid in done.stderr for jid in jids)
