"""The transactional outbox on a real PostgreSQL and a real Redis: an enqueue inside a
transaction becomes a row of that transaction (committed, rolled back and savepointed
with it), and the relay pushes every committed row exactly once, whatever dies when."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis as redis_py
from sqlalchemy import Engine, create_engine, event, insert, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.outbox.held import OutboxUnsupported
from limitd.outbox.relay import Relay, RelayService
from limitd.outbox.table import backlog, create_table, ddl, outbox_table, pushed_marker
from limitd.transactions import hold
from limitd.transactions import sqlalchemy as tx
from tests.helpers import wait_for

QUEUE = "outbox"


@limitd.job(name="test_outbox.welcome", queue=QUEUE)
def welcome(user_id: int) -> None: ...


@limitd.job(name="test_outbox.unique", queue=QUEUE, unique_for=600)
def unique_job(key: str) -> None: ...


@dataclass
class Outbox:
    engine: Engine
    table: str
    sessions: sessionmaker[Session]

    def rows(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            found = conn.execute(text(f"SELECT id, jid, payload FROM {self.table} ORDER BY id"))
            return [dict(row._mapping) for row in found]

    def relay(self, client: limitd.Client | None = None, chunk: int = 100) -> Relay:
        return Relay(self.engine, client or limitd.default_client(), self.table, chunk)


@pytest.fixture
def outbox(postgres_table: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Outbox]:
    """An outbox table, and a sessionmaker whose sessions write enqueues into it."""
    url, name = postgres_table
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    create_table(engine, name)
    monkeypatch.setattr(tx, "_outboxes", [])  # forget other tests' outbox sessionmakers
    sessions = sessionmaker(engine)
    tx.transaction_aware(sessions, outbox=name)
    yield Outbox(engine, name, sessions)
    hold.remove_provider(tx.current_held)
    engine.dispose()


def queued(redis: redis_py.Redis, queue: str = QUEUE) -> list[str]:
    """The jids of a queue, oldest first."""
    return [
        limitd.payload.parse(raw)["jid"]
        for raw in reversed(redis.lrange(keys.of(redis).queue(queue), 0, -1))
    ]


def scheduled(redis: redis_py.Redis) -> list[str]:
    return [
        limitd.payload.parse(raw)["jid"] for raw in redis.zrange(keys.of(redis).SCHEDULE, 0, -1)
    ]


def commit_jobs(outbox: Outbox, count: int, start: int = 0) -> list[str]:
    with outbox.sessions() as session, session.begin():
        return [str(welcome.perform_async(start + n)) for n in range(count)]


def test_an_enqueue_in_an_outbox_transaction_is_a_row_of_it_and_not_in_redis(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    with outbox.sessions() as session, session.begin():
        jid = welcome.perform_async(7)
        [bulk1, bulk2] = welcome.perform_bulk([[8], [9]])
        later = welcome.perform_in(60, 10)
        assert [row["jid"] for row in outbox.rows()] == []  # not committed yet
    rows = outbox.rows()
    assert [row["jid"] for row in rows] == [jid, bulk1, bulk2, later]
    first = json.loads(rows[0]["payload"])
    assert (first["class"], first["args"], first["queue"]) == ("test_outbox.welcome", [7], QUEUE)
    assert "at" in json.loads(rows[3]["payload"])
    assert redis.keys("*") == []


def test_a_rolled_back_or_abandoned_transaction_leaves_no_row(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    with pytest.raises(RuntimeError), outbox.sessions() as session, session.begin():
        welcome.perform_async(1)
        raise RuntimeError("the request failed")
    with outbox.sessions() as session:
        session.begin()
        welcome.perform_async(2)
        session.rollback()
    with outbox.sessions() as session:  # autobegun, closed without a commit
        session.execute(text("SELECT 1"))
        welcome.perform_async(3)
    assert outbox.rows() == []
    assert outbox.relay().drain() == 0
    assert queued(redis) == []


def test_a_rolled_back_savepoint_takes_its_rows_with_it(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    with outbox.sessions() as session, session.begin():
        kept = welcome.perform_async(1)
        with session.begin_nested():
            released = welcome.perform_async(2)
        savepoint = session.begin_nested()
        welcome.perform_async(3)
        savepoint.rollback()
        with session.begin_nested():
            inner = session.begin_nested()
            welcome.perform_async(4)
            inner.rollback()
            deep = welcome.perform_async(5)
    assert [row["jid"] for row in outbox.rows()] == [kept, released, deep]
    outbox.relay().drain()
    assert queued(redis) == [kept, released, deep]


def test_without_a_transaction_the_push_is_immediate(redis: redis_py.Redis, outbox: Outbox) -> None:
    with outbox.sessions():
        jid = welcome.perform_async(1)
    assert queued(redis) == [jid] and outbox.rows() == []


def test_sessions_not_set_up_for_the_outbox_hold_pushes_in_memory(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    tx.transaction_aware(Session)
    with Session(outbox.engine) as session, session.begin():
        jid = welcome.perform_async(1)
        assert queued(redis) == []
    assert queued(redis) == [jid] and outbox.rows() == []


def test_the_relay_pushes_each_committed_job_once_in_order_and_deletes_its_row(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    jids = commit_jobs(outbox, 120) + commit_jobs(outbox, 130, start=120)
    with outbox.sessions() as session, session.begin():
        later = welcome.perform_in(3600, 0)
    assert outbox.relay(chunk=50).drain() == 251
    assert queued(redis) == jids  # in commit order
    assert scheduled(redis) == [later]
    assert outbox.rows() == []
    assert redis.sismember(keys.of(redis).QUEUES, QUEUE)
    assert outbox.relay().drain() == 0 and len(queued(redis)) == 250


def test_the_relay_runs_the_client_middleware(redis: redis_py.Redis, outbox: Outbox) -> None:
    """A unique job enqueued twice in one transaction: two rows, one job in Redis."""
    with outbox.sessions() as session, session.begin():
        first = unique_job.perform_async("a")
        unique_job.perform_async("a")
    assert len(outbox.rows()) == 2
    outbox.relay().drain()
    assert queued(redis) == [first] and outbox.rows() == []
    assert int(redis.get(keys.of(redis).UNIQUE_SKIPPED) or 0) == 1


def test_a_relay_that_dies_between_its_push_and_its_delete_does_not_push_twice(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    jids = commit_jobs(outbox, 30)

    def crash(conn: Any) -> None:
        raise ConnectionError("the relay died before its DELETE committed")

    event.listen(outbox.engine, "commit", crash)
    with pytest.raises(ConnectionError):
        outbox.relay().relay_chunk()
    event.remove(outbox.engine, "commit", crash)
    assert queued(redis) == jids  # pushed, and
    assert [row["jid"] for row in outbox.rows()] == jids  # still in the table
    assert outbox.relay().drain() == 30
    assert queued(redis) == jids and outbox.rows() == []
    assert (
        86_000 < redis.ttl(pushed_marker(keys.of(redis), jids[0], 1)) <= 86_400
    )  # the first row's marker


def test_two_relays_at_once_push_each_row_once(redis: redis_py.Redis, outbox: Outbox) -> None:
    jids = commit_jobs(outbox, 400)
    start = threading.Barrier(2)
    taken: list[int] = []

    def relay() -> None:
        start.wait()
        taken.append(outbox.relay(chunk=7).drain())

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == 400
    assert Counter(queued(redis)) == Counter(jids)  # each exactly once
    assert outbox.rows() == []


def test_redis_down_at_the_commit_loses_nothing_and_pushes_nothing_twice(
    own_redis_server: RedisServer, outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    conn = own_redis_server.client()
    client = limitd.Client(conn)
    limitd.set_default_client(client)
    service = RelayService(outbox.relay(client, chunk=10), poll_interval=0.02)
    try:
        before = commit_jobs(outbox, 15)
        own_redis_server.stop()
        service.start()
        during = commit_jobs(outbox, 25, start=100)  # the commits succeed
        with outbox.sessions() as session:
            session.begin()
            welcome.perform_async(999)
            session.rollback()
        wait_for(
            lambda: any("outbox relay" in r.getMessage() for r in caplog.records),
            message="the relay to fail on the stopped Redis",
        )
        assert service._thread is not None and service._thread.is_alive()
        assert len(outbox.rows()) == 40
        own_redis_server.start()
        wait_for(lambda: outbox.rows() == [], 30, "the relay to drain the outbox")
        pushed = Counter(queued(conn))
    finally:
        service.stop()
        limitd.set_default_client(None)
        conn.close()
    assert pushed == Counter(before + during)  # every committed job once, none rolled back


def test_a_row_that_is_not_a_job_goes_to_the_dead_set_and_the_others_go_on(
    redis: redis_py.Redis, outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    with outbox.engine.begin() as conn:
        conn.execute(insert(outbox_table(outbox.table)), [{"jid": "bad", "payload": "{not json"}])
    [good] = commit_jobs(outbox, 1)
    with caplog.at_level(logging.ERROR, "limitd.outbox"):
        assert outbox.relay().drain() == 2
    assert queued(redis) == [good] and outbox.rows() == []
    [dead] = redis.zrange(keys.of(redis).DEAD, 0, -1)
    assert "{not json" in json.loads(dead)["raw"]
    assert any("jid=bad" in record.getMessage() for record in caplog.records)


def test_batches_are_refused_in_an_outbox_transaction(
    redis: redis_py.Redis, outbox: Outbox
) -> None:
    batch = limitd.Batch("signups")
    refused = pytest.raises(OutboxUnsupported, match="batches are not supported")
    with outbox.sessions() as session, session.begin(), refused, batch.jobs():
        welcome.perform_async(1)
    other = limitd.Batch("opened before the transaction")
    refused = pytest.raises(OutboxUnsupported, match="batches are not supported")
    with other.jobs(), outbox.sessions() as session, session.begin(), refused:
        welcome.perform_async(2)
    assert outbox.rows() == []


def test_the_table_ddl_and_create_table_agree_and_repeat(
    redis: redis_py.Redis, outbox: Outbox, postgres_table: tuple[str, str]
) -> None:
    create_table(outbox.engine, outbox.table)  # again: nothing happens
    with outbox.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {outbox.table}"))
        conn.execute(text(ddl(outbox.table)))
        conn.execute(text(ddl(outbox.table)))
    jids = commit_jobs(outbox, 3)
    assert backlog(outbox.engine, outbox.table).rows == 3
    outbox.relay().drain()
    assert queued(redis) == jids
    assert backlog(outbox.engine, outbox.table).as_dict() == {"rows": 0, "oldest_age": None}


def test_a_bad_table_name_is_refused() -> None:
    with pytest.raises(ValueError, match="table name"):
        tx.transaction_aware(sessionmaker(), outbox="users; DROP TABLE users")
    with pytest.raises(ValueError, match="table name"):
        ddl("a b")


def test_the_relay_service_stops_promptly_while_it_waits(
    outbox: Outbox, redis: redis_py.Redis
) -> None:
    service = RelayService(outbox.relay(), poll_interval=3600)
    service.start()
    service.stop()  # joins for at most STOP_TIMEOUT: the thread sleeps in an Event
    assert service._thread is not None and not service._thread.is_alive()


def test_a_relay_skips_rows_another_relay_holds(redis: redis_py.Redis, outbox: Outbox) -> None:
    jids = commit_jobs(outbox, 10)
    url = outbox.engine.url
    impatient = create_engine(url, connect_args={"options": "-c lock_timeout=2000"})
    try:
        with outbox.engine.begin() as other:  # another relay holds the oldest five
            other.execute(text(f"SELECT id FROM {outbox.table} ORDER BY id LIMIT 5 FOR UPDATE"))
            relay = Relay(impatient, limitd.default_client(), outbox.table)
            assert relay.relay_chunk() == 5  # at once, without waiting for them
        assert queued(redis) == jids[5:]
        assert relay.drain() == 5
        assert sorted(queued(redis)) == sorted(jids)
    finally:
        impatient.dispose()


def test_an_async_session_with_the_outbox_fails_clearly(
    redis: redis_py.Redis, outbox: Outbox, postgres_table: tuple[str, str]
) -> None:
    engine = create_async_engine(
        postgres_table[0].replace("postgresql://", "postgresql+psycopg://")
    )
    sessions = async_sessionmaker(engine)
    tx.transaction_aware(sessions, outbox=outbox.table)

    async def enqueue() -> None:
        async with sessions() as session, session.begin():
            welcome.perform_async(1)

    async def enqueue_in_run_sync() -> Any:
        async with sessions() as session, session.begin():
            return await session.run_sync(lambda _: welcome.perform_async(2))

    with pytest.raises(OutboxUnsupported, match="use a sync Session"):
        asyncio.run(enqueue())
    jid = asyncio.run(enqueue_in_run_sync())
    asyncio.run(engine.dispose())
    assert [row["jid"] for row in outbox.rows()] == [jid] and queued(redis) == []
