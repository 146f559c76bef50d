"""The client middleware chain: every push passes it, on the caller's thread
(:meth:`ClientChain.invoke`) or on an event loop (:meth:`ClientChain.ainvoke`), the two
runners differing only by ``await`` (see :mod:`limitd.middleware.base` for the hooks).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from limitd import keys
from limitd.connection.replication import NotReplicated
from limitd.middleware.base import ClientMiddleware
from limitd.middleware.callables import AsyncPushNext, CallableClient
from limitd.middleware.chain import Chain
from limitd.middleware.work import AsyncRedisClient, RedisClient, arun_work, run_work
from limitd.payload import Payload
from limitd.spec import JobSpec

log = logging.getLogger("limitd.client")

PushNext = Callable[[Payload], "Payload | None"]
SyncRedis = Callable[[], Any]  # built only when a callable middleware needs one


WRITTEN_MARK = "_limitd_raised_after_write"


def raised_after_write(error: BaseException) -> BaseException:
    """Mark ``error`` as raised after the push was written (the inline testing mode runs a
    job while its push is written, and the job's own error comes up through the push):
    the reservations of the push stand, as they do after a ``NotReplicated``. Returns
    ``error``."""
    with contextlib.suppress(AttributeError):  # a class with __slots__ cannot be marked
        setattr(error, WRITTEN_MARK, True)
    return error


def was_written(error: BaseException) -> bool:
    """Whether the push that raised ``error`` was written all the same (see
    :func:`raised_after_write`; a push replicas did not confirm in time was written)."""
    return isinstance(error, NotReplicated) or getattr(error, WRITTEN_MARK, False) is True


def call_next_or_undo(
    call_next: PushNext, payload: Payload, undo: Callable[[], object]
) -> Payload | None:
    """For client middleware that reserve something before the push (a unique lock, a
    place in a batch): run the rest of the chain, and ``undo`` the reservation if it
    halts the push or raises (unless the push was written all the same:
    :func:`was_written`)."""
    try:
        pushed = call_next(payload)
    except BaseException as error:
        if not was_written(error):
            undo()
        raise
    if pushed is None:
        undo()
    return pushed


async def acall_next_or_undo(
    call_next: AsyncPushNext, payload: Payload, undo: Callable[[], Awaitable[object]]
) -> Payload | None:
    """:func:`call_next_or_undo` on an event loop."""
    try:
        pushed = await call_next(payload)
    except BaseException as error:
        if not was_written(error):
            await undo()
        raise
    if pushed is None:
        await undo()
    return pushed


def log_abandon_failure(middleware: Any, payloads: list[Payload]) -> None:
    """An ``abandon_bulk`` that raised: logged with the middleware and the jobs' class,
    and not raised, so the others still give back theirs and the push's own error goes
    on. Call from an ``except`` block (the traceback is logged)."""
    log.exception(
        "%s could not undo its reservations for %d jobs of class=%s",
        type(middleware).__name__,
        len(payloads),
        payloads[0].get("class") if payloads else None,
    )


ClientEntry = ClientMiddleware | CallableClient


class PushStep:
    """One entry as a push calls it: which of its push hooks are its own, so the no-op
    defaults are not called for every job. A plain class with slots: read per push."""

    __slots__ = ("entry", "pushes", "typed", "undoes", "wrapped")

    def __init__(self, entry: ClientEntry) -> None:
        self.entry = entry
        self.wrapped: CallableClient | None = None
        self.typed: ClientMiddleware = ClientMiddleware()  # a no-op for a callable one
        self.pushes = self.undoes = False
        if isinstance(entry, CallableClient):
            self.wrapped = entry
            return
        self.typed = entry
        kind, base = type(entry), ClientMiddleware
        self.pushes = kind.push_work is not base.push_work
        self.undoes = kind.undo_work is not base.undo_work


class ClientChain(Chain):
    """The middleware every push passes, run by :meth:`invoke` (sync) or :meth:`ainvoke`
    (on an event loop)."""

    def __init__(self, entries: list[Any] | None = None) -> None:
        super().__init__(entries)
        self._plans: tuple[int, dict[keys.KeyLayout, list[PushStep]]] = (-1, {})
        self._last: tuple[Any, list[PushStep]] = (None, [])  # the last client and its plan

    def _steps_now(self, redis: Any) -> list[PushStep]:
        """The entries for a push through ``redis``: each middleware as it names keys in
        that connection's layout (see ``ClientMiddleware.for_layout``)."""
        version, plans = self._plans
        if version != self._version:
            plans = {}
            self._plans = (self._version, plans)
        elif self._last[0] is redis:  # the common case: one client, push after push
            return self._last[1]
        layout = keys.of(redis)
        plan = plans.get(layout)
        if plan is None:
            plan = plans[layout] = [
                PushStep(
                    m.for_layout(layout) if isinstance(m, ClientMiddleware) else CallableClient(m)
                )
                for m in self
            ]
        self._last = (redis, plan)
        return plan

    def _entries_now(self, redis: Any) -> list[ClientEntry]:
        return [step.entry for step in self._steps_now(redis)]

    def for_chunk(self, spec: JobSpec | None, sample: Payload, redis: Any) -> list[PushStep]:
        """The entries a bulk chunk's jobs pass, judged once by one of them (``sample``:
        they share class and options): those whose ``concerns`` is False are left out.
        A chunk of jobs that use no feature then passes no middleware at all."""
        return [
            step
            for step in self._steps_now(redis)
            if step.wrapped is not None or step.typed.concerns(spec, sample)
        ]

    def invoke(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: RedisClient,
        push: PushNext,
        steps: list[PushStep] | None = None,
    ) -> Payload | None:
        """Run ``payload`` through every middleware (or ``steps``, from
        :meth:`for_chunk`), then ``push`` it."""
        if steps is None:
            steps = self._steps_now(redis)
        elif not steps:
            return push(payload)
        count = len(steps)

        # Entries that only look at the payload (most, for most jobs) are walked in a
        # loop; the chain nests (a frame per entry) only where an entry must see what
        # the rest did: a callable middleware, or one that reserved something to undo.
        def step(index: int, current: Payload) -> Payload | None:
            while index < count:
                this = steps[index]
                index += 1
                if this.wrapped is not None:
                    return this.wrapped.middleware(
                        spec, current, redis, functools.partial(step, index)
                    )
                entry = this.typed
                if this.pushes:
                    work = entry.push_work(spec, current)
                    if work is not None and not entry.admit(
                        spec, current, run_work(redis, work)[0]
                    ):
                        return None
                undo = entry.undo_work(spec, current) if this.undoes else None
                if undo is not None:
                    return call_next_or_undo(
                        functools.partial(step, index),
                        current,
                        functools.partial(run_work, redis, undo),
                    )
            return push(current)

        return step(0, payload)

    async def ainvoke(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: AsyncRedisClient,
        push: AsyncPushNext,
        *,
        sync_redis: SyncRedis,
        steps: list[PushStep] | None = None,
    ) -> Payload | None:
        """:meth:`invoke` on the running loop (``sync_redis``: for callable middleware
        without ``acall``, run on a worker thread)."""
        if steps is None:
            steps = self._steps_now(redis)
        elif not steps:
            return await push(payload)
        count = len(steps)

        async def step(index: int, current: Payload) -> Payload | None:  # as in invoke
            while index < count:
                this = steps[index]
                index += 1
                if this.wrapped is not None:
                    return await this.wrapped.ainvoke(
                        spec, current, redis, functools.partial(step, index), sync_redis
                    )
                entry = this.typed
                if this.pushes:
                    work = entry.push_work(spec, current)
                    if work is not None and not entry.admit(
                        spec, current, (await arun_work(redis, work))[0]
                    ):
                        return None
                undo = entry.undo_work(spec, current) if this.undoes else None
                if undo is not None:
                    return await acall_next_or_undo(
                        functools.partial(step, index),
                        current,
                        functools.partial(arun_work, redis, undo),
                    )
            return await push(current)

        return await step(0, payload)

    def prepare_bulk(
        self, spec: JobSpec | None, payloads: list[Payload], redis: RedisClient
    ) -> None:
        """Before a bulk chunk goes through the chain job by job, let each middleware do
        its Redis work for the whole chunk in one round trip. Each job still passes
        every middleware on its own afterwards."""
        for entry in self._entries_now(redis):
            if isinstance(entry, CallableClient):
                if entry.prepare_bulk is not None:
                    entry.prepare_bulk(spec, payloads, redis)
                continue
            work = entry.bulk_work(spec, payloads)
            if work:
                run_work(redis, work)

    async def aprepare_bulk(
        self,
        spec: JobSpec | None,
        payloads: list[Payload],
        redis: AsyncRedisClient,
        sync_redis: SyncRedis,
    ) -> None:
        """:meth:`prepare_bulk` on the running loop."""
        for entry in self._entries_now(redis):
            if isinstance(entry, CallableClient):
                hooks = (entry.aprepare_bulk, entry.prepare_bulk)
                await entry.abulk(*hooks, (spec, payloads), redis, sync_redis)
                continue
            work = entry.bulk_work(spec, payloads)
            if work:
                await arun_work(redis, work)

    def abandon_bulk(
        self, spec: JobSpec | None, payloads: list[Payload], redis: RedisClient
    ) -> None:
        """A bulk chunk was not written (a middleware or the write raised): let each
        middleware give back what it reserved for its jobs, as a single push's do when
        the push raises. Each runs even if another fails; their failures are logged, the
        caller re-raises the original error."""
        for entry in self._entries_now(redis):
            try:
                if isinstance(entry, CallableClient):
                    if entry.abandon_bulk is not None:
                        entry.abandon_bulk(spec, payloads, redis)
                    continue
                work = entry.abandon_work(spec, payloads)
                if work:
                    run_work(redis, work)
            except Exception:
                log_abandon_failure(_named(entry), payloads)

    async def aabandon_bulk(
        self,
        spec: JobSpec | None,
        payloads: list[Payload],
        redis: AsyncRedisClient,
        sync_redis: SyncRedis,
    ) -> None:
        """:meth:`abandon_bulk` on the running loop."""
        for entry in self._entries_now(redis):
            try:
                if isinstance(entry, CallableClient):
                    hooks = (entry.aabandon_bulk, entry.abandon_bulk)
                    await entry.abulk(*hooks, (spec, payloads), redis, sync_redis)
                    continue
                work = entry.abandon_work(spec, payloads)
                if work:
                    await arun_work(redis, work)
            except Exception:
                log_abandon_failure(_named(entry), payloads)


def _named(entry: ClientEntry) -> object:
    """The middleware as its author wrote it (for logs)."""
    return entry.middleware if isinstance(entry, CallableClient) else entry
