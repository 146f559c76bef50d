"""Transaction-aware enqueue with SQLAlchemy 2.x on a real PostgreSQL: a job enqueued in
a transaction reaches Redis only after the COMMIT, never after a rollback, savepoints
behave as the database does, and a worker always finds the row its job names."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import limitd
from limitd.config import CapsuleConfig
from limitd.connection.embedded import RedisServer
from limitd.supervisor.capsule import Capsule
from limitd.transactions import hold
from limitd.transactions.hold import PushAfterCommitFailed
from limitd.transactions.sqlalchemy import current_held, transaction_aware

QUEUE = "tx"


@limitd.job(name="test_tx_sa.welcome", queue=QUEUE)
def welcome(user_id: int) -> None: ...


@pytest.fixture
def table(postgres_table: tuple[str, str]) -> Iterator[tuple[Engine, str]]:
    url, name = postgres_table
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (id int PRIMARY KEY)"))
    transaction_aware()
    yield engine, name
    hold.remove_provider(current_held)
    engine.dispose()


def queued(redis: redis_py.Redis, queue: str = QUEUE) -> list[str]:
    return [limitd.payload.parse(raw)["jid"] for raw in redis.lrange(f"queue:{queue}", 0, -1)]


def insert(session: Session, name: str, row: int) -> None:
    session.execute(text(f"INSERT INTO {name} VALUES (:id)"), {"id": row})


def test_a_job_enqueued_in_a_transaction_is_pushed_after_the_commit(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    with Session(engine) as session, session.begin():
        insert(session, name, 1)
        jid = welcome.perform_async(1)
        assert jid is not None and queued(redis) == []
    assert queued(redis) == [jid]


def test_a_rolled_back_transaction_pushes_nothing(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        insert(session, name, 1)
        welcome.perform_async(1)
        raise RuntimeError("the request failed")
    with Session(engine) as session:
        session.begin()
        welcome.perform_async(2)
        session.rollback()
    assert queued(redis) == []


def test_savepoints_behave_as_the_database_does(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    with Session(engine) as session, session.begin():
        insert(session, name, 1)
        kept = welcome.perform_async(1)
        with session.begin_nested():
            released = welcome.perform_async(2)
        assert queued(redis) == []  # released: waits for the outer commit
        savepoint = session.begin_nested()
        welcome.perform_async(3)
        savepoint.rollback()  # rolled back: dropped
        with session.begin_nested():
            inner = session.begin_nested()
            welcome.perform_async(4)
            inner.rollback()
            deep = welcome.perform_async(5)
    assert sorted(queued(redis)) == sorted([kept, released, deep])


def test_without_a_transaction_the_push_is_immediate(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, _ = table
    with Session(engine):
        jid = welcome.perform_async(1)
        assert queued(redis) == [jid]


def test_a_session_that_only_read_pushes_at_close_one_that_wrote_drops(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    with Session(engine) as session:
        session.execute(text(f"SELECT count(*) FROM {name}"))
        read_only = welcome.perform_async(1)
        assert queued(redis) == []
    assert queued(redis) == [read_only]
    with Session(engine) as session:
        insert(session, name, 2)
        welcome.perform_async(2)
    assert queued(redis) == [read_only]


def test_every_enqueue_form_waits_for_the_commit(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    with Session(engine) as session, session.begin():
        insert(session, name, 1)
        jids = [
            welcome.perform_async(1),
            welcome.set(queue="other").perform_async(2),
            *welcome.perform_bulk([[3], [4]]),
        ]
        later = [welcome.perform_in(60, 5), welcome.perform_at(4_000_000_000, 6)]
        assert redis.exists(f"queue:{QUEUE}", "queue:other", "schedule") == 0
    assert sorted(queued(redis) + queued(redis, "other")) == sorted(jids)
    assert sorted(limitd.payload.parse(raw)["jid"] for raw in redis.zrange("schedule", 0, -1)) == (
        sorted(later)
    )


def test_a_batch_built_in_a_transaction_opens_after_the_commit_as_one_unit(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, name = table
    batch = limitd.Batch("signups")
    with Session(engine) as session, session.begin():
        insert(session, name, 1)
        with batch.jobs():
            jids = welcome.perform_bulk([[1], [2], [3]])
        assert limitd.Batch.status(batch.bid) is None and queued(redis) == []
    status = limitd.Batch.status(batch.bid)
    assert status is not None and (status.total, status.pending) == (3, 3)
    assert sorted(queued(redis)) == sorted(jids)
    assert {limitd.payload.parse(raw)["bid"] for raw in redis.lrange(f"queue:{QUEUE}", 0, -1)} == {
        batch.bid
    }


def test_a_batch_in_a_rolled_back_transaction_never_exists(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, _ = table
    batch = limitd.Batch("signups")
    with Session(engine) as session:
        session.begin()
        with batch.jobs():
            welcome.perform_async(1)
        session.rollback()
    assert limitd.Batch.status(batch.bid) is None and queued(redis) == []


def test_a_bad_argument_fails_inside_the_transaction(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    engine, _ = table
    with Session(engine) as session, session.begin():
        with pytest.raises(limitd.UnsafeArgument):
            welcome.perform_async(object())
        with pytest.raises(limitd.UnsafeArgument):
            welcome.perform_bulk([[1], [{1, 2}]])


def test_a_push_that_fails_after_the_commit_is_logged_and_raised(
    own_redis_server: RedisServer, table: tuple[Engine, str], caplog: pytest.LogCaptureFixture
) -> None:
    engine, name = table
    conn = own_redis_server.client()
    limitd.set_default_client(limitd.Client(conn))
    try:
        session = Session(engine)
        session.begin()
        insert(session, name, 1)
        jid = welcome.perform_async(1)
        own_redis_server.stop()  # Redis goes away between the enqueue and the commit
        with (
            caplog.at_level(logging.ERROR, "limitd.transactions"),
            pytest.raises(PushAfterCommitFailed),
        ):
            session.commit()
        session.close()
        [record] = [r for r in caplog.records if r.name == "limitd.transactions"]
        assert f"jid={jid} class=test_tx_sa.welcome" in record.getMessage()
        with engine.connect() as check:  # the database did commit
            assert check.execute(text(f"SELECT id FROM {name}")).scalar_one() == 1
    finally:
        limitd.set_default_client(None)
        conn.close()


def test_async_sessions_hold_their_pushes_too(
    redis: redis_py.Redis, table: tuple[Engine, str], postgres_table: tuple[str, str]
) -> None:
    url, name = postgres_table
    engine = create_async_engine(url.replace("postgresql://", "postgresql+psycopg://"))

    async def scenario() -> list[Any]:
        seen: list[Any] = []
        async with AsyncSession(engine) as session:
            async with session.begin():
                await session.execute(text(f"INSERT INTO {name} VALUES (1)"))
                committed = welcome.perform_async(1)
                seen.append(queued(redis))
            seen.append(queued(redis) == [committed])
            await session.begin()
            welcome.perform_async(2)
            await session.rollback()
        seen.append(queued(redis) == [committed])
        await engine.dispose()
        return seen

    assert asyncio.run(scenario()) == [[], True, True]


ROWS = 1000


@limitd.job(name="test_tx_sa.check_row", queue="rows")
def check_row(table_name: str, row: int) -> None:
    import psycopg

    from tests.postgres import postgres_url

    with psycopg.connect(postgres_url()) as conn:
        found = conn.execute(f"SELECT 1 FROM {table_name} WHERE id = %s", (row,)).fetchone()
    limitd.default_client().redis.hincrby("tx_test:found" if found else "tx_test:missing", "n", 1)


def test_a_worker_always_finds_the_row_its_job_names(
    redis: redis_py.Redis, table: tuple[Engine, str]
) -> None:
    """1,000 jobs, each enqueued in the transaction that inserts its row, while a capsule
    drains the queue in another thread: every job finds its row."""
    engine, name = table
    capsule = Capsule(CapsuleConfig(queues=["rows"], concurrency=4), redis=redis)
    capsule.start()
    try:
        for row in range(ROWS):
            with Session(engine) as session, session.begin():
                insert(session, name, row)
                check_row.perform_async(name, row)
        done = threading.Event()
        for _ in range(600):
            if (
                int(redis.hget("tx_test:found", "n") or 0)
                + int(redis.hget("tx_test:missing", "n") or 0)
                == ROWS
            ):
                break
            done.wait(0.05)
    finally:
        capsule.stop(timeout=5)
    assert redis.hget("tx_test:missing", "n") is None
    assert int(redis.hget("tx_test:found", "n")) == ROWS


def test_the_plain_entry_point_picks_the_adapter_and_only_its_sessions(
    redis: redis_py.Redis, table: tuple[Engine, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.orm import sessionmaker

    from limitd.transactions import sqlalchemy as adapter

    engine, name = table
    monkeypatch.setattr(adapter, "_targets", [])  # as if only this maker were set up
    factory = sessionmaker(engine)
    limitd.transaction_aware(factory)
    limitd.transaction_aware(factory)  # again: still one hold per transaction
    with factory() as session, session.begin():
        insert(session, name, 1)
        jid = welcome.perform_async(1)
        assert queued(redis) == []
    assert queued(redis) == [jid]
    with Session(engine) as session, session.begin():  # not from the maker: at once
        insert(session, name, 2)
        other = welcome.perform_async(2)
        assert queued(redis) == [other, jid]
    limitd.transaction_aware("sqlalchemy")  # every Session: nothing changes twice
    with pytest.raises(TypeError, match="expected 'django', 'sqlalchemy'"):
        limitd.transaction_aware("peewee")
