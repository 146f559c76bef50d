"""Middleware chains: the ordering verbs every chain has, and the server chain, which
wraps every perform (the client chain, which wraps every push, is in
:mod:`limitd.middleware.client_chain`).

A middleware subclasses :class:`~limitd.middleware.base.ClientMiddleware` or
:class:`~limitd.middleware.base.ServerMiddleware` (see :mod:`limitd.middleware.base` for
its hooks) or is a plain callable (:mod:`limitd.middleware.callables`). Hooks return
the Redis work to do; the chain makes it with :func:`~limitd.middleware.work.run_work`,
or :func:`~limitd.middleware.work.arun_work` on an event loop: the sync and the async
runner below differ only by ``await``.

``concerns`` lets a feature stay out of the way of jobs that do not use it: every job
passes the server chain, and a middleware that only calls on costs each of them a frame
for nothing. Each middleware's hooks are looked at once per change of the chain: the
no-op defaults are not called.

``settled`` exists because a middleware around ``perform`` sees an exception but not
what becomes of the job: the retry decision is taken after the chain unwinds. The
script calls it returns (``limitd.connection.ScriptCall``, one or a list) are made before the
job is acknowledged, in the same round trip as the acknowledgement when the fetch can
(the limit fetch does): bookkeeping such as a batch's costs no round trip of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NoReturn

from limitd.connection import ScriptCall, loop_twin
from limitd.middleware.base import Ending, ServerMiddleware
from limitd.middleware.callables import CallableServer
from limitd.middleware.work import AsyncRedisClient, RedisClient, arun_work, run_work
from limitd.payload import Payload
from limitd.spec import JobSpec

log = logging.getLogger("limitd.middleware")


class Rescheduled(Exception):
    """Raised by a server middleware that has itself put the job back in ``schedule``
    (a limiter's ``OverLimit``): the executor records the outcome ``rescheduled``, which
    is neither a success nor a failure; ``settled`` middleware leave such a job's state
    (its batch, its unique lock) as it is, since it will run again."""


class Dropped(Exception):
    """Raised by a server middleware that decided the job must not run at all (an
    expired job, ``limitd.expiry``): the executor records ``outcome`` (``expired``),
    which is not a failure: no retry, no dead set, no error handlers. ``settled``
    middleware see that outcome and settle the job as one that will not run again."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class Interrupted(Exception):
    """Raised by a job that stopped between two steps and must run again from where it
    stopped (an iterable job, ``limitd.iteration``, when its capsule quiets, or at the
    end of a slice): the executor records the outcome ``interrupted`` (neither a success
    nor a failure) and the job's dispatch puts the job back in its queue, in the same
    atomic move as a graceful stop's requeue, instead of acknowledging it: first in
    line again, or with ``back`` behind the jobs queued meanwhile. ``settled``
    middleware leave its state as it is, as for ``rescheduled``: it runs again."""

    def __init__(self, message: str, *, back: bool = False) -> None:
        super().__init__(message)
        self.back = back


# The outcomes after which the same job runs again (a ``settled`` middleware keeps what
# it holds for it: its unique lock, its place in a batch).
RUNS_AGAIN = frozenset({"retry", "rescheduled", "interrupted"})


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


class ServerEntry:
    """One server middleware as the chain calls it: a typed one with the hooks that are
    its own (no-op defaults are not called: every job passes the chain), or a callable
    one (``wrapped``). A plain class with slots: its fields are read for every job."""

    __slots__ = (
        "concerns",
        "ends",
        "fields",
        "middleware",
        "on_error",
        "quiets",
        "settles",
        "starts",
        "wrapped",
    )

    def __init__(self, middleware: Any) -> None:
        self.middleware = middleware
        self.wrapped: CallableServer | None = None
        self.fields: frozenset[str] | None = None
        self.on_error = False
        if not isinstance(middleware, ServerMiddleware):
            self.wrapped = CallableServer(middleware)
            self.concerns = self.wrapped.concerns
            self.starts = self.ends = self.quiets = False
            self.settles = True
            return
        kind, base = type(middleware), ServerMiddleware
        own_filter = kind.concerns is not base.concerns
        self.concerns = middleware.concerns if own_filter else None
        self.fields = _declared_with(kind, "concerns", "concerns_fields") if own_filter else None
        self.starts = kind.starting is not base.starting
        self.ends = kind.ended is not base.ended
        self.settles = kind.settled is not base.settled
        self.quiets = kind.quiet is not base.quiet
        # Nothing to do before perform, and ``ended`` only for a job that raised.
        self.on_error = (
            self.ends
            and not self.starts
            and bool(_declared_with(kind, "ended", "ends_only_on_error"))
        )


def _declared_with(kind: type, hook: str, declaration: str) -> Any:
    """``declaration`` as the class that defines ``hook`` declares it, else None: a
    subclass that overrides the hook without declaring it anew is not judged by what its
    parent said of its own hook."""
    for klass in kind.__mro__:
        if hook in vars(klass):
            return vars(klass).get(declaration)
    return None


class _Plan:
    """The chain's middleware as :meth:`ServerChain.concerned` sorts them."""

    __slots__ = ("entries", "fields", "unfielded")

    def __init__(self, entries: list[ServerEntry]) -> None:
        self.entries = entries
        # Every field some middleware is concerned with only in jobs that hold it
        # (``ServerMiddleware.concerns_fields``), and the middleware left to ask about a
        # job that holds none of them.
        self.fields = frozenset().union(*(e.fields for e in entries if e.fields is not None))
        self.unfielded = [e for e in entries if e.fields is None]


class ServerChain(Chain):
    """The middleware every job runs through, by :meth:`invoke` on a processor thread or
    :meth:`ainvoke` on the capsule's event loop; :meth:`settle` collects their work for
    the acknowledgement."""

    def __init__(self, entries: list[Any] | None = None) -> None:
        super().__init__(entries)
        self._plan: tuple[int, _Plan] = (-1, _Plan([]))

    def _plan_now(self) -> _Plan:
        """Every middleware as the chain calls it (concerned or not), rebuilt after a
        change."""
        version, plan = self._plan
        if version != self._version:
            plan = _Plan([ServerEntry(m) for m in self._entries])
            self._plan = (self._version, plan)
        return plan

    def concerned(self, payload: Payload) -> list[ServerEntry]:
        """The middleware that want to see this job (see ``concerns``). Asked once per
        job: the executor passes the answer to :meth:`invoke` and :meth:`settle`, so the
        middleware that saw a job start are the ones told how it ended. A job holding
        none of the fields that some middleware look for (most jobs) is asked about by
        the others only."""
        plan = self._plan_now()
        entries = plan.unfielded if payload.keys().isdisjoint(plan.fields) else plan.entries
        return [e for e in entries if e.concerns is None or e.concerns(payload)]

    def quiet(self) -> None:
        """The capsule stopped taking jobs (TSTP, a quiet from afar, the start of a
        stop): tell the middleware that define ``quiet``, so jobs that can stop early
        (iterable jobs) do. One that raises is logged; the others are still told."""
        for entry in self._plan_now().entries:
            if entry.quiets:
                try:
                    entry.middleware.quiet()
                except Exception:
                    log.exception("%s.quiet failed", type(entry.middleware).__name__)

    def without_acall(self) -> list[str]:
        """Names of the middleware an async job runs through on a worker thread."""
        return [
            type(m).__name__
            for m in self._entries
            if not isinstance(m, ServerMiddleware) and CallableServer(m).acall is None
        ]

    def invoke(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        perform: Callable[[], Any],
        *,
        entries: list[ServerEntry] | None = None,
    ) -> Any:
        """Run every middleware concerned with this job (``entries``, else asked now)
        around ``perform``."""
        if entries is None:
            entries = self.concerned(payload)
        if not entries:  # no middleware concerned: nothing to wrap
            return perform()
        if _only_on_error(entries):  # most jobs: only the limiters' reschedule, if it fails
            try:
                return perform()
            except BaseException as error:
                return _through(entries, spec, payload, queue, _raising(error))
        if not any(entry.wrapped for entry in entries):  # one frame for all
            return _through(entries, spec, payload, queue, perform)

        def step(index: int) -> Any:
            """From entry ``index`` in: a callable middleware wraps the rest itself; a
            run of typed ones goes through in one frame (:func:`_through`)."""
            if index == len(entries):
                return perform()
            entry = entries[index]
            if entry.wrapped is not None:
                return entry.middleware(spec, payload, queue, lambda: step(index + 1))
            end = _typed_run_end(entries, index)
            inner = perform if end == len(entries) else lambda: step(end)
            return _through(entries[index:end], spec, payload, queue, inner)

        return step(0)

    async def ainvoke(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        perform: Callable[[], Awaitable[Any]],
        *,
        entries: list[ServerEntry] | None = None,
    ) -> Any:
        """:meth:`invoke` for an async job, on the running loop (a callable middleware
        without ``acall`` runs on a worker thread)."""
        if entries is None:
            entries = self.concerned(payload)
        try:
            return await self.awaitable(spec, payload, queue, perform, entries)
        except BaseException as error:
            await self.afailed(error, spec, payload, queue, entries)

    def awaitable(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        perform: Callable[[], Awaitable[Any]],
        entries: list[ServerEntry],
    ) -> Awaitable[Any]:
        """What :meth:`ainvoke` awaits, for a caller that awaits it inside its own
        ``try`` and passes what it raises to :meth:`afailed` (the executor): where no
        middleware wraps the job (none is concerned, or only those that act on failures),
        the job's own awaitable, so that a job waiting has no frame of the chain's to
        pass through each time it suspends and resumes."""
        if not entries or _only_on_error(entries):
            return perform()
        return _awrapped(entries, spec, payload, queue, perform)

    async def afailed(
        self,
        error: BaseException,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        entries: list[ServerEntry],
    ) -> NoReturn:
        """Raise what ``error``, raised by awaiting :meth:`awaitable`, becomes: through
        the middleware acting on failures that it left out, else as it is (the chain
        around it has ended already)."""
        if entries and _only_on_error(entries):
            await _athrough(entries, spec, payload, queue, _araising(error))
        raise error

    def settle(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
        *,
        entries: list[ServerEntry] | None = None,
    ) -> list[ScriptCall]:
        """Tell the middleware how the job ended, and collect the script calls they
        return. These run before the job is acknowledged: if they fail, the job runs
        again, so ``settled`` work must be idempotent per jid."""
        calls: list[ScriptCall] = []
        for entry in self.concerned(payload) if entries is None else entries:
            if not entry.settles:
                continue
            if entry.wrapped is not None:
                returned = entry.wrapped.settle(spec, payload, queue, outcome, error)
            else:
                returned = entry.middleware.settled(spec, payload, queue, outcome, error)
            if isinstance(returned, ScriptCall):
                calls.append(returned)
            elif returned:
                calls.extend(returned)
        return calls


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """``awaitable`` as a coroutine (what a callable middleware run on a worker thread
    hands back to the loop must be one)."""
    return await awaitable


def _awrapped(
    entries: list[ServerEntry],
    spec: JobSpec,
    payload: Payload,
    queue: str,
    perform: Callable[[], Awaitable[Any]],
) -> Awaitable[Any]:
    """What to await for a job that middleware wrap: typed ones in one frame
    (:func:`_athrough`), nesting only around callable ones. (Apart from
    :meth:`ServerChain.awaitable`, which every async job passes: a closure there would
    make cells of its arguments for every job.)"""
    if not any(entry.wrapped for entry in entries):
        return _athrough(entries, spec, payload, queue, perform)

    def step(index: int) -> Awaitable[Any]:
        """As in :meth:`ServerChain.invoke`; what is left to await, not a coroutine."""
        if index == len(entries):
            return perform()
        entry = entries[index]
        if entry.wrapped is not None:  # its call_next must give a coroutine
            return entry.wrapped.ainvoke(spec, payload, queue, lambda: _awaited(step(index + 1)))
        end = _typed_run_end(entries, index)
        inner = perform if end == len(entries) else lambda: step(end)
        return _athrough(entries[index:end], spec, payload, queue, inner)

    return step(0)


def _only_on_error(entries: list[ServerEntry]) -> bool:
    """Whether every one of ``entries`` acts only on a job that raised (see
    ``ServerMiddleware.ends_only_on_error``): a job that returns then runs unwrapped, and
    one that raises meets them as it would have inside them. (A loop, not ``all()`` of a
    generator: asked for every job.)"""
    for entry in entries:  # noqa: SIM110
        if not entry.on_error:
            return False
    return True


def _raising(error: BaseException) -> Callable[[], Any]:
    """A perform that raises what the job raised, for the middleware that act on it."""

    def perform() -> Any:
        raise error

    return perform


def _araising(error: BaseException) -> Callable[[], Awaitable[Any]]:
    """:func:`_raising` for an async job."""

    async def perform() -> Any:
        raise error

    return perform


def _typed_run_end(entries: list[ServerEntry], index: int) -> int:
    """Where the run of typed middleware that starts at ``index`` ends: the next
    callable one, or the end of the chain."""
    end = index
    while end < len(entries) and entries[end].wrapped is None:
        end += 1
    return end


def _through(
    entries: list[ServerEntry],
    spec: JobSpec,
    payload: Payload,
    queue: str,
    perform: Callable[[], Any],
) -> Any:
    """``perform`` inside typed middleware only, in one frame: their ``starting`` hooks
    outermost first, then ``ended`` innermost first, each seeing the error the ones
    inside it left, as nested calls would, without a frame per middleware. A
    middleware whose ``starting`` raised is not ended; the ones around it are."""
    entered: list[ServerMiddleware] = []
    error: BaseException | None = None
    result = None
    try:
        for entry in entries:
            middleware: ServerMiddleware = entry.middleware
            if entry.starts:
                work = middleware.starting(spec, payload, queue)
                if work is not None:
                    run_work(_redis_of(middleware), work)
            if entry.ends:
                entered.append(middleware)
        result = perform()
    except BaseException as exc:
        error = exc
    for middleware in reversed(entered):
        try:
            ending = middleware.ended(spec, payload, queue, error)
            if ending is not None:
                _end(middleware, ending, error)
        except BaseException as exc:
            error = _replaced(error, exc)
    if error is not None:
        raise error
    return result


async def _athrough(
    entries: list[ServerEntry],
    spec: JobSpec,
    payload: Payload,
    queue: str,
    perform: Callable[[], Awaitable[Any]],
) -> Any:
    """:func:`_through` for an async job, on the running loop."""
    entered: list[ServerMiddleware] = []
    error: BaseException | None = None
    result = None
    try:
        for entry in entries:
            middleware: ServerMiddleware = entry.middleware
            if entry.starts:
                work = middleware.starting(spec, payload, queue)
                if work is not None:
                    await arun_work(_loop_redis_of(middleware), work)
            if entry.ends:
                entered.append(middleware)
        result = await perform()
    except BaseException as exc:
        error = exc
    for middleware in reversed(entered):
        try:
            ending = middleware.ended(spec, payload, queue, error)
            if ending is not None:
                await _aend(middleware, ending, error)
        except BaseException as exc:
            error = _replaced(error, exc)
    if error is not None:
        raise error
    return result


def _replaced(error: BaseException | None, raised: BaseException) -> BaseException:
    """What an ``ended`` hook raised, chained to the error it was handling as an
    ``except`` block would have chained it (the nested calls ran it in one)."""
    if error is not None and raised is not error and raised.__context__ is None:
        raised.__context__ = error
    return raised


def _redis_of(middleware: ServerMiddleware) -> RedisClient:
    if middleware.redis is None:
        raise TypeError(f"{type(middleware).__name__} returned Redis work but has no redis")
    return middleware.redis


def _loop_redis_of(middleware: ServerMiddleware) -> AsyncRedisClient:
    """The running loop's asyncio twin of the middleware's client."""
    return loop_twin(_redis_of(middleware))  # type: ignore[arg-type]


def _end(middleware: ServerMiddleware, ending: Ending, error: BaseException | None) -> None:
    """Make an ``ended`` hook's work, then raise the error it ends the job with."""
    if ending.work is not None:
        run_work(_redis_of(middleware), ending.work)
    if ending.error is not None:
        raise ending.error from error


async def _aend(middleware: ServerMiddleware, ending: Ending, error: BaseException | None) -> None:
    """:func:`_end` on the running loop."""
    if ending.work is not None:
        await arun_work(_loop_redis_of(middleware), ending.work)
    if ending.error is not None:
        raise ending.error from error
