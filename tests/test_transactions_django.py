"""Transaction-aware enqueue with Django on a real PostgreSQL: a job enqueued inside
``transaction.atomic()`` (or a view under ``ATOMIC_REQUESTS``) reaches Redis only after
the COMMIT, never after a rollback; nested blocks behave as savepoints; a push that fails
after the commit is logged, does not stop the others and is raised to the committer; and
a worker always finds the row its job names.

Django is configured here, once per process, with this module as its URLconf; the tables
are created and dropped with raw SQL (no migrations, no Django test runner)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis as redis_py

import limitd
from limitd.config import CapsuleConfig
from limitd.connection.embedded import RedisServer
from limitd.supervisor.capsule import Capsule
from limitd.transactions import django as tx_django
from limitd.transactions import hold
from limitd.transactions.hold import PushAfterCommitFailed
from tests.postgres import postgres_url

pytest.importorskip("django")
pytest.importorskip("psycopg")

from django.db import transaction  # after the skips
from django.http import HttpRequest, JsonResponse
from django.urls import path

QUEUE = "tx_dj"
_configured = threading.Lock()


@limitd.job(name="test_tx_dj.welcome", queue=QUEUE)
def welcome(user_id: int) -> None: ...


def configure_django() -> None:
    """Once per process: the test PostgreSQL as ``default`` (with ATOMIC_REQUESTS) and
    again as ``other``; leaves Django alone if something configured it already."""
    import django
    from django.conf import settings

    with _configured:
        if settings.configured:
            return
        url = urlsplit(postgres_url())
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/") or "test",
            "USER": url.username or "postgres",
            "PASSWORD": url.password or "",
            "HOST": url.hostname or "127.0.0.1",
            "PORT": url.port or 5432,
        }
        settings.configure(
            DATABASES={"default": {**database, "ATOMIC_REQUESTS": True}, "other": database},
            ROOT_URLCONF=__name__,
            ALLOWED_HOSTS=["testserver"],
            INSTALLED_APPS=[],
            MIDDLEWARE=[],
            SECRET_KEY="limitd-tests",
            USE_TZ=True,
        )
        django.setup()


@pytest.fixture
def table(postgres_table: tuple[str, str]) -> Iterator[str]:
    """A fresh table ``(id int PRIMARY KEY)`` reached through Django's connection."""
    from django.db import connection, connections

    _, name = postgres_table
    configure_django()
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
    yield name
    connections.close_all()


@pytest.fixture
def aware(table: str) -> Iterator[str]:
    """``table``, with pushes held by every alias's atomic blocks for the test."""
    provider = tx_django.transaction_aware()
    yield table
    hold.remove_provider(provider)


def queued(redis: redis_py.Redis, queue: str = QUEUE) -> list[str]:
    return [limitd.payload.parse(raw)["jid"] for raw in redis.lrange(f"queue:{queue}", 0, -1)]


def insert(name: str, row: int, using: str = "default") -> None:
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute(f"INSERT INTO {name} VALUES (%s)", [row])


def rows(name: str) -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {name} ORDER BY id")
        return [row for (row,) in cursor.fetchall()]


# Views, served through ATOMIC_REQUESTS (this module is the URLconf).


def signup(request: HttpRequest) -> JsonResponse:
    insert(request.GET["table"], 1)
    jid = welcome.perform_async(1)
    during = queued(limitd.default_client().redis)
    return JsonResponse({"jid": jid, "queued_during_view": during})


def broken_signup(request: HttpRequest) -> JsonResponse:
    insert(request.GET["table"], 1)
    welcome.perform_async(1)
    raise RuntimeError("the view failed after enqueueing")


VIEW_CLIENTS: dict[str, limitd.Client] = {}  # what signup_elsewhere enqueues through


def signup_elsewhere(request: HttpRequest) -> JsonResponse:
    insert(request.GET["table"], 1)
    welcome.set(client=VIEW_CLIENTS["elsewhere"]).perform_async(1)
    return JsonResponse({})


urlpatterns = [
    path("signup", signup),
    path("broken", broken_signup),
    path("elsewhere", signup_elsewhere),
]


def test_a_job_enqueued_in_atomic_is_pushed_after_the_commit(
    redis: redis_py.Redis, aware: str
) -> None:
    with transaction.atomic():
        insert(aware, 1)
        jid = welcome.perform_async(1)
        assert jid is not None and queued(redis) == []
    assert queued(redis) == [jid]


def test_a_rolled_back_atomic_block_pushes_nothing(redis: redis_py.Redis, aware: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        insert(aware, 1)
        welcome.perform_async(1)
        raise RuntimeError("the request failed")
    with transaction.atomic():
        welcome.perform_async(2)
        transaction.set_rollback(True)
    assert queued(redis) == [] and rows(aware) == []


def test_nested_atomic_blocks_behave_as_savepoints(redis: redis_py.Redis, aware: str) -> None:
    with transaction.atomic():
        insert(aware, 1)
        kept = welcome.perform_async(1)
        with transaction.atomic():
            released = welcome.perform_async(2)
        assert queued(redis) == []  # released: waits for the outer commit
        with pytest.raises(RuntimeError), transaction.atomic():
            welcome.perform_async(3)
            raise RuntimeError("rolled back: dropped")
        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():
                welcome.perform_async(4)
                raise RuntimeError("the inner one only")
            deep = welcome.perform_async(5)
        assert queued(redis) == []
    assert sorted(queued(redis)) == sorted([kept, released, deep])


def test_without_an_atomic_block_the_push_is_immediate(redis: redis_py.Redis, aware: str) -> None:
    insert(aware, 1)  # autocommit
    jid = welcome.perform_async(1)
    assert queued(redis) == [jid]


def test_a_view_under_atomic_requests_pushes_after_its_transaction_commits(
    redis: redis_py.Redis, aware: str
) -> None:
    from django.test import Client

    reply = Client().get("/signup", {"table": aware}).json()
    assert reply["queued_during_view"] == []
    assert queued(redis) == [reply["jid"]]
    assert rows(aware) == [1]


def test_a_view_that_raises_under_atomic_requests_pushes_nothing(
    redis: redis_py.Redis, aware: str
) -> None:
    from django.test import Client

    with pytest.raises(RuntimeError, match="after enqueueing"):
        Client().get("/broken", {"table": aware})
    assert queued(redis) == [] and rows(aware) == []


def test_a_view_whose_push_fails_after_its_commit_raises_to_the_request(
    aware: str, dead_redis: tuple[limitd.Client, RedisServer]
) -> None:
    from django.test import Client

    VIEW_CLIENTS["elsewhere"], server = dead_redis
    server.stop()
    try:
        with pytest.raises(PushAfterCommitFailed):
            Client().get("/elsewhere", {"table": aware})
        assert rows(aware) == [1]
    finally:
        VIEW_CLIENTS.clear()


def test_every_enqueue_form_waits_for_the_commit(redis: redis_py.Redis, aware: str) -> None:
    with transaction.atomic():
        insert(aware, 1)
        jids = [
            welcome.perform_async(1),
            welcome.set(queue="tx_dj_other").perform_async(2),
            *welcome.perform_bulk([[3], [4]]),
        ]
        later = [welcome.perform_in(60, 5), welcome.perform_at(4_000_000_000, 6)]
        assert redis.exists(f"queue:{QUEUE}", "queue:tx_dj_other", "schedule") == 0
    assert sorted(queued(redis) + queued(redis, "tx_dj_other")) == sorted(jids)
    scheduled = [limitd.payload.parse(raw)["jid"] for raw in redis.zrange("schedule", 0, -1)]
    assert sorted(scheduled) == sorted(later)


def test_a_batch_built_in_atomic_opens_after_the_commit_as_one_unit(
    redis: redis_py.Redis, aware: str
) -> None:
    batch = limitd.Batch("signups")
    with transaction.atomic():
        insert(aware, 1)
        with batch.jobs():
            jids = welcome.perform_bulk([[1], [2], [3]])
        assert limitd.Batch.status(batch.bid) is None and queued(redis) == []
    status = limitd.Batch.status(batch.bid)
    assert status is not None and (status.total, status.pending) == (3, 3)
    assert sorted(queued(redis)) == sorted(jids)
    bids = {limitd.payload.parse(raw)["bid"] for raw in redis.lrange(f"queue:{QUEUE}", 0, -1)}
    assert bids == {batch.bid}


def test_a_batch_in_a_rolled_back_atomic_block_never_exists(
    redis: redis_py.Redis, aware: str
) -> None:
    batch = limitd.Batch("signups")
    with pytest.raises(RuntimeError), transaction.atomic():
        with batch.jobs():
            welcome.perform_async(1)
        raise RuntimeError("rolled back")
    assert limitd.Batch.status(batch.bid) is None and queued(redis) == []


def test_a_bad_argument_fails_inside_the_transaction(redis: redis_py.Redis, aware: str) -> None:
    with transaction.atomic():
        insert(aware, 1)
        with pytest.raises(limitd.UnsafeArgument):
            welcome.perform_async(object())
        with pytest.raises(limitd.UnsafeArgument):
            welcome.perform_bulk([[1], [{1, 2}]])
    assert queued(redis) == [] and rows(aware) == [1]


@pytest.fixture
def dead_redis(own_redis_server: RedisServer) -> Iterator[tuple[limitd.Client, RedisServer]]:
    """A client and its Redis, which the test stops between the enqueue and the commit."""
    conn = own_redis_server.client()
    yield limitd.Client(conn), own_redis_server
    conn.close()


def enqueue_one_failing(name: str, dead: limitd.Client, others: list[str]) -> tuple[str, list[str]]:
    """In the open atomic block: a good push, one through ``dead``, a user callback, a
    good push, a push in a rolled-back savepoint and a user callback, in that order."""
    good = [welcome.perform_async(1)]
    failing = welcome.set(client=dead).perform_async(2)
    transaction.on_commit(lambda: others.append("between"), robust=True)
    good += welcome.perform_bulk([[3], [4]])
    with pytest.raises(RuntimeError), transaction.atomic():
        welcome.perform_async(5)  # the last limitd callback registered: dropped
        raise RuntimeError("savepoint rolled back")
    transaction.on_commit(lambda: others.append("after"))  # not robust, and last
    insert(name, 1)
    assert failing is not None and None not in good
    return failing, [str(jid) for jid in good]


def test_a_push_that_fails_after_the_commit_is_logged_and_raised_and_the_rest_go_out(
    redis: redis_py.Redis,
    aware: str,
    dead_redis: tuple[limitd.Client, RedisServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead_client, dead_server = dead_redis
    others: list[str] = []
    with (
        caplog.at_level(logging.ERROR),
        pytest.raises(PushAfterCommitFailed) as raised,
        transaction.atomic(),
    ):
        failing, good = enqueue_one_failing(aware, dead_client, others)
        dead_server.stop()  # its Redis goes away before the commit
    assert isinstance(raised.value.__cause__, redis_py.ConnectionError)
    assert f"jid={failing} class=test_tx_dj.welcome" in str(raised.value)
    assert sorted(queued(redis)) == sorted(good)  # the other pushes went out
    assert others == ["between", "after"]  # every other callback ran, then the raise
    assert rows(aware) == [1]  # the database did commit
    [record] = [r for r in caplog.records if r.name.startswith("limitd")]
    assert record.name == "limitd.transactions"
    assert f"jid={failing} class=test_tx_dj.welcome" in record.getMessage()
    assert not [r for r in caplog.records if r.name.startswith("django")]


def test_a_failed_push_is_still_logged_where_django_internals_are_out_of_reach(
    redis: redis_py.Redis,
    aware: str,
    dead_redis: tuple[limitd.Client, RedisServer],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Django that keeps its pending callbacks some other way: no raise, but every
    failure logged, every other push and callback still run."""
    monkeypatch.setattr(tx_django, "_pending_callbacks", lambda: None)
    dead_client, dead_server = dead_redis
    others: list[str] = []
    with caplog.at_level(logging.ERROR), transaction.atomic():
        failing, good = enqueue_one_failing(aware, dead_client, others)
        dead_server.stop()
    assert sorted(queued(redis)) == sorted(good) and others == ["between", "after"]
    messages = [r.getMessage() for r in caplog.records if r.name == "limitd.transactions"]
    assert len(messages) == 2 and all(f"jid={failing}" in message for message in messages)
    assert "cannot be raised" in messages[1]


def test_django_test_cases_can_run_the_held_pushes_with_capture_on_commit_callbacks(
    redis: redis_py.Redis, aware: str
) -> None:
    """A ``TestCase`` never commits; ``captureOnCommitCallbacks(execute=True)`` runs the
    held pushes as if it had (the README tells users so)."""
    from django.test import TestCase

    with transaction.atomic():  # the TestCase's own transaction, rolled back at the end
        with TestCase.captureOnCommitCallbacks(execute=True) as callbacks:
            jid = welcome.perform_async(1)
            assert queued(redis) == []
        assert queued(redis) == [jid] and len(callbacks) == 1
        transaction.set_rollback(True)


def test_only_the_aliases_asked_for_hold_pushes(redis: redis_py.Redis, table: str) -> None:
    provider = tx_django.transaction_aware(using="other")
    try:
        assert tx_django.transaction_aware(["other"]) == provider  # registered once
        with transaction.atomic():  # "default": not watched, pushed at once
            immediate = welcome.perform_async(1)
            assert queued(redis) == [immediate]
        with transaction.atomic(using="other"):
            insert(table, 2, using="other")
            held = welcome.perform_async(2)
            assert queued(redis) == [immediate]
        assert queued(redis) == [held, immediate]
        with pytest.raises(ValueError, match="missing"):
            tx_django.transaction_aware(["other", "missing"])
    finally:
        hold.remove_provider(provider)


def test_limitd_imports_without_django() -> None:
    code = (
        "import sys; sys.modules['django'] = None\n"
        "import limitd, limitd.transactions.django\n"
        "limitd.transactions.hold.current()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


ROWS = 1000


@limitd.job(name="test_tx_dj.check_row", queue="tx_dj_rows")
def check_row(table_name: str, row: int) -> None:
    import psycopg

    with psycopg.connect(postgres_url()) as conn:
        found = conn.execute(f"SELECT 1 FROM {table_name} WHERE id = %s", (row,)).fetchone()
    limitd.default_client().redis.hincrby("tx_test:found" if found else "tx_test:missing", "n", 1)


def counted(redis: redis_py.Redis) -> int:
    return sum(int(redis.hget(key, "n") or 0) for key in ("tx_test:found", "tx_test:missing"))


def test_a_worker_always_finds_the_row_its_job_names(redis: redis_py.Redis, aware: str) -> None:
    """1,000 jobs, each enqueued in the atomic block that inserts its row, while a
    capsule drains the queue in other threads: every job finds its row."""
    capsule = Capsule(CapsuleConfig(queues=["tx_dj_rows"], concurrency=4), redis=redis)
    capsule.start()
    try:
        for row in range(ROWS):
            with transaction.atomic():
                insert(aware, row)
                check_row.perform_async(aware, row)
        waited = threading.Event()
        for _ in range(600):
            if counted(redis) == ROWS:
                break
            waited.wait(0.05)
    finally:
        capsule.stop(timeout=5)
    assert redis.hget("tx_test:missing", "n") is None
    assert int(redis.hget("tx_test:found", "n")) == ROWS


def test_the_outbox_writes_rows_in_the_atomic_block_and_the_relay_pushes_them(
    redis: redis_py.Redis, table: str
) -> None:
    """outbox=True: pushes become rows of the outbox table in the block's transaction,
    kept or dropped with it (savepoints included); the relay pushes the kept ones."""
    from django.db import connection, transaction
    from sqlalchemy import create_engine

    from limitd.outbox.held import OutboxUnsupported
    from limitd.outbox.relay import Relay
    from limitd.outbox.table import create_table
    from tests.postgres import postgres_url

    outbox = f"{table}_outbox"
    engine = create_engine(postgres_url().replace("postgresql://", "postgresql+psycopg://"))
    create_table(engine, outbox)
    provider = tx_django.transaction_aware(outbox=outbox)
    try:
        with transaction.atomic():
            insert(table, 1)
            kept = welcome.perform_async(1)
            try:
                with transaction.atomic():
                    welcome.perform_async(2)
                    raise RuntimeError("the savepoint rolls back")
            except RuntimeError:
                pass
            with pytest.raises(OutboxUnsupported), limitd.Batch("b").jobs():
                welcome.perform_async(3)
        with pytest.raises(RuntimeError), transaction.atomic():
            welcome.perform_async(4)
            raise RuntimeError("the whole block rolls back")
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT jid FROM {outbox}")
            assert [jid for (jid,) in cursor.fetchall()] == [kept]
        assert queued(redis) == []
        assert Relay(engine, limitd.default_client(), outbox).drain() == 1
        assert queued(redis) == [kept]
    finally:
        hold.remove_provider(provider)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {outbox}")
        engine.dispose()
