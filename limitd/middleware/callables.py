"""Middleware written as plain callables, the form the README documents for app code.

Such a middleware wraps the rest of the chain itself (``__call__(spec, payload, redis
or queue, call_next)``) and may define the optional methods of that form: ``acall``
(the same, awaited on an event loop), ``prepare_bulk`` / ``abandon_bulk`` and their
``a`` forms on the client side, ``settled`` and ``concerns`` on the server side. Their
presence is looked up once, when the chain changes, into the typed records below; the
chains then call what a type checker sees. One without ``acall`` runs on a worker
thread in async code, its ``call_next`` handed back to the loop: it works unchanged,
but holds a thread for as long as it runs. The capsule warns about such a server
middleware, unless it comes wrapped in :class:`OnThread`: a sync middleware declared
for that (the app's, through ``limitd.configure_server``), whose cost is documented.

The shipped middleware subclass :mod:`limitd.middleware.base` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from limitd.connection import ScriptCall
from limitd.payload import Payload
from limitd.spec import JobSpec

AsyncPushNext = Callable[[Payload], Coroutine[Any, Any, "Payload | None"]]
Hook = Callable[..., Any]


def _optional(middleware: object, name: str) -> Hook | None:
    """The one place where the callable form's optional methods are looked up."""
    found = getattr(middleware, name, None)
    return found if callable(found) else None


class CallableClient:
    """A client middleware of the callable form, with its optional methods."""

    def __init__(self, middleware: Callable[..., Payload | None]) -> None:
        self.middleware = middleware
        self.acall = _optional(middleware, "acall")
        self.prepare_bulk = _optional(middleware, "prepare_bulk")
        self.abandon_bulk = _optional(middleware, "abandon_bulk")
        self.aprepare_bulk = _optional(middleware, "aprepare_bulk")
        self.aabandon_bulk = _optional(middleware, "aabandon_bulk")

    async def ainvoke(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: Any,
        call_next: AsyncPushNext,
        sync_redis: Callable[[], Any],
    ) -> Payload | None:
        """Its ``acall`` awaited, or its ``__call__`` on a worker thread with a sync
        Redis, its ``call_next`` run back on this loop."""
        if self.acall is not None:
            pushed: Payload | None = await self.acall(spec, payload, redis, call_next)
            return pushed
        loop = asyncio.get_running_loop()

        def call_next_from_thread(current: Payload) -> Payload | None:
            return asyncio.run_coroutine_threadsafe(call_next(current), loop).result()

        return await asyncio.to_thread(
            self.middleware, spec, payload, sync_redis(), call_next_from_thread
        )

    async def abulk(
        self,
        hook: Hook | None,
        sync_hook: Hook | None,
        args: tuple[JobSpec | None, list[Payload]],
        redis: Any,
        sync_redis: Callable[[], Any],
    ) -> None:
        """A bulk hook on the loop: its async form awaited, or its sync form on a worker
        thread (each call possibly on another thread)."""
        if hook is not None:
            await hook(*args, redis)
        elif sync_hook is not None:
            await asyncio.to_thread(sync_hook, *args, sync_redis())


class OnThread:
    """A sync server middleware of the callable form that async jobs run on a worker
    thread by design, not for want of an ``acall``: its ``__call__`` becomes its
    ``acall`` there, so the capsule does not warn about it. Calls (and its optional
    methods) go to ``middleware``."""

    __slots__ = ("middleware",)

    def __init__(self, middleware: Callable[..., Any]) -> None:
        self.middleware = middleware

    def __call__(self, *args: Any) -> Any:
        return self.middleware(*args)


class CallableServer:
    """A server middleware of the callable form, with its optional methods."""

    def __init__(self, middleware: Callable[..., Any]) -> None:
        threaded = isinstance(middleware, OnThread)
        inner = middleware.middleware if isinstance(middleware, OnThread) else middleware
        self.middleware = inner
        self.acall = _optional(inner, "acall")
        if self.acall is None and threaded:
            self.acall = self.on_worker_thread
        self.concerns = _optional(inner, "concerns")
        self.settled = _optional(inner, "settled")

    async def ainvoke(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        call_next: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Its ``acall`` awaited, or its ``__call__`` on a worker thread."""
        if self.acall is not None:
            return await self.acall(spec, payload, queue, call_next)
        return await self.on_worker_thread(spec, payload, queue, call_next)

    async def on_worker_thread(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        call_next: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Its ``__call__`` on a worker thread, ``call_next`` run back on this loop."""
        loop = asyncio.get_running_loop()

        def call_next_on_loop() -> Any:
            return asyncio.run_coroutine_threadsafe(call_next(), loop).result()  # type: ignore[arg-type]

        return await asyncio.to_thread(self.middleware, spec, payload, queue, call_next_on_loop)

    def settle(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> ScriptCall | list[ScriptCall] | None:
        if self.settled is None:
            return None
        returned: ScriptCall | list[ScriptCall] | None = self.settled(
            spec, payload, queue, outcome, error
        )
        return returned
