"""The server middleware that enforces time limits, in the callable form because it
wraps the job's run: a sync job's thread is registered with the process's
:class:`~limitd.time_limits.watchdog.Watchdog` around ``call_next``; an async job's
task is cancelled at its limit and the cancellation becomes the error.

A job's limit is its ``time_limit`` option, else the capsule's default from the
``time_limits:`` section; a job with neither is not concerned, so the chain skips this
middleware for it. The middleware is innermost: the limit counts the job's own run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis as redis_py

from limitd import keys
from limitd.connection import loop_twin
from limitd.middleware.work import RedisClient
from limitd.payload import Payload
from limitd.registry import JobRegistry, registry
from limitd.spec import JobSpec
from limitd.time_limits import TimeLimitExceeded
from limitd.time_limits.watchdog import Running, Watchdog

log = logging.getLogger("limitd.time_limits")

MARK_SECONDS = 7 * 86_400  # how long a stuck job's mark waits for the job to come back


def exceeded_key(redis: RedisClient, jid: str) -> str:
    """The mark of a job whose process was recycled because it would not stop."""
    return f"{keys.of(redis).LIMITD_PREFIX}time_limit:exceeded:{jid}"


def counts_key(redis: RedisClient) -> str:
    """The hash of jobs stopped at their limit, by ``<class>|<how>`` (``interrupted``: a
    sync job's thread got the error; ``cancelled``: an async job; ``recycled``: a sync job
    stuck past its grace), for ``limitd metrics``. A field per class: bounded."""
    return f"{keys.of(redis).LIMITD_PREFIX}time_limit:counts"


def count_field(job_class: str, how: str) -> str:
    return f"{job_class}|{how}"


class TimeLimits:
    """Enforces the limits of the jobs of one capsule process."""

    def __init__(
        self,
        redis: RedisClient,
        default: float | None,
        grace: float,
        jobs: JobRegistry = registry,
    ) -> None:
        self.redis = redis
        self.jobs = jobs
        self.default = default
        self.watchdog = Watchdog(TimeLimitExceeded, grace, self.mark)

    def limit_of(self, spec: JobSpec, payload: Payload) -> float | None:
        """The payload's ``time_limit`` (set at the push), else the job's own (a job
        pushed by other code than its ``perform_async``), else the capsule's default."""
        limit = payload.get("time_limit") or spec.options.get("time_limit")
        return float(limit) if limit else self.default

    def concerns(self, payload: Payload) -> bool:
        if self.default is not None or payload.get("time_limit"):
            return True
        spec = self.jobs.resolve(str(payload.get("class")))
        return spec is not None and bool(spec.options.get("time_limit"))

    def mark(self, running: Running) -> None:
        """The job is stuck past its grace: when it is run again, it fails unrun (unless
        it ends in this process before the stop, which then removes the mark)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(exceeded_key(self.redis, running.jid), running.limit, ex=MARK_SECONDS)
        pipe.hincrby(counts_key(self.redis), count_field(running.job_class, "recycled"), 1)
        pipe.execute()

    def __call__(
        self, spec: JobSpec, payload: Payload, queue: str, call_next: Callable[[], Any]
    ) -> Any:
        limit = self.limit_of(spec, payload)
        if limit is None:
            return call_next()
        if self.redis.delete(exceeded_key(self.redis, payload["jid"])):
            raise TimeLimitExceeded(
                f"ran past its time limit of {limit:g}s stuck in C code, and its process "
                "was recycled"
            )
        running = self.watchdog.running(limit, payload["jid"], payload["class"])
        ended_here = False  # returned or raised: its outcome is recorded in this process
        try:
            try:
                self.watchdog.register(running)
                result = call_next()
                ended_here = True
            except (Exception, SystemExit):
                ended_here = True
                raise
            finally:
                # Not on the capsule's Shutdown: the job was requeued, and its mark
                # must make it fail unrun rather than get stuck again.
                self._unregister(running, forget_mark=ended_here)
        except TimeLimitExceeded as exc:
            if not running.fired or exc.args:
                raise  # the job's own, or one it raised itself
            if not running.marked:  # a recycled one was counted as such
                self._count(payload, "interrupted")
            raise _exceeded(limit).with_traceback(exc.__traceback__) from None
        if running.fired:  # it caught the error and returned: it still ran past its limit
            raise _exceeded(limit)
        return result

    def _count(self, payload: Payload, how: str) -> None:
        """Count the job for ``limitd metrics``; the job's error stays the time limit."""
        try:
            self.redis.hincrby(counts_key(self.redis), count_field(payload["class"], how), 1)
        except redis_py.RedisError as error:
            log.warning("could not count a time limit reached: %s", error)

    def _unregister(self, running: Running, *, forget_mark: bool) -> None:
        """Unregister, even if the watchdog's exception arrives during it (the job then
        fails with it: it is still inside this call). A marked job that ended here after
        all (``forget_mark``) has its failure recorded here: its mark goes."""
        try:
            self.watchdog.unregister(running)
        except TimeLimitExceeded:
            self.watchdog.unregister(running)
            raise
        finally:
            if running.marked and forget_mark:
                self.redis.delete(exceeded_key(self.redis, running.jid))

    async def acall(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        call_next: Callable[[], Awaitable[Any]],
    ) -> Any:
        limit = self.limit_of(spec, payload)
        if limit is None:
            return await call_next()
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing to cancel
            return await call_next()
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(limit, expire)
        try:
            result = await call_next()
            if expired:  # it swallowed the cancel and returned: it ran past its limit
                raise _exceeded(limit)
            return result
        except asyncio.CancelledError:
            # ours alone: the error; a shutdown's cancel as well: it goes on (3.11+ count)
            uncancel = getattr(task, "uncancel", None)
            if not expired or (uncancel is not None and uncancel() > 0):
                raise
            try:
                field = count_field(payload["class"], "cancelled")
                twin = loop_twin(self.redis)  # type: ignore[arg-type]
                await twin.hincrby(counts_key(self.redis), field, 1)
            except redis_py.RedisError as error:
                log.warning("could not count a time limit reached: %s", error)
            raise _exceeded(limit) from None
        finally:
            timer.cancel()

    def stop(self) -> None:
        self.watchdog.stop()


def _exceeded(limit: float) -> TimeLimitExceeded:
    return TimeLimitExceeded(f"ran past its time limit of {limit:g}s")
