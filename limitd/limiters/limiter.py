"""``limitd.Limiter``: limits in job code (or any code) on a shared Redis.

::

    stripe = limitd.Limiter.concurrent("stripe", 5, lock_timeout=30, wait_timeout=5)
    shopify = limitd.Limiter.window("shopify", 100, "minute")

    @limitd.job()
    def sync(account_id):
        with stripe.within_limit():
            ...

``within_limit`` waits up to ``wait_timeout`` seconds for room, then raises
:class:`OverLimit`. It does not poll: the check's script says how long until room can
appear (the oldest call leaving the window, the next interval, the leaky bucket
draining one call, the oldest lock expiring) and the caller sleeps exactly that, capped
by its deadline; a concurrent limiter's waiters also block on its wake list (BLPOP),
to which every release pushes an entry, so they wake when a slot is given back.

In ``async def`` code, ``async with limiter.aio.within_limit():`` does the same without
blocking the event loop (see :mod:`limitd.limiters.aio`).

Defining a limiter touches nothing in Redis: limiters are cheap to build per call, and
their names may hold anything (``f"stripe-{account_id}"``). Each is on the default
client's Redis (the capsule's, inside a job) unless given ``redis=``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from limitd import clock, keys
from limitd.client import default_client
from limitd.limiters import store
from limitd.limiters.aio import AsyncLimiter
from limitd.limiters.store import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_TTL,
    DEFAULT_WAIT_TIMEOUT,
    Definition,
    OverLimit,
)
from limitd.limiters.tries import Tries
from limitd.middleware.work import RedisClient

MAX_BLOCK = 5.0  # one BLPOP at most this long: under the connection's socket timeout


class Limiter:
    """One named limit, checked atomically in Redis by every process that uses it.
    Build one with :meth:`concurrent`, :meth:`bucket`, :meth:`window` or :meth:`leaky`."""

    def __init__(
        self,
        definition: Definition,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        redis: RedisClient | None = None,
    ) -> None:
        self.definition = definition
        self.wait_timeout = store.positive_seconds(
            definition.name, "wait_timeout", wait_timeout, zero=True
        )
        self._redis = redis

    @classmethod
    def concurrent(
        cls,
        name: str,
        count: int,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        ttl: float = DEFAULT_TTL,
        redis: RedisClient | None = None,
    ) -> Limiter:
        """At most ``count`` holders at once; a holder's slot is freed after
        ``lock_timeout`` seconds even if it never leaves its block (killed process)."""
        lock = store.positive_seconds(name, "lock_timeout", lock_timeout)
        return cls(Definition(name, "concurrent", count, lock, ttl), wait_timeout, redis)

    @classmethod
    def bucket(
        cls,
        name: str,
        count: int,
        interval: float | str,
        *,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        ttl: float = DEFAULT_TTL,
        redis: RedisClient | None = None,
    ) -> Limiter:
        """``count`` calls per calendar interval (UTC): the count resets when a new
        second, minute, hour or day starts."""
        return cls._per_interval(
            "bucket", name, count, interval, wait_timeout=wait_timeout, ttl=ttl, redis=redis
        )

    @classmethod
    def window(
        cls,
        name: str,
        count: int,
        interval: float | str,
        *,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        ttl: float = DEFAULT_TTL,
        redis: RedisClient | None = None,
    ) -> Limiter:
        """``count`` calls in any rolling ``interval`` (a sliding window)."""
        return cls._per_interval(
            "window", name, count, interval, wait_timeout=wait_timeout, ttl=ttl, redis=redis
        )

    @classmethod
    def leaky(
        cls,
        name: str,
        count: int,
        interval: float | str,
        *,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        ttl: float = DEFAULT_TTL,
        redis: RedisClient | None = None,
    ) -> Limiter:
        """A burst of ``count`` calls, then ``count`` per ``interval`` evenly spread."""
        return cls._per_interval(
            "leaky", name, count, interval, wait_timeout=wait_timeout, ttl=ttl, redis=redis
        )

    @classmethod
    def _per_interval(
        cls,
        kind: str,
        name: str,
        count: int,
        interval: float | str,
        *,
        wait_timeout: float,
        ttl: float,
        redis: RedisClient | None,
    ) -> Limiter:
        """The three kinds that count calls per interval differ only in their script."""
        seconds = store.parse_interval(name, interval)
        return cls(Definition(name, kind, count, seconds, ttl), wait_timeout, redis)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def kind(self) -> str:
        return self.definition.kind

    def __repr__(self) -> str:
        d = self.definition
        return f"<Limiter {d.kind} {d.name!r} {d.limit} per {d.period:g}s>"

    @property
    def aio(self) -> AsyncLimiter:
        """This limiter for ``async def`` code: ``async with limiter.aio.within_limit():``
        waits with ``asyncio.sleep`` and the asyncio Redis client, never blocking the
        event loop, and shares its slots and counts with the sync form."""
        return AsyncLimiter(self)

    def sync_redis(self) -> Any:
        """The (sync) client this limiter's checks use: its own ``redis=``, else the
        default client's, looked up at each check (a capsule sets it in its process)."""
        return self._redis if self._redis is not None else default_client().redis

    def tries(self, token: str, layout: keys.KeyLayout) -> Tries:
        """A new check's tries for room, held under ``token``, on a connection of
        ``layout`` (both forms use this)."""
        return Tries(self.definition, self.wait_timeout, token, MAX_BLOCK, layout)

    @contextmanager
    def within_limit(self) -> Iterator[None]:
        """Run the block once there is room (waiting up to ``wait_timeout``), else raise
        :class:`OverLimit`. Also a decorator: ``@limiter.within_limit()``."""
        redis = self.sync_redis()
        token = uuid.uuid4().hex
        self._take(redis, token)
        if self.kind != "concurrent":
            yield
            return
        started = clock.monotonic()
        try:
            yield
        finally:
            store.release(redis, self.definition, token, clock.monotonic() - started)

    def _take(self, redis: RedisClient, token: str) -> None:
        """Try until taken or the deadline passes, pausing as :class:`Tries` says."""
        tries = self.tries(token, keys.of(redis))
        while True:
            script, script_keys, args = tries.call()
            outcome = tries.after(script(redis, script_keys, args))
            if outcome is None:
                return
            if isinstance(outcome, OverLimit):
                store.record_over_limit(redis, self.definition)
                raise outcome
            if outcome.wake_key is None:
                time.sleep(outcome.seconds)
            else:
                redis.blpop([outcome.wake_key], timeout=outcome.seconds)


__all__ = ["Limiter", "OverLimit"]
