"""The asyncio client through real Redis: every enqueue form writes what its sync twin
writes; unique jobs, batches and tenant fairness on the async path; a user's sync
middleware bridged through a worker thread; held pushes in a transaction; failover; the
loop kept free while Redis is slow; and an enqueue from a Starlette endpoint.

Each test runs its coroutine with ``asyncio.run`` (a fresh loop, and so fresh asyncio
connections: see ``limitd.connection.loop_twin``)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from redis.asyncio import Redis as AsyncRedis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import limitd
from limitd import clock, keys
from limitd.aio import client as aio_client
from limitd.aio.client import AsyncClient
from limitd.batch.app import AsyncBatchJobs
from limitd.connection import loop_twin
from limitd.connection.embedded import RedisServer
from limitd.middleware import ClientChain
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.transactions import hold
from limitd.unique import middleware as unique
from limitd.unique.middleware import UniqueJobs
from tests.failover_proxy import FailoverProxy

# Fields that differ between two pushes of the same job.
PER_PUSH = ("jid", "created_at", "enqueued_at")


@limitd.job(name="aio_test.Send", queue="webhooks", retry=5)
def send(tenant: int, url: str) -> None: ...


class Hard(limitd.Job, name="aio_test.Hard", queue="critical", retry=3):
    def perform(self, name: str, count: int) -> None: ...


@limitd.job(name="aio_test.Import", unique_for=600)
def import_account(account: int) -> None: ...


@limitd.job(name="aio_test.Work")
def work(n: int) -> None: ...


@limitd.job(name="aio_test.Callback", queue="callbacks")
def callback(status: dict, options: dict) -> None: ...


@limitd.job(
    name="aio_test.Sync",
    fair_tenant_queues=[{"queue": "throttled", "threshold": 3, "per": 60}],
    tenant=lambda account, *_: f"account-{account}",
)
def sync_account(account: int, n: int = 0) -> None: ...


def stripped(raw: bytes) -> dict[str, Any]:
    payload = json.loads(raw)
    return {k: v for k, v in payload.items() if k not in PER_PUSH}


def queued(redis: redis_py.Redis, queue: str) -> list[dict[str, Any]]:
    """The queue's payloads, oldest first."""
    return [json.loads(raw) for raw in reversed(redis.lrange(keys.of(redis).queue(queue), 0, -1))]


def scheduled(redis: redis_py.Redis) -> list[tuple[dict[str, Any], float]]:
    return [
        (json.loads(raw), score)
        for raw, score in redis.zrange(keys.of(redis).SCHEDULE, 0, -1, withscores=True)
    ]


def everything(redis: redis_py.Redis) -> dict[str, Any]:
    """What the enqueues left in Redis, minus what differs from push to push."""
    return {
        "queues": redis.smembers(keys.of(redis).QUEUES),
        **{
            q: [stripped(r) for r in redis.lrange(keys.of(redis).queue(q), 0, -1)]
            for q in ("webhooks", "low", "critical")
        },
        "schedule": sorted(
            (json.dumps(stripped(raw), sort_keys=True), round(score))
            for raw, score in redis.zrange(keys.of(redis).SCHEDULE, 0, -1, withscores=True)
        ),
    }


AT = time.time() + 3600


def enqueue_sync() -> list[object]:
    return [
        send.perform_async(1, "a"),
        send.set(queue="low", retry=False).perform_async(2, "b"),
        send.perform_in(600, 3, "c"),
        send.perform_at(AT, 4, "d"),
        send.perform_bulk([[5, "e"], [6, "f"], [7, "g"]], batch_size=2),
        Hard.perform_async("x", 1),
        Hard.set(queue="low").perform_in(600, "y", 2),
        Hard.perform_bulk([["z", 3]]),
    ]


async def enqueue_async() -> list[object]:
    return [
        await send.aio.perform_async(1, "a"),
        await send.aio.set(queue="low", retry=False).perform_async(2, "b"),
        await send.aio.perform_in(600, 3, "c"),
        await send.aio.perform_at(AT, 4, "d"),
        await send.aio.perform_bulk([[5, "e"], [6, "f"], [7, "g"]], batch_size=2),
        await Hard.aio.perform_async("x", 1),
        await Hard.aio.set(queue="low").perform_in(600, "y", 2),
        await Hard.aio.perform_bulk([["z", 3]]),
    ]


def all_jids(redis: redis_py.Redis) -> set[str]:
    bodies = [
        raw
        for q in ("webhooks", "low", "critical")
        for raw in redis.lrange(keys.of(redis).queue(q), 0, -1)
    ]
    bodies += redis.zrange(keys.of(redis).SCHEDULE, 0, -1)
    return {json.loads(raw)["jid"] for raw in bodies}


def flat(returned: list[object]) -> list[object]:
    return [jid for item in returned for jid in (item if isinstance(item, list) else [item])]


def test_every_enqueue_form_writes_what_its_sync_twin_writes(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One instant for both twins: perform_in's scores must not straddle a second (they
    # did once in CI, the cluster's flush between the two taking the time).
    now = time.time()
    monkeypatch.setattr(clock, "now", lambda: now)
    sync_jids = flat(enqueue_sync())
    sync_state = everything(redis)
    assert set(sync_jids) == all_jids(redis)
    redis.flushall()

    writes: list[int] = []
    real_write = aio_client.queue_write
    monkeypatch.setattr(
        aio_client,
        "queue_write",
        lambda pipe, payloads: (writes.append(len(payloads)), real_write(pipe, payloads)),
    )
    async_jids = flat(asyncio.run(enqueue_async()))

    assert everything(redis) == sync_state
    assert len(async_jids) == len(sync_jids) == 10
    assert all(isinstance(jid, str) for jid in async_jids)
    assert set(async_jids) == all_jids(redis)
    assert writes == [1, 1, 1, 1, 2, 1, 1, 1, 1]  # the bulk of three in chunks of two
    [(at_job, at_score)] = [(p, s) for p, s in scheduled(redis) if p["args"] == [4, "d"]]
    assert at_score == pytest.approx(AT)
    [(in_job, in_score)] = [(p, s) for p, s in scheduled(redis) if p["args"] == [3, "c"]]
    assert in_score == pytest.approx(time.time() + 600, abs=5)
    assert "at" not in at_job and "at" not in in_job


def test_set_checks_options_like_the_sync_set(redis: redis_py.Redis) -> None:
    with pytest.raises(limitd.InvalidJobOption):
        send.set(queue="")
    with pytest.raises(limitd.InvalidJobOption):
        send.aio.set(queue="")
    with pytest.raises(limitd.InvalidJobOption):
        Hard.aio.set(nonsense=1)
    low = send.aio.set(queue="low")
    assert asyncio.run(low.set(retry=1).perform_async(1, "a")) is not None
    [payload] = queued(redis, "low")
    assert (payload["queue"], payload["retry"]) == ("low", 1)


def test_a_sync_enqueuers_client_is_used_through_its_twin(redis: redis_py.Redis) -> None:
    chain = ClientChain([Tag("from-set")])
    client = limitd.Client(redis, middleware=chain)
    jid = asyncio.run(send.set(client=client).aio.perform_async(1, "a"))
    [payload] = queued(redis, "webhooks")
    assert (payload["jid"], payload["tag"]) == (jid, "from-set")


# -- unique jobs ----------------------------------------------------------------------


def test_a_duplicate_is_skipped_until_the_lock_is_released(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(queues=["default"]), redis=redis)

    async def twice() -> list[str | None]:
        return [
            await import_account.aio.perform_async(42),
            await import_account.aio.perform_async(42),
            await import_account.aio.perform_async(43),
        ]

    first, duplicate, other = asyncio.run(twice())
    assert first and other and duplicate is None
    assert import_account.perform_async(42) is None  # the sync client sees the same lock
    assert int(redis.get(keys.of(redis).UNIQUE_SKIPPED)) == 2
    assert capsule.drain() == {"done": 2}  # success releases the locks
    assert asyncio.run(import_account.aio.perform_async(42)) is not None


def test_bulk_skips_duplicates_and_frees_locks_when_the_chunk_fails(redis: redis_py.Redis) -> None:
    jids = asyncio.run(import_account.aio.perform_bulk([[1], [1], [2]]))
    assert jids[0] and jids[2] and jids[1] is None
    assert redis.llen(keys.of(redis).queue("default")) == 2

    with pytest.raises(TypeError):  # a chunk that cannot be written
        asyncio.run(import_account.aio.perform_bulk([[3], [object()]]))
    assert not redis.exists(
        unique.lock_key(
            keys.of(redis), {"class": "aio_test.Import", "queue": "default", "args": [3]}
        )
    )
    assert asyncio.run(import_account.aio.perform_async(3)) is not None


# -- batches --------------------------------------------------------------------------


def test_a_batch_built_in_async_code_counts_its_jobs_and_fires(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(queues=["default"]), redis=redis)
    batch = limitd.Batch("async batch", callback_queue="callbacks")
    batch.on("complete", callback, {"was": "complete"})
    batch.on("success", callback, {"was": "success"})

    async def build() -> None:
        async with batch.aio.jobs():
            await work.aio.perform_async(1)
            await work.aio.perform_in(0, 2)
            await work.aio.perform_bulk([[3], [4]])
            work.perform_async(5)  # a sync push in the block joins too
            status = limitd.Batch.status(batch.bid)
            assert status is not None and status.building == 1
        await work.aio.perform_async(6)  # after the block: not in the batch

    asyncio.run(build())
    status = limitd.Batch.status(batch.bid)
    assert status is not None
    assert (status.total, status.pending, status.building, status.complete) == (5, 5, 0, False)
    in_batch = [p["args"][0] for p in queued(redis, "default") if p.get("bid") == batch.bid]
    assert sorted(in_batch) == [1, 2, 3, 4, 5]

    assert capsule.drain() == {"done": 6}
    fired = [
        json.loads(raw)["args"]
        for raw in reversed(redis.lrange(keys.of(redis).queue("callbacks"), 0, -1))
    ]
    assert [(status["event"], status["total"], options) for status, options in fired] == [
        ("complete", 5, {"was": "complete"}),
        ("success", 5, {"was": "success"}),
    ]


def test_an_async_block_writes_the_batch_a_sync_block_writes(redis: redis_py.Redis) -> None:
    parent_sync, parent_async = limitd.Batch("parent"), limitd.Batch("parent")
    child_sync = limitd.Batch("child", expires_in=3600).on("success", callback)
    child_async = limitd.Batch("child", expires_in=3600).on("success", callback)
    with parent_sync.jobs(), child_sync.jobs():
        work.perform_async(1)

    async def build() -> None:
        async with parent_async.aio.jobs(), child_async.aio.jobs():
            await work.aio.perform_async(1)

    asyncio.run(build())

    def batch_hash(batch: limitd.Batch, parent: limitd.Batch) -> dict[str, str]:
        """The child's hash, its own ids and its parent's replaced by placeholders."""
        raw = redis.hgetall(keys.of(redis).batch(batch.bid))
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        fields.pop("created_at")
        # The callback's template carries its own jid and creation time.
        fields["on_success"] = re.sub(r'\\"(jid|created_at)\\":[^,}]*', "", fields["on_success"])
        return {
            name: value.replace(batch.bid, "BID").replace(parent.bid, "PARENT")
            for name, value in fields.items()
        }

    assert batch_hash(child_async, parent_async) == batch_hash(child_sync, parent_sync)
    assert redis.ttl(keys.of(redis).batch(child_async.bid)) == pytest.approx(3600, abs=5)
    assert isinstance(parent_async.aio, AsyncBatchJobs)

    async def reopen_completed() -> None:
        empty = limitd.Batch()
        async with empty.aio.jobs():
            pass
        async with limitd.Batch.open(empty.bid).aio.jobs():
            pass

    with pytest.raises(limitd.BatchNotOpen):
        asyncio.run(reopen_completed())


# -- tenant fairness ------------------------------------------------------------------


def test_a_greedy_tenant_is_rerouted_as_by_the_sync_client(redis: redis_py.Redis) -> None:
    """threshold 3: the first 3 of a window keep their queue, the 4th is rerouted."""

    async def enqueue() -> None:
        for n in range(4):
            await sync_account.aio.perform_async(7, n)
        await sync_account.aio.perform_bulk([[8, n] for n in range(5)])

    asyncio.run(enqueue())
    for n in range(4):
        sync_account.perform_async(9, n)
    sync_account.perform_bulk([[10, n] for n in range(5)])

    def routed(account: int) -> dict[str, list[int]]:
        return {
            queue: [p["args"][1] for p in queued(redis, queue) if p["args"][0] == account]
            for queue in ("default", "throttled")
        }

    assert routed(7) == routed(9) == {"default": [0, 1, 2], "throttled": [3]}
    assert routed(8) == routed(10) == {"default": [0, 1, 2], "throttled": [3, 4]}
    [rerouted] = [p for p in queued(redis, "throttled") if p["args"] == [7, 3]]
    assert rerouted["fair_tenant"] == "account-7"
    assert "fair_tenant_queues" not in rerouted


# -- middleware without acall ---------------------------------------------------------


class Tag:
    """A user's sync middleware: changes the payload, sees the job in Redis after."""

    def __init__(self, tag: str, seen: list[tuple[str, Any, int]] | None = None) -> None:
        self.tag, self.seen = tag, seen

    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        payload["tag"] = self.tag
        pushed = call_next(payload)
        if self.seen is not None:
            self.seen.append(
                (threading.current_thread().name, redis, redis.llen("queue:" + payload["queue"]))
            )
        return pushed


class HaltNegative:
    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        return None if payload["args"][0] < 0 else call_next(payload)


class BulkHooks:
    """Sync bulk hooks: run in a worker thread too."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, bool]] = []

    def prepare_bulk(self, spec, payloads, redis) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("prepare", len(payloads), isinstance(redis, redis_py.Redis)))

    def abandon_bulk(self, spec, payloads, redis) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("abandon", len(payloads), isinstance(redis, redis_py.Redis)))

    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        return call_next(payload)


@pytest.mark.standalone_only("checks the bridged client is a plain redis.Redis")
def test_a_middleware_without_acall_runs_in_a_thread_and_may_change_or_halt(
    redis: redis_py.Redis,
) -> None:
    seen: list[tuple[str, Any, int]] = []
    hooks = BulkHooks()
    chain = ClientChain([HaltNegative(), Tag("web", seen), UniqueJobs(), hooks])
    limitd.set_default_client(limitd.Client(redis, middleware=chain))
    loop_thread = threading.current_thread().name

    async def enqueue() -> list[object]:
        return [
            await work.aio.perform_async(-1),
            await work.aio.perform_async(1),
            await import_account.aio.perform_async(5),
            await import_account.aio.perform_async(5),  # the acall after a bridged one
            await work.aio.perform_bulk([[2], [-3], [4]]),
        ]

    halted, pushed, unique, duplicate, bulk = asyncio.run(enqueue())
    assert halted is None and duplicate is None
    assert isinstance(pushed, str) and isinstance(unique, str)
    assert isinstance(bulk, list) and bulk[1] is None and bulk[0] and bulk[2]
    payloads = queued(redis, "default")
    assert [p["args"] for p in payloads] == [[1], [5], [2], [4]]
    assert {p["tag"] for p in payloads} == {"web"}
    threads = {thread for thread, _, _ in seen}
    assert loop_thread not in threads
    assert all(isinstance(conn, redis_py.Redis) for _, conn, _ in seen)
    assert seen[0][2] == 1  # after call_next the job was in Redis
    assert hooks.calls == [("prepare", 3, True)]

    with pytest.raises(TypeError):
        asyncio.run(work.aio.perform_bulk([[object()]]))
    assert hooks.calls[-2:] == [("prepare", 1, True), ("abandon", 1, True)]


@pytest.mark.standalone_only("builds clients on one server's pool")
def test_an_explicit_async_client_bridges_with_a_sync_twin(redis: redis_py.Redis) -> None:
    seen: list[tuple[str, Any, int]] = []

    async def enqueue() -> str | None:
        conn = AsyncRedis.from_url(redis_url(redis))
        client = AsyncClient(conn, middleware=ClientChain([Tag("explicit", seen)]))
        try:
            return await send.aio.set(client=client).perform_async(1, "a")
        finally:
            await conn.aclose()

    jid = asyncio.run(enqueue())
    [payload] = queued(redis, "webhooks")
    assert (payload["jid"], payload["tag"]) == (jid, "explicit")
    [(_, conn, length)] = seen
    assert isinstance(conn, redis_py.Redis) and length == 1


def redis_url(conn: redis_py.Redis) -> str:
    kwargs = conn.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


# -- transactions ---------------------------------------------------------------------


def test_in_a_transaction_the_push_waits_for_the_commit(redis: redis_py.Redis) -> None:
    held = hold.Held()

    def provider() -> hold.Held:
        return held

    hold.add_provider(provider)
    try:

        async def enqueue() -> list[object]:
            return [
                await send.aio.perform_async(1, "a"),
                await send.aio.perform_bulk([[2, "b"], [3, "c"]]),
            ]

        jid, bulk = asyncio.run(enqueue())
        with pytest.raises(TypeError):  # validated now, in the transaction
            asyncio.run(send.aio.perform_async(object(), "x"))
    finally:
        hold.remove_provider(provider)
    assert isinstance(jid, str) and isinstance(bulk, list) and len(bulk) == 2
    assert redis.dbsize() == 0
    held.run()
    assert [p["jid"] for p in queued(redis, "webhooks")] == [jid, *bulk]


# -- failover -------------------------------------------------------------------------


@pytest.fixture
def replica(redis_server: RedisServer) -> Iterator[RedisServer]:
    """A server that answers writes with READONLY, like a demoted primary."""
    server = RedisServer()
    server.start()
    with server.client() as conn:
        conn.replicaof("127.0.0.1", redis_server.port)
    yield server
    server.stop()


@pytest.mark.standalone_only("a proxy between one client and one server")
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_failover_reconnects_and_retries_once(
    redis: redis_py.Redis, redis_server: RedisServer, replica: RedisServer, flavour: str
) -> None:
    proxy = FailoverProxy(lambda n: replica.port if n == 0 else redis_server.port)
    payload = {"class": "aio_test.Work", "args": [1]}

    def sync_push() -> str | None:
        client = limitd.Client(redis_py.Redis(port=proxy.port))
        try:
            return client.push(payload)
        finally:
            client.redis.close()

    async def push() -> str | None:
        conn = AsyncRedis(port=proxy.port)
        try:
            return await AsyncClient(conn).push(payload)
        finally:
            await conn.aclose()

    try:
        jid = sync_push() if flavour == "sync" else asyncio.run(push())
    finally:
        proxy.close()
    assert proxy.connections == 2
    assert [p["jid"] for p in queued(redis, "default")] == [jid]


# -- the event loop -------------------------------------------------------------------


def test_the_loop_keeps_running_while_a_push_waits_on_redis(redis: redis_py.Redis) -> None:
    async def slow_push() -> tuple[int, float]:
        await work.aio.perform_async(0)  # connected before Redis pauses
        redis.execute_command("CLIENT", "PAUSE", 200)
        started = time.monotonic()
        push = asyncio.create_task(work.aio.perform_async(1))
        ticks = 0
        while not push.done():
            ticks += 1
            await asyncio.sleep(0.005)
        await push
        return ticks, time.monotonic() - started

    ticks, waited = asyncio.run(slow_push())
    assert waited >= 0.15  # the pause held the push
    assert ticks >= 10  # and the loop ran other tasks meanwhile
    assert redis.llen(keys.of(redis).queue("default")) == 2


class RefusingPool(redis_py.ConnectionPool):
    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the async path used the sync client's Redis")


@pytest.mark.standalone_only("builds clients on one server's pool")
def test_a_plain_push_never_touches_the_sync_clients_redis(redis: redis_py.Redis) -> None:
    kwargs = redis.connection_pool.connection_kwargs
    refusing = redis_py.Redis(connection_pool=RefusingPool(**kwargs))
    limitd.set_default_client(limitd.Client(refusing))
    batch = limitd.Batch()

    async def enqueue() -> None:
        await send.aio.perform_async(1, "a")
        await send.aio.perform_bulk([[2, "b"]])
        await import_account.aio.perform_async(1)  # unique: its acall
        await sync_account.aio.perform_async(1)  # fair tenant: its acall
        await sync_account.aio.perform_bulk([[1], [2]])
        async with batch.aio.jobs():  # batch: opened, filled and closed async
            await work.aio.perform_async(1)

    asyncio.run(enqueue())
    assert redis.llen(keys.of(redis).queue("webhooks")) == 2
    assert redis.llen(keys.of(redis).queue("default")) == 5
    status = limitd.Batch.status(batch.bid, client=limitd.Client(redis))
    assert status is not None and status.total == 1


# -- a web app ------------------------------------------------------------------------


def test_a_starlette_endpoint_enqueues_with_await(redis: redis_py.Redis) -> None:
    async def hook(request: Request) -> JSONResponse:
        tenant = int(request.path_params["tenant"])
        jid = await send.aio.perform_async(tenant, "https://example.com/hook")
        return JSONResponse({"jid": jid})

    app = Starlette(routes=[Route("/hooks/{tenant}", hook, methods=["POST"])])
    with TestClient(app) as http:
        first = http.post("/hooks/1").json()["jid"]
        second = http.post("/hooks/2").json()["jid"]
    assert [(p["jid"], p["args"][0]) for p in queued(redis, "webhooks")] == [
        (first, 1),
        (second, 2),
    ]


def test_a_thousand_tasks_share_the_loops_pool_without_failing(redis: redis_py.Redis) -> None:
    """More tasks than connections wait for one: redis-py's plain asyncio pool would
    raise MaxConnectionsError past its cap. (On a cluster, redis-py's asyncio client
    opens more connections instead: see limitd.connection.cluster.ASYNC_MAX_CONNECTIONS.)"""

    async def many() -> list[str | None]:
        jids = await asyncio.gather(*(send.aio.perform_async(i, "x") for i in range(1000)))
        await loop_twin(redis).aclose()
        return list(jids)

    jids = asyncio.run(many())
    assert all(jids) and redis.llen(keys.of(redis).queue("webhooks")) == 1000
