"""The asyncio client: the sync client's pushes, awaitable and never blocking the loop.

A push is the same as :class:`limitd.client.Client`'s: normalize the payload, run the
client middleware chain (:meth:`~limitd.middleware.client_chain.ClientChain.ainvoke`,
the same hooks as a sync push, their Redis work awaited), check the arguments, then
one pipelined write (``SADD`` + ``LPUSH`` + ``PUBLISH`` per queue, or ``ZADD`` +
``PUBLISH`` for scheduled jobs), tried once more after a failover error. The helpers
that decide what is written are the sync client's, so both put the same thing in Redis.

The default async client (:func:`default_async_client`) is the default sync client's
twin: the same middleware chain and ``strict_args``, and each event loop's own asyncio
connections to the same Redis (:func:`limitd.connection.loop_twin`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis as redis_py
import redis.asyncio
from redis.exceptions import ResponseError

from limitd import plugins
from limitd.client import (
    Client,
    bulk_chunks,
    check_all,
    check_replicated,
    default_client,
    normalize,
    queue_write,
)
from limitd.connection import apipeline, is_failover_error, loop_twin, replication
from limitd.middleware.client_chain import ClientChain, was_written
from limitd.middleware.defaults import default_client_chain
from limitd.payload import STRICT_ARGS_MODES, Payload
from limitd.plugins import Push
from limitd.registry import registry
from limitd.spec import JobSpec

T = TypeVar("T")


class AsyncClient:
    """Enqueues jobs from async code. ``AsyncClient(redis=...)`` takes an asyncio client
    (which belongs to the loop that first uses it); without one, each loop gets its own
    twin of ``sync``'s Redis (the default client's when ``sync`` is not given either).

    Two things still use a sync client, built from the asyncio client's settings when
    ``sync`` is not given: a middleware without ``acall``, run in a worker thread, and
    a push inside a database transaction (see :meth:`push`)."""

    def __init__(
        self,
        redis: redis.asyncio.Redis | None = None,
        *,
        middleware: ClientChain | None = None,
        strict_args: str = "raise",
        sync: Client | None = None,
    ) -> None:
        if strict_args not in STRICT_ARGS_MODES:
            raise ValueError(f"strict_args must be one of {STRICT_ARGS_MODES}, not {strict_args!r}")
        if redis is None and sync is None:
            sync = default_client()
        self._redis = redis
        self._sync = sync
        self.middleware = middleware if middleware is not None else default_client_chain()
        self.strict_args = strict_args

    @classmethod
    def of(cls, client: Client) -> AsyncClient:
        """The async twin of a sync client: its middleware, its argument checks, and
        asyncio connections to its Redis."""
        return cls(sync=client, middleware=client.middleware, strict_args=client.strict_args)

    @property
    def redis(self) -> redis.asyncio.Redis:
        """The asyncio client pushes go through (the running loop's twin of the sync
        client's Redis, unless one was given)."""
        if self._redis is not None:
            return self._redis
        assert self._sync is not None  # one of the two is always set
        return loop_twin(self._sync.redis)

    def sync_client(self) -> Client:
        """The sync client for bridged middleware and held pushes, built on first use
        (no connection is made until it sends something)."""
        if self._sync is None:
            assert self._redis is not None
            self._sync = Client(
                sync_twin(self._redis), middleware=self.middleware, strict_args=self.strict_args
            )
        return self._sync

    async def push(self, item: Payload, spec: JobSpec | None = None) -> str | None:
        """Enqueue one job described by ``item`` (``class``, ``args``, options, and
        ``at`` for a scheduled job). Returns the jid, or None when a middleware halted it.

        The push is offered to the features' push gates first, as a sync push is: one
        that holds it (inside a database transaction, until the commit) gets it as the
        sync client's push, run later in the thread that commits, with no event loop."""
        spec = spec or registry.resolve(str(item.get("class")))
        payload = normalize(item, spec)
        if plugins.has_push_gates():
            run = functools.partial(self._sync_push, spec, payload)
            push = Push([payload], run, self.strict_args)
            if plugins.gate_push(push):
                return push.ran[0] if push.ran else str(payload["jid"])
        pushed = await self.middleware.ainvoke(
            spec, payload, self.redis, self._push_one, sync_redis=self._sync_redis
        )
        return pushed["jid"] if pushed else None

    async def push_bulk(
        self,
        item: Payload,
        args_list: Sequence[list[Any]],
        *,
        batch_size: int = 1000,
        spec: JobSpec | None = None,
    ) -> list[str | None]:
        """Enqueue one job per entry of ``args_list``, each through the middleware chain
        on its own, written in chunks of ``batch_size``. Returns jids in input order.
        Each chunk is offered to the push gates as one push, like :meth:`push`."""
        spec = spec or registry.resolve(str(item.get("class")))
        jids: list[str | None] = []
        for chunk in bulk_chunks(item, args_list, batch_size, spec):
            push = None
            if plugins.has_push_gates():
                run = functools.partial(self._sync_push_chunk, spec, chunk)
                push = Push(chunk, run, self.strict_args)
            if push is not None and plugins.gate_push(push):
                jids += push.ran[0] if push.ran else [payload["jid"] for payload in chunk]
            else:
                jids += await self._push_chunk(spec, chunk)
        return jids

    def _sync_push(self, spec: JobSpec | None, payload: Payload) -> str | None:
        """A held push, run by the sync client when its gate lets it go."""
        return self.sync_client().push_now(spec, payload)

    def _sync_push_chunk(self, spec: JobSpec | None, chunk: list[Payload]) -> list[str | None]:
        """A held chunk of a bulk push, run by the sync client when its gate lets it go."""
        return self.sync_client().push_chunk_now(spec, chunk)

    async def _push_chunk(self, spec: JobSpec | None, chunk: list[Payload]) -> list[str | None]:
        """As ``Client.push_chunk_now``: each job through the chain, one write for those it
        kept; if anything raises, middleware give back what they reserved for the chunk."""
        redis = self.redis
        try:
            steps = self.middleware.for_chunk(spec, chunk[0], redis) if chunk else []
            await self.middleware.aprepare_bulk(spec, chunk, redis, self._sync_redis)
            kept = [
                await self.middleware.ainvoke(
                    spec, payload, redis, _keep, sync_redis=self._sync_redis, steps=steps
                )
                for payload in chunk
            ]
            await self.raw_push(payload for payload in kept if payload)
        except BaseException as error:
            if not was_written(error):  # pushed all the same: the reservations stand
                await self.middleware.aabandon_bulk(spec, chunk, redis, self._sync_redis)
            raise
        return [payload["jid"] if payload else None for payload in kept]

    async def raw_push(self, payloads: Iterable[Payload]) -> None:
        """Write payloads that already went through the middleware chain."""
        batch = list(payloads)
        check_all(batch, self.strict_args)
        if batch:
            redis = self.redis
            await retry_on_failover(redis, lambda: _write(redis, batch))

    async def _push_one(self, payload: Payload) -> Payload:
        await self.raw_push([payload])
        return payload

    def _sync_redis(self) -> redis_py.Redis:
        return self.sync_client().redis


async def _write(redis: redis.asyncio.Redis, payloads: list[Payload]) -> None:
    pipe = apipeline(redis)
    queue_write(pipe, payloads)
    wait = replication.of(redis)
    if wait is not None:
        pipe.wait(wait.replicas, wait.timeout_ms)
    replies = await pipe.execute()
    if wait is not None:
        check_replicated(replies, wait, payloads)


async def _keep(payload: Payload) -> Payload:
    """End of the chain for bulk pushes: the chunk is written once, after the loop."""
    return payload


async def retry_on_failover(conn: redis.asyncio.Redis, operation: Callable[[], Awaitable[T]]) -> T:
    """``limitd.connection.retry_on_failover`` on an asyncio client: after a failover error,
    drop the pool's sockets (they point at the old primary) and try exactly once more."""
    try:
        return await operation()
    except ResponseError as exc:
        if not is_failover_error(exc):
            raise
        await conn.connection_pool.disconnect()
        return await operation()


_SYNC_CONNECTIONS = {
    redis.asyncio.Connection: redis_py.Connection,
    redis.asyncio.UnixDomainSocketConnection: redis_py.UnixDomainSocketConnection,
    redis.asyncio.SSLConnection: redis_py.SSLConnection,
}


def sync_twin(client: redis.asyncio.Redis) -> redis_py.Redis:
    """A sync client for the server an asyncio client talks to, with its settings: the
    reverse of :func:`limitd.connection.async_twin`, for the few things that run in a worker
    thread."""
    pool = client.connection_pool
    kind = _SYNC_CONNECTIONS.get(pool.connection_class)
    if kind is None:
        raise TypeError(f"no sync connection for {pool.connection_class.__name__}")
    # The asyncio pool's retry policy drives asyncio sleeps: a sync connection given it
    # never connects. The sync one gets redis-py's own default instead.
    settings = {k: v for k, v in pool.connection_kwargs.items() if k not in _ASYNC_ONLY}
    return redis_py.Redis(
        connection_pool=redis_py.ConnectionPool(connection_class=kind, **settings)
    )


_ASYNC_ONLY = frozenset({"retry"})


def default_async_client() -> AsyncClient:
    """The async twin of :func:`limitd.client.default_client` (whichever client that is
    now: ``set_default_client`` and ``configure`` apply to async pushes too). Building
    the default sync client the first time may read config files; nothing else here
    does I/O."""
    return AsyncClient.of(default_client())


def async_client_for(client: Client | AsyncClient | None) -> AsyncClient:
    """The async client to push with: the one given, a sync one's twin, or the default."""
    if isinstance(client, AsyncClient):
        return client
    return AsyncClient.of(client) if client is not None else default_async_client()
