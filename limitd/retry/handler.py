"""What happens to a job that raised: the retry set with backoff, or the dead set.

Follows Sidekiq's rules so jobs move between limitd and Sidekiq unchanged:

- ``retry``: True (25 retries), a number of retries, or False (no retry, not kept);
- the first failure sets ``failed_at`` and ``retry_count = 0``; later ones set
  ``retried_at`` and add one; the job is retried while ``retry_count`` < max retries, or,
  when ``retry_for`` is set, while ``failed_at + retry_for`` is still in the future;
- the delay is ``count**4 + 15 + rand(10) * (count + 1)`` seconds, unless the job's
  ``retry_in`` hook returns a positive number (used as is), ``"discard"`` or ``"kill"``;
- exhausted jobs go to the dead set (unless ``dead: false`` or ``retries_exhausted``
  returns ``"discard"``), which is trimmed by age and size in the same transaction, and
  the death handlers are called;
- every failed attempt, once its fate is recorded (or recording it failed), is told to
  the error handlers as the exception and a :class:`Failure`: how an app reports errors
  (Sentry and the like, declared with ``limitd.configure_server``).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import redis as redis_py
from redis.client import Pipeline
from redis.cluster import ClusterPipeline

from limitd import clock, keys, options
from limitd.connection import pipeline
from limitd.payload import Payload, dumps, to_seconds
from limitd.spec import JobSpec

log = logging.getLogger("limitd.retry")

DEFAULT_MAX_RETRIES = 25
MAX_ERROR_MESSAGE = 10_000

DeathHandler = Callable[[Payload, BaseException], Any]
"""Told of a job that died (dead set, or discarded): its payload and the last error."""


class Unretriable(Exception):
    """A failure that retrying cannot fix, such as arguments no configured key decrypts
    (``limitd.encryption``): the job goes to the dead set at once, whatever its
    ``retry`` setting (a job that never ran is not discarded), so nothing is lost and
    ``limitd dead retry`` brings it back once the cause is fixed."""


def _retry_option(value: Any) -> bool | int:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 0:
        return value
    raise ValueError("expected true, false or a number of retries >= 0")


options.declare("retry", _retry_option, owner="limitd.retry")
options.declare("retry_queue", options.non_empty_str, owner="limitd.retry")
options.declare("retry_for", options.seconds, owner="limitd.retry")
options.declare("dead", options.boolean, owner="limitd.retry")


@dataclass(frozen=True)
class DeadSetPolicy:
    """How long the dead set keeps jobs, and how many at most."""

    timeout_seconds: float = 180 * 86_400
    max_jobs: int = 10_000


def trim_dead(redis: Any, now: float, policy: DeadSetPolicy) -> None:
    """Drop dead jobs older than the policy allows and the oldest beyond its size, in one
    MULTI. Given a pipeline, adds the commands to it and executes it."""
    k = keys.of(redis)
    is_pipe = isinstance(redis, (Pipeline, ClusterPipeline))
    pipe = redis if is_pipe else redis.pipeline(transaction=True)
    pipe.zremrangebyscore(k.DEAD, "-inf", now - policy.timeout_seconds)
    pipe.zremrangebyrank(k.DEAD, 0, -(policy.max_jobs + 1))
    pipe.execute()


def error_class_name(exc: BaseException) -> str:
    """``module.Class`` of the error, or the public name limitd's own errors declare in
    ``wire_name`` (``limitd.MalformedPayload``), which stays put when modules move."""
    kind = type(exc)
    declared = getattr(kind, "wire_name", None)
    if isinstance(declared, str):
        return declared
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def record_error(payload: Payload, exc: BaseException) -> None:
    payload["error_class"] = error_class_name(exc)
    payload["error_message"] = str(exc)[:MAX_ERROR_MESSAGE]


def backoff_seconds(count: int, rng: random.Random) -> float:
    """Sidekiq's default: grows as count**4, jittered so failures do not return together."""
    return float(count**4 + 15 + rng.randrange(10) * (count + 1))


def max_retries(setting: Any) -> int:
    if setting is True:
        return DEFAULT_MAX_RETRIES
    if isinstance(setting, int) and not isinstance(setting, bool):
        return setting
    return 0


@dataclass(frozen=True)
class Fate:
    """Where a failed job went: ``outcome`` is ``retry``, ``dead`` or ``discarded``;
    ``retry_at`` (epoch seconds) is when a retry is due, for the line that logs it."""

    outcome: str
    retry_at: float | None = None


# Fields of a payload that name a job without its arguments (Failure.as_dict).
_IDENTIFYING = ("bid", "fair_tenant", "created_at", "enqueued_at", "failed_at", "retried_at")


@dataclass(frozen=True)
class Failure:
    """What an error handler is told about one failed attempt of a job, beside the
    exception. ``outcome`` is where the job went: ``retry``, ``dead``, ``discarded``, or
    ``unrecorded`` when writing that to Redis failed (the job is still held and runs
    again). ``retry_count`` is the job's count after this failure (0 at the first one,
    as in Sidekiq), None for a job with ``retry: false``. ``payload`` is a read-only
    copy of the job as recorded, arguments included: what a handler sends out of the
    process is its choice, and :meth:`as_dict` leaves them out unless asked."""

    job_class: str
    jid: str
    queue: str
    retry_count: int | None
    outcome: str
    retry_at: float | None
    payload: Mapping[str, Any]

    @property
    def will_retry(self) -> bool:
        return self.outcome == "retry"

    @property
    def args(self) -> list[Any]:
        return list(self.payload.get("args") or [])

    def as_dict(self, *, include_args: bool = False) -> dict[str, Any]:
        """A JSON-able summary for a reporter's extra data: the job's identity, where it
        went and its error, the arguments only with ``include_args`` (they may hold
        personal data)."""
        summary: dict[str, Any] = {
            "class": self.job_class,
            "jid": self.jid,
            "queue": self.queue,
            "retry_count": self.retry_count,
            "outcome": self.outcome,
            "will_retry": self.will_retry,
            "retry_at": self.retry_at,
            "error_class": self.payload.get("error_class"),
        }
        summary.update({k: self.payload[k] for k in _IDENTIFYING if k in self.payload})
        if include_args:
            summary["args"] = self.args
        return summary


ErrorHandler = Callable[[BaseException, Failure], Any]
"""Told of every failed attempt of a job: the exception and a :class:`Failure`."""


class RetryHandler:
    """Decides and records the fate of a failed job (a :class:`Fate`, whose outcome is
    ``retry``, ``dead`` or ``discarded``)."""

    def __init__(
        self,
        redis: redis_py.Redis,
        dead_policy: DeadSetPolicy | None = None,
        death_handlers: Sequence[DeathHandler] = (),
        rng: random.Random | None = None,
        error_handlers: Sequence[ErrorHandler] = (),
    ) -> None:
        self.redis = redis
        self.dead_policy = dead_policy or DeadSetPolicy()
        self.death_handlers = list(death_handlers)
        self.error_handlers = list(error_handlers)
        self.rng = rng or random.Random()

    def job_failed(
        self, spec: JobSpec | None, payload: Payload, queue: str, exc: BaseException
    ) -> Fate:
        """Record the job's fate, then tell the error handlers (also when recording it
        raised: the failure happened all the same)."""
        fate: Fate | None = None
        try:
            fate = self._record_failure(spec, payload, queue, exc)
            return fate
        finally:
            if self.error_handlers:
                self._call_error_handlers(payload, queue, exc, fate)

    def _record_failure(
        self, spec: JobSpec | None, payload: Payload, queue: str, exc: BaseException
    ) -> Fate:
        setting = payload.get("retry", spec.options.get("retry", True) if spec else True)
        if isinstance(exc, Unretriable):
            payload["queue"] = payload.get("retry_queue") or queue
            record_error(payload, exc)
            _count_failure(payload, clock.now())
            return Fate(self.retries_exhausted(spec, payload, exc, discardable=False))
        if setting is False:
            self._call_death_handlers(payload, exc)
            return Fate("discarded")
        payload["queue"] = payload.get("retry_queue") or queue
        record_error(payload, exc)
        count = _count_failure(payload, clock.now())
        if self._exhausted(payload, count, setting):
            return Fate(self.retries_exhausted(spec, payload, exc))
        decision = self._delay(spec, count, exc, payload)
        if decision == "discard":
            return Fate("discarded")
        if decision == "kill":
            return Fate(self.retries_exhausted(spec, payload, exc))
        at = clock.now() + float(decision)
        self._schedule_retry(payload, at)
        return Fate("retry", retry_at=at)

    def _schedule_retry(self, payload: Payload, at: float) -> None:
        """ZADD to ``retry`` and announce ``at`` in the same round trip, so that sleeping
        pollers wake for it (a retry in 2 s runs in 2 s, not at their next poll)."""
        k = keys.of(self.redis)
        pipe = pipeline(self.redis)
        pipe.zadd(k.RETRY, {dumps(payload): at})
        pipe.publish(keys.DUE_CHANNEL, repr(at))
        pipe.execute()

    def retries_exhausted(
        self,
        spec: JobSpec | None,
        payload: Payload,
        exc: BaseException,
        *,
        discardable: bool = True,
    ) -> str:
        """The job dies: its ``retries_exhausted`` hook is told, and it goes to the dead
        set unless the hook discards it (not a job that never ran, ``discardable``
        False: an ``Unretriable`` one waits there for its cause to be fixed) or its
        ``dead`` option is False."""
        hook = spec.retries_exhausted if spec else None
        said = _call_hook(hook, payload, payload, exc) if hook is not None else None
        if said == "discard" and discardable:
            return "discarded"
        kept = payload.get("dead") is not False
        if kept:
            self.bury(payload)
        self._call_death_handlers(payload, exc)
        return "dead" if kept else "discarded"

    def kill(self, entry: str, exc: BaseException) -> None:
        """Bury a job that is not run again (malformed, or recovered too often): its
        dead-set ``entry`` is written as is, and the death handlers hear of it."""
        self.bury(entry)
        self._call_death_handlers(json.loads(entry), exc)

    def bury(self, payload: Payload | str) -> None:
        """Add to the dead set and trim it by age and size, atomically."""
        k = keys.of(self.redis)
        now = clock.now()
        body = payload if isinstance(payload, str) else dumps(payload)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zadd(k.DEAD, {body: now})
        trim_dead(pipe, now, self.dead_policy)

    @staticmethod
    def _exhausted(payload: Payload, count: int, setting: Any) -> bool:
        retry_for = payload.get("retry_for")
        if retry_for is None:
            return count >= max_retries(setting)
        first_failure = to_seconds(payload.get("failed_at")) or clock.now()
        return first_failure + float(retry_for) < clock.now()

    def _delay(
        self, spec: JobSpec | None, count: int, exc: BaseException, payload: Payload
    ) -> float | str:
        hook = spec.retry_in if spec else None
        if hook is not None:
            chosen = _call_hook(hook, payload, count, exc, payload)
            if chosen in ("discard", "kill"):
                return str(chosen)
            if isinstance(chosen, (int, float)) and not isinstance(chosen, bool) and chosen > 0:
                return float(chosen)
        return backoff_seconds(count, self.rng)

    def _call_death_handlers(self, payload: Payload, exc: BaseException) -> None:
        for handler in self.death_handlers:
            _call_hook(handler, payload, payload, exc)

    def _call_error_handlers(
        self, payload: Payload, queue: str, exc: BaseException, fate: Fate | None
    ) -> None:
        count = payload.get("retry_count")
        failure = Failure(
            job_class=str(payload.get("class")),
            jid=str(payload.get("jid")),
            queue=queue,
            retry_count=None if count is None else int(count),
            outcome="unrecorded" if fate is None else fate.outcome,
            retry_at=None if fate is None else fate.retry_at,
            payload=MappingProxyType(json.loads(dumps(payload))),  # a copy, not the job's
        )
        for handler in self.error_handlers:
            _call_hook(handler, payload, exc, failure)


def _count_failure(payload: Payload, now: float) -> int:
    if "retry_count" in payload:
        payload["retried_at"] = now
        payload["retry_count"] = int(payload["retry_count"]) + 1
    else:
        payload["failed_at"] = now
        payload["retry_count"] = 0
    return int(payload["retry_count"])


def _call_hook(hook: Callable[..., Any], payload: Payload, *args: Any) -> Any:
    """Run user code inside failure handling: its own error must not lose the job."""
    try:
        return hook(*args)
    except Exception:
        log.exception(
            "hook %s failed jid=%s class=%s",
            getattr(hook, "__name__", hook),
            payload.get("jid"),
            payload.get("class"),
        )
        return None
