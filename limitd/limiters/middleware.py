"""A job whose limiter stayed full is rescheduled, not failed.

``OverLimit`` escaping a job means "not now", not "broken": this server middleware
catches it, writes the job to ``schedule`` with ``overlimit_count`` one higher (its
``retry_count`` and the retry set untouched) to run again after a backoff, announces
the due time so sleeping pollers wake for it, and raises ``Rescheduled`` so the
executor records the outcome ``rescheduled``. That outcome is neither success nor
failure: the job's batch does not count it and its unique lock is kept, since the same
job runs again. After ``max_overlimit`` reschedules (a job option, default 20) the
next ``OverLimit`` takes the retry path like any other error.

The delay is ``5 s x count`` plus up to 5 s of jitter, unless the job's
``limiter_backoff(count, exc, payload)`` hook (a ``@limitd.job`` keyword or a ``Job``
method), or the global one set with :func:`set_limiter_backoff`, returns a number of
seconds >= 0.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from limitd import clock, keys, options
from limitd.limiters.store import OverLimit
from limitd.middleware.base import Ending, ServerMiddleware
from limitd.middleware.chain import Rescheduled
from limitd.middleware.work import Command, RedisClient, Work
from limitd.payload import Payload, dumps
from limitd.spec import JobSpec

log = logging.getLogger("limitd.limiters")

DEFAULT_MAX_OVERLIMIT = 20
STEP_SECONDS = 5.0
JITTER_SECONDS = 5.0
COUNT_FIELD = "overlimit_count"


def _count_option(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("expected a whole number of reschedules >= 0")
    return value


options.declare("max_overlimit", _count_option, owner="limitd.limiters")
options.declare_hook("limiter_backoff", method="limiter_backoff", owner="limitd.limiters")

# (over-limit reschedules so far, the OverLimit, payload) -> seconds
LimiterBackoffHook = Callable[[int, BaseException, Payload], Any]


def backoff_hook(spec: JobSpec) -> LimiterBackoffHook | None:
    """The job's own ``limiter_backoff`` hook (keyword or ``Job`` method), if any."""
    return spec.hooks.get("limiter_backoff")


_global_backoff: LimiterBackoffHook | None = None
_rng = random.Random()


def set_limiter_backoff(hook: LimiterBackoffHook | None) -> None:
    """The delay for jobs without their own ``limiter_backoff`` hook (None: the
    default linear backoff)."""
    global _global_backoff
    _global_backoff = hook


def default_backoff(count: int) -> float:
    """Grows with each reschedule; jittered so jobs turned away together do not all
    come back at the same instant."""
    return STEP_SECONDS * count + _rng.uniform(0, JITTER_SECONDS)


def backoff_seconds(spec: JobSpec, count: int, exc: OverLimit, payload: Payload) -> float:
    hook = backoff_hook(spec) or _global_backoff
    if hook is not None:
        chosen = _call_hook(hook, count, exc, payload)
        if isinstance(chosen, (int, float)) and not isinstance(chosen, bool) and chosen >= 0:
            return float(chosen)
    return default_backoff(count)


def _next_count(payload: Payload) -> int | None:
    """This job's over-limit count after one more, or None past ``max_overlimit``."""
    count = int(payload.get(COUNT_FIELD) or 0) + 1
    return count if count <= int(payload.get("max_overlimit", DEFAULT_MAX_OVERLIMIT)) else None


class OverLimitReschedule(ServerMiddleware):
    """Server middleware: ``OverLimit`` out of a job puts it back in ``schedule``. Any
    job may use a limiter, so every job concerns it, but only one that raised needs it."""

    ends_only_on_error = True

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> Ending | None:
        """Over limit and not too often yet: the reschedule, and ``Rescheduled``."""
        if not isinstance(error, OverLimit):
            return None
        count = _next_count(payload)
        if count is None:
            return None  # rescheduled often enough: an error like any other
        return Ending(self._reschedule(spec, payload, queue, count, error), Rescheduled(str(error)))

    def _reschedule(
        self, spec: JobSpec, payload: Payload, queue: str, count: int, exc: OverLimit
    ) -> list[Work]:
        """ZADD to ``schedule`` and announce the due time in one round trip (as a
        retry is), so a poller asleep until later wakes for it."""
        entry = {**payload, COUNT_FIELD: count, "queue": queue}
        at = clock.now() + backoff_seconds(spec, count, exc, entry)
        log.info(
            "over limit jid=%s class=%s queue=%s limiter=%s overlimit_count=%d in %.1fs",
            payload.get("jid"),
            payload.get("class"),
            queue,
            exc.name,
            count,
            at - clock.now(),
        )
        return [
            Command("zadd", keys.of(self.redis).SCHEDULE, {dumps(entry): at}),
            Command("publish", keys.DUE_CHANNEL, repr(at)),
        ]


def _call_hook(hook: LimiterBackoffHook, count: int, exc: OverLimit, payload: Payload) -> Any:
    """User code inside the reschedule: its error falls back on the default delay."""
    try:
        return hook(count, exc, payload)
    except Exception:
        log.exception(
            "limiter_backoff hook failed jid=%s class=%s", payload.get("jid"), payload.get("class")
        )
        return None
