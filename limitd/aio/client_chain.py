"""A client middleware chain run on the event loop.

The entries are the ones the sync client runs (a :class:`~limitd.middleware.chain.ClientChain`),
in the same order, each in one of two ways:

- an entry with ``async def acall(self, spec, payload, redis, call_next)`` is awaited:
  ``redis`` is a ``redis.asyncio`` client and ``call_next`` a coroutine function
  (``return await call_next(payload)``; returning None halts the push). The shipped
  middleware (batches, unique jobs, tenant fairness) have one, and so should any
  middleware that talks to Redis on a busy loop. Bulk hooks: ``aprepare_bulk`` and
  ``aabandon_bulk``, with the arguments of ``prepare_bulk`` and ``abandon_bulk``.
- an entry without ``acall`` (a middleware written for the sync client) still runs, and
  still without blocking the loop: its sync ``__call__`` runs in a worker thread
  (``asyncio.to_thread``) with a *sync* Redis client, and the ``call_next`` it gets
  runs the rest of the chain back on the loop and waits there for the result
  (``asyncio.run_coroutine_threadsafe(...).result()``). Its ``prepare_bulk`` /
  ``abandon_bulk`` run in a worker thread too, each call possibly in another thread: a
  middleware that hands state from ``prepare_bulk`` to ``__call__`` in a
  ``threading.local`` should keep it on the payloads or the instance instead.
  This costs a thread hop per such middleware and push.

This module sits in the middleware layer: the middleware import its helpers
(:func:`acall_next_or_undo`, :func:`arun_all`) for their ``acall``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import redis as redis_py
import redis.asyncio
from redis.exceptions import NoScriptError

from limitd import cluster
from limitd.middleware.chain import ClientChain, log_abandon_failure
from limitd.payload import Payload
from limitd.redis import ScriptCall
from limitd.replication import NotReplicated
from limitd.spec import JobSpec

AsyncPushNext = Callable[[Payload], Coroutine[Any, Any, "Payload | None"]]
SyncRedis = Callable[[], redis_py.Redis]  # built only when a bridged middleware needs one


async def ainvoke(
    chain: ClientChain,
    spec: JobSpec | None,
    payload: Payload,
    redis: redis.asyncio.Redis,
    push: AsyncPushNext,
    *,
    sync_redis: SyncRedis,
) -> Payload | None:
    """Run ``payload`` through every middleware of ``chain``, then ``push`` it."""
    entries = list(chain)

    async def step(index: int, current: Payload) -> Payload | None:
        if index == len(entries):
            return await push(current)
        middleware = entries[index]
        call_next = functools.partial(step, index + 1)
        acall = getattr(middleware, "acall", None)
        if acall is not None:
            return await acall(spec, current, redis, call_next)
        return await _bridged(middleware, spec, current, sync_redis(), call_next)

    return await step(0, payload)


async def _bridged(
    middleware: Any,
    spec: JobSpec | None,
    payload: Payload,
    sync_redis: redis_py.Redis,
    call_next: AsyncPushNext,
) -> Payload | None:
    """A sync middleware in a worker thread, its ``call_next`` run on this loop."""
    loop = asyncio.get_running_loop()

    def call_next_from_thread(current: Payload) -> Payload | None:
        return asyncio.run_coroutine_threadsafe(call_next(current), loop).result()

    pushed: Payload | None = await asyncio.to_thread(
        middleware, spec, payload, sync_redis, call_next_from_thread
    )
    return pushed


async def aprepare_bulk(
    chain: ClientChain,
    spec: JobSpec | None,
    payloads: list[Payload],
    redis: redis.asyncio.Redis,
    sync_redis: SyncRedis,
) -> None:
    """Each middleware's bulk preparation (see ``ClientChain.prepare_bulk``)."""
    for middleware in chain:
        hook = getattr(middleware, "aprepare_bulk", None)
        if hook is not None:
            await hook(spec, payloads, redis)
            continue
        sync_hook = getattr(middleware, "prepare_bulk", None)
        if sync_hook is not None:
            await asyncio.to_thread(sync_hook, spec, payloads, sync_redis())


async def aabandon_bulk(
    chain: ClientChain,
    spec: JobSpec | None,
    payloads: list[Payload],
    redis: redis.asyncio.Redis,
    sync_redis: SyncRedis,
) -> None:
    """Each middleware gives back what it reserved for a chunk that was not written
    (see ``ClientChain.abandon_bulk``): each runs even if another fails; failures are
    logged, the caller re-raises the original error."""
    for middleware in chain:
        hook = getattr(middleware, "aabandon_bulk", None)
        sync_hook = getattr(middleware, "abandon_bulk", None)
        if hook is None and sync_hook is None:
            continue
        try:
            if hook is not None:
                await hook(spec, payloads, redis)
            elif sync_hook is not None:
                await asyncio.to_thread(sync_hook, spec, payloads, sync_redis())
        except Exception:
            log_abandon_failure(middleware, payloads)


async def acall_next_or_undo(
    call_next: AsyncPushNext, payload: Payload, undo: Callable[[], Awaitable[object]]
) -> Payload | None:
    """``limitd.middleware.chain.call_next_or_undo`` for ``acall``: run the rest of the
    chain, and await ``undo`` if it halts the push or raises."""
    try:
        pushed = await call_next(payload)
    except NotReplicated:
        raise
    except BaseException:
        await undo()
        raise
    if pushed is None:
        await undo()
    return pushed


async def arun_all(conn: redis.asyncio.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Several script calls in one round trip (a pipeline), their replies in order. A
    call the server did not run for want of its script (NOSCRIPT, after a restart) is
    made again on its own once the script is loaded; another error is raised."""
    if cluster.is_async_cluster(conn):  # their keys may be on several shards
        return [await call.script.acall(conn, call.keys, call.all_args()) for call in calls]
    pipe = conn.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.all_args())
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    for index, (call, reply) in enumerate(zip(calls, replies, strict=True)):
        if isinstance(reply, NoScriptError):
            replies[index] = await call.script.acall(conn, call.keys, call.all_args())
        elif isinstance(reply, Exception):
            raise reply
    return replies
