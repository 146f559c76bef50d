"""Middleware chains: the client chain wraps every push, the server chain wraps every
perform.

A middleware is any callable object. Each one receives the job and a ``call_next``
function and decides what happens: change the payload and call on, run code before and
after ``call_next``, or stop the job by not calling it.

Client middleware::

    def __call__(self, spec, payload, redis, call_next):
        payload["queue"] = "low"          # may change the payload or its queue
        return call_next(payload)         # returning None halts the push

Server middleware::

    def __call__(self, spec, payload, queue, call_next):
        return call_next()                # perform (and the rest of the chain)

    def settled(self, spec, payload, queue, outcome, error):   # optional
        ...  # the job's fate is recorded: "done", "retry", "dead", "discarded"
             # or "rescheduled" (put back in schedule by a middleware: will run again)
        return SCRIPT.later(keys, args)   # optional: Redis work to send with the ack

    def concerns(self, payload):                              # optional
        return "bid" in payload   # False: skipped for this job, call and settled alike

Async jobs (``async def``) pass the same chain on the capsule's event loop. There a
middleware's ``acall`` is awaited when it has one::

    async def acall(self, spec, payload, queue, call_next):
        return await call_next()

and one without runs its ``__call__`` on a worker thread, its ``call_next`` handed back
to the loop: it works unchanged, but holds a thread for as long as the job runs.

``concerns`` lets a feature stay out of the way of jobs that do not use it: every job
passes the server chain, and a middleware that only calls on costs each of them a frame
and a closure for nothing.

``settled`` exists because a middleware around ``perform`` sees an exception but not
what becomes of the job: the retry decision is taken after the chain unwinds. The
script calls it returns (``limitd.redis.ScriptCall``, one or a list) are made before the
job is acknowledged, in the same round trip as the acknowledgement when the fetch can
(the limit fetch does): bookkeeping such as a batch's costs no round trip of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from limitd.payload import Payload
from limitd.redis import ScriptCall
from limitd.replication import NotReplicated
from limitd.spec import JobSpec

log = logging.getLogger("limitd.client")

PushNext = Callable[[Payload], "Payload | None"]
ClientMiddleware = Callable[["JobSpec | None", Payload, Any, PushNext], "Payload | None"]
ServerMiddleware = Callable[["JobSpec", Payload, str, Callable[[], Any]], Any]


class Rescheduled(Exception):
    """Raised by a server middleware that has itself put the job back in ``schedule``
    (a limiter's ``OverLimit``): the executor records the outcome ``rescheduled``, which
    is neither a success nor a failure; ``settled`` middleware leave such a job's state
    (its batch, its unique lock) as it is, since it will run again."""


def call_next_or_undo(
    call_next: PushNext, payload: Payload, undo: Callable[[], object]
) -> Payload | None:
    """For client middleware that reserve something before the push (a unique lock, a
    place in a batch): run the rest of the chain, and ``undo`` the reservation if it
    halts the push or raises (except :class:`~limitd.replication.NotReplicated`: the job
    was pushed)."""
    try:
        pushed = call_next(payload)
    except NotReplicated:
        raise
    except BaseException:
        undo()
        raise
    if pushed is None:
        undo()
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


class Chain:
    """An ordered list of middleware instances, with Sidekiq's ordering verbs."""

    def __init__(self, entries: list[Any] | None = None) -> None:
        self._entries: list[Any] = list(entries or [])
        self._version = 0  # bumped by every change, for what subclasses derive from it

    def add(self, middleware: Any) -> None:
        """Append (runs last, innermost)."""
        self._entries.append(middleware)
        self._version += 1

    def prepend(self, middleware: Any) -> None:
        """Insert first (runs first, outermost)."""
        self._entries.insert(0, middleware)
        self._version += 1

    def insert_before(self, existing: type, middleware: Any) -> None:
        self._entries.insert(self._index_of(existing), middleware)
        self._version += 1

    def insert_after(self, existing: type, middleware: Any) -> None:
        self._entries.insert(self._index_of(existing) + 1, middleware)
        self._version += 1

    def remove(self, kind: type) -> None:
        self._entries = [m for m in self._entries if not isinstance(m, kind)]
        self._version += 1

    def __contains__(self, kind: type) -> bool:
        return any(isinstance(m, kind) for m in self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def copy(self) -> Chain:
        return type(self)(self._entries)

    def _index_of(self, kind: type) -> int:
        for index, middleware in enumerate(self._entries):
            if isinstance(middleware, kind):
                return index
        raise ValueError(f"no {kind.__name__} middleware in this chain")


class ClientChain(Chain):
    def prepare_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        """Before a bulk chunk goes through the chain job by job, let middleware that can
        (those with a ``prepare_bulk`` method) do their Redis work for the whole chunk in
        one round trip. Each job still passes every middleware on its own afterwards."""
        for middleware in self._entries:
            prepare = getattr(middleware, "prepare_bulk", None)
            if prepare is not None:
                prepare(spec, payloads, redis)

    def abandon_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        """A bulk chunk was not written (a middleware or the write raised): let middleware
        that reserved something for its jobs before the write (``abandon_bulk`` method)
        give it back, as a single push's middleware do when the push raises. Each runs
        even if another fails; their failures are logged, the caller re-raises the
        original error."""
        for middleware in self._entries:
            abandon = getattr(middleware, "abandon_bulk", None)
            if abandon is None:
                continue
            try:
                abandon(spec, payloads, redis)
            except Exception:
                log_abandon_failure(middleware, payloads)

    def invoke(
        self, spec: JobSpec | None, payload: Payload, redis: Any, push: PushNext
    ) -> Payload | None:
        """Run ``payload`` through every middleware, then ``push`` it."""
        entries = list(self._entries)

        def step(index: int, current: Payload) -> Payload | None:
            if index == len(entries):
                return push(current)
            return entries[index](spec, current, redis, lambda p: step(index + 1, p))

        return step(0, payload)


class ServerChain(Chain):
    def __init__(self, entries: list[Any] | None = None) -> None:
        super().__init__(entries)
        self._plan: tuple[int, list[tuple[Any, Any]]] = (-1, [])

    def _concerned(self, payload: Payload) -> list[Any]:
        """The middleware that want to see this job (see ``concerns``). Every job asks,
        so each middleware's ``concerns`` is looked up once per change of the chain."""
        version, plan = self._plan
        if version != self._version:
            plan = [(m, getattr(m, "concerns", None)) for m in self._entries]
            self._plan = (self._version, plan)
        return [m for m, concerns in plan if concerns is None or concerns(payload)]

    def without_acall(self) -> list[str]:
        """Names of the middleware an async job runs through on a worker thread."""
        return [type(m).__name__ for m in self._entries if not hasattr(m, "acall")]

    async def ainvoke(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        perform: Callable[[], Awaitable[Any]],
    ) -> Any:
        """:meth:`invoke` for an async job, on the running loop (see the module
        docstring for middleware without ``acall``)."""
        entries = self._concerned(payload)
        loop = asyncio.get_running_loop()

        async def step(index: int) -> Any:
            if index == len(entries):
                return await perform()
            middleware = entries[index]
            acall = getattr(middleware, "acall", None)
            if acall is not None:
                return await acall(spec, payload, queue, lambda: step(index + 1))

            def call_next_on_loop() -> Any:
                return asyncio.run_coroutine_threadsafe(step(index + 1), loop).result()

            return await asyncio.to_thread(middleware, spec, payload, queue, call_next_on_loop)

        return await step(0)

    def invoke(
        self, spec: JobSpec, payload: Payload, queue: str, perform: Callable[[], Any]
    ) -> Any:
        """Run every middleware concerned with this job around ``perform``."""
        entries = self._concerned(payload)

        def step(index: int) -> Any:
            if index == len(entries):
                return perform()
            return entries[index](spec, payload, queue, lambda: step(index + 1))

        return step(0)

    def settle(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> list[ScriptCall]:
        """Tell the middleware that have a ``settled`` method how the job ended, and
        collect the script calls they return. These run before the job is acknowledged:
        if they fail, the job runs again, so ``settled`` work must be idempotent per jid."""
        calls: list[ScriptCall] = []
        for middleware in self._concerned(payload):
            settled = getattr(middleware, "settled", None)
            if settled is None:
                continue
            returned = settled(spec, payload, queue, outcome, error)
            if isinstance(returned, ScriptCall):
                calls.append(returned)
            elif returned:
                calls.extend(returned)
        return calls
