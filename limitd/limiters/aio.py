"""``limiter.aio``: a limiter in ``async def`` code, without blocking the event loop.

::

    stripe = limitd.Limiter.concurrent("stripe", 5, lock_timeout=30, wait_timeout=5)

    @limitd.job()
    async def charge(account_id):
        async with stripe.aio.within_limit():
            ...

The sync ``within_limit`` sleeps with ``time.sleep`` and blocks on a sync connection:
in an async job that would freeze every job on the loop. This form makes the same
script calls on the loop's asyncio twin of the limiter's client
(:func:`limitd.connection.loop_twin`), sleeps with ``asyncio.sleep`` and blocks on the wake
list with an asyncio BLPOP; what to do after each try is decided by the same
:class:`~limitd.limiters.tries.Tries` as the sync form, so both forms admit the same
calls, share the same slots and counts, and raise the same ``OverLimit``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from limitd import clock, keys
from limitd.connection import apipeline, loop_twin
from limitd.limiters import store
from limitd.limiters.store import Definition, OverLimit

if TYPE_CHECKING:  # the limiter module imports this one
    from limitd.limiters.limiter import Limiter


class AsyncLimiter:
    """A :class:`~limitd.limiters.limiter.Limiter` seen from async code (its ``aio``)."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    @property
    def definition(self) -> Definition:
        return self.limiter.definition

    def __repr__(self) -> str:
        return f"<async {self.limiter!r}>"

    @asynccontextmanager
    async def within_limit(self) -> AsyncIterator[None]:
        """Run the block once there is room (waiting up to ``wait_timeout``, letting the
        loop run meanwhile), else raise ``OverLimit``. Also decorates ``async def``."""
        redis = loop_twin(self.limiter.sync_redis())
        token = uuid.uuid4().hex
        await self._take(redis, token)
        if self.definition.kind != "concurrent":
            yield
            return
        started = clock.monotonic()
        try:
            yield
        finally:
            held = clock.monotonic() - started
            script, script_keys, args = store.release_call(
                keys.of(redis), self.definition, token, held
            )
            await script.acall(redis, script_keys, args)

    async def _take(self, redis: Any, token: str) -> None:
        """The sync form's loop (``Limiter._take``), with awaited I/O."""
        tries = self.limiter.tries(token, keys.of(redis))
        while True:
            script, script_keys, args = tries.call()
            outcome = tries.after(await script.acall(redis, script_keys, args))
            if outcome is None:
                return
            if isinstance(outcome, OverLimit):
                await _record_over_limit(redis, self.definition)
                raise outcome
            if outcome.wake_key is None:
                await asyncio.sleep(outcome.seconds)
            else:
                await redis.blpop([outcome.wake_key], timeout=outcome.seconds)


async def _record_over_limit(redis: Any, definition: Definition) -> None:
    pipe = apipeline(redis)
    store.queue_over_limit(pipe, definition)
    await pipe.execute()
