"""Queue rate limits: how many jobs of a queue may *start* per interval, as stored in Redis.

A rate limit sits beside a queue's concurrency limits: ``"100/minute"`` lets the limit
fetch take at most one job of the queue every 0.6 s, so no window of a minute ever holds
more than 100 starts. From 200 per interval on, up to 1% of N may start together, paid
for by a slightly longer spacing (``Rate.burst``, ``Rate.interval``). It lives in the
hash ``limitd:rate_limits`` (queue -> ``"count/seconds"``), with the same override
rules as the concurrency limits (see ``limitd.fetch.limits``): configuration writes a
value only where Redis has none, a limit cleared at run time is stored as ``none`` so
configuration does not bring it back, and a reset deletes the value so the configured
one returns at the next heartbeat.

The fetch script keeps, per rate-limited queue, the earliest time its next job may be
taken (``limitd:rate:<queue>``; see ``limit_fetch.lua`` for the guarantee).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import redis as redis_py

from limitd import keys
from limitd.connection import pipeline
from limitd.queues.per_queue import forget_applied, hash_by_queue

NO_RATE = "none"
UNITS = {"second": 1, "minute": 60, "hour": 3_600, "day": 86_400}
FORMS = "'N/second', 'N/minute', 'N/hour', 'N/day' or 'N/<seconds>s' with an integer N >= 1"
_TEXT = re.compile(r"\s*(\d+)\s*/\s*(?:(second|minute|hour|day)|(\d+(?:\.\d+)?)s)\s*")
_STORED = re.compile(r"(\d+)/(\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` job starts in any window of ``seconds``."""

    count: int
    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"a rate's count must be an integer >= 1, got {self.count!r}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"a rate's interval must be > 0 seconds, got {self.seconds!r}")

    @property
    def burst(self) -> int:
        """Jobs that may start at the same moment: 1 below 200 per interval, else 1% of
        the count. (A fetch call reads the clock once: without a burst a fast queue could
        give one job per call.)"""
        return max(1, self.count // 100)

    @property
    def interval(self) -> float:
        """Seconds between starts after a burst: ``seconds / (count - burst + 1)``, so
        that no window of ``seconds`` ever holds more than ``count`` starts."""
        return self.seconds / (self.count - self.burst + 1)

    def stored(self) -> str:
        """The form kept in Redis and read by the fetch script: ``count/seconds``."""
        return f"{self.count}/{_number(self.seconds)}"

    def __str__(self) -> str:
        """The form configuration and the command line take: ``100/minute``, ``10/30s``."""
        for unit, seconds in UNITS.items():
            if self.seconds == seconds:
                return f"{self.count}/{unit}"
        return f"{self.count}/{_number(self.seconds)}s"


def parse_rate(value: object) -> Rate:
    """A ``Rate`` from ``"100/minute"``-style text (or a ``Rate``); ValueError naming the
    accepted forms otherwise."""
    if isinstance(value, Rate):
        return value
    found = _TEXT.fullmatch(value) if isinstance(value, str) else None
    if found is not None:
        count, unit, seconds = found.groups()
        interval = UNITS[unit] if unit else float(seconds)
        if int(count) >= 1 and interval > 0:
            return Rate(int(count), interval)
    raise ValueError(f"expected a rate {FORMS}, got {value!r}")


def _number(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _from_stored(raw: bytes | str | None) -> Rate | None:
    text = raw.decode() if isinstance(raw, bytes) else raw
    found = _STORED.fullmatch(text) if text is not None else None
    if found is None:
        return None  # absent, cleared ("none") or written by hand in another form
    try:
        return Rate(int(found.group(1)), float(found.group(2)))
    except ValueError:
        return None


def get_rate(redis: redis_py.Redis, queue: str) -> Rate | None:
    """The rate limit in force, or None when the queue has none."""
    k = keys.of(redis)
    return _from_stored(redis.hget(k.rate_limits_of(queue), queue))


def set_rate(redis: redis_py.Redis, queue: str, rate: Rate | str) -> Rate:
    """Change the rate now; running capsules apply it on their next fetch. A queue's
    schedule is left alone: the fetch caps it to one interval of the new rate."""
    k = keys.of(redis)
    checked = parse_rate(rate)
    pipe = pipeline(redis)
    pipe.hset(k.rate_limits_of(queue), queue, checked.stored())
    pipe.publish(keys.WAKE_CHANNEL, queue)  # a faster rate may make jobs fetchable now
    pipe.execute()
    return checked


def clear_rate(redis: redis_py.Redis, queue: str) -> None:
    """Remove the rate limit, and keep it removed even if configuration sets one."""
    k = keys.of(redis)
    pipe = pipeline(redis)
    pipe.hset(k.rate_limits_of(queue), queue, NO_RATE)
    pipe.publish(keys.WAKE_CHANNEL, queue)
    pipe.execute()


def reset_rate(redis: redis_py.Redis, queue: str) -> None:
    """Forget the run-time value: capsules write their configured rate at their next
    heartbeat (or leave the queue without one)."""
    k = keys.of(redis)
    redis.hdel(k.rate_limits_of(queue), queue)
    forget_applied(redis)


def all_rates(redis: redis_py.Redis) -> dict[str, Rate | None]:
    """Every queue with a stored value; None for a cleared one."""
    k = keys.of(redis)
    return rates_of(hash_by_queue(redis, k.rate_limits_of))


def rates_of(stored: dict[bytes, bytes]) -> dict[str, Rate | None]:
    """The ``limitd:rate_limits`` hash as read (HGETALL), as rates by queue name."""
    return {queue.decode(): _from_stored(raw) for queue, raw in stored.items()}
