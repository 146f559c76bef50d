"""Running one job in a testing mode: resolve its class, then the server middleware
chain a capsule builds (``default_server_chain``, on the in-memory Redis), the job's own
``perform``, and the chain's ``settled`` bookkeeping, as a capsule's executor does.

What differs from a capsule: no retries (the job's exception goes to the caller, and the
run counts as a failure that will retry, or as a death for a job with ``retry`` off, for
its batch and its unique lock); no stats, logs or dead set. An async job runs on an event
loop: the caller's when it awaits, else one of its own (in a helper thread when the caller
is itself inside a running loop but calls the sync API).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis as redis_py

from limitd.connection import run_calls
from limitd.iteration.middleware import IterationControl
from limitd.middleware.chain import Dropped, Rescheduled, ServerChain
from limitd.middleware.defaults import default_server_chain
from limitd.payload import Payload
from limitd.registry import registry
from limitd.spec import JobSpec, finished, running

T = TypeVar("T")


class JobRunner:
    """Runs jobs through a server chain whose Redis work goes to ``redis`` (in memory)."""

    def __init__(self, redis: redis_py.Redis, extra: list[Any] | None = None) -> None:
        self.redis = redis
        self.chain: ServerChain = default_server_chain(redis)
        # Iterable jobs walk all their items in one run here: no progress to keep, no
        # capsule to stop them (their middleware only binds a run to its capsule).
        self.chain.remove(IterationControl)
        for middleware in extra or []:
            self.chain.add(middleware)

    def run(self, payload: Payload) -> None:
        """Run one job now, from sync code; its error, if any, is raised here."""
        spec, job = _prepared(payload)
        if spec.is_async:
            blocking(lambda: self._arun(spec, job))
            return
        token = running(job)
        try:
            error = _outcome_of(
                lambda: self.chain.invoke(spec, job, job["queue"], lambda: spec.run(job))
            )
        finally:
            finished(token)
        self._settle(spec, job, error)

    async def arun(self, payload: Payload) -> None:
        """Run one job from async code: an async job on the running loop."""
        spec, job = _prepared(payload)
        if spec.is_async:
            await self._arun(spec, job)
        else:
            self.run(job)

    async def _arun(self, spec: JobSpec, job: Payload) -> None:
        token = running(job)
        try:
            error = await _aoutcome_of(
                self.chain.ainvoke(spec, job, job["queue"], lambda: spec.run(job))
            )
        finally:
            finished(token)
        self._settle(spec, job, error)

    def _settle(self, spec: JobSpec, job: Payload, error: BaseException | None) -> None:
        """The chain's ``settled`` work (a batch's count, a unique lock's release), then
        the job's error."""
        outcome = _failed_outcome(job) if error is not None else "done"
        if isinstance(error, Rescheduled):
            outcome, error = "rescheduled", None
        elif isinstance(error, Dropped):  # expired, cancelled: not run, not a failure
            outcome, error = error.outcome, None
        run_calls(self.redis, self.chain.settle(spec, job, job["queue"], outcome, error))
        if error is not None:
            raise error


def _prepared(payload: Payload) -> tuple[JobSpec, Payload]:
    """The job's spec, and the payload as a capsule would see it (no ``at``)."""
    spec = registry.resolve(str(payload.get("class")))
    if spec is None:
        raise LookupError(
            f"limitd.testing: no job named {payload.get('class')!r} is registered "
            f"(registered: {', '.join(registry.names())})"
        )
    job = {k: v for k, v in payload.items() if k != "at"}
    return spec, job


def _outcome_of(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as error:  # the job's, or a middleware's: the caller gets it
        return error
    return None


async def _aoutcome_of(call: Awaitable[Any]) -> BaseException | None:
    try:
        await call
    except Exception as error:
        return error
    return None


def _failed_outcome(job: Payload) -> str:
    """What a capsule would record for a first failure: a retry, unless retries are off."""
    retry = job.get("retry", True)
    return "dead" if retry is False or retry == 0 else "retry"


def blocking(start: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end from sync code: on a loop of its own, in a helper
    thread (with this context) when this thread is already running a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(start))
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="limitd-testing") as pool:
        return pool.submit(context.run, asyncio.run, _awaited(start)).result()


async def _awaited(start: Callable[[], Awaitable[T]]) -> T:
    return await start()
