"""Limiters for operators: each one used within its ``ttl``, with its statistics.

The index (``limitd:limiters``, name -> last use) may outlive a limiter whose stats
hash expired; listing drops those entries as it meets them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from limitd import clock, keys
from limitd.limiters.store import held_now, interval_bounds


@dataclass(frozen=True)
class LimiterStatus:
    """One limiter's definition and counters. ``calls`` = ``immediate`` + ``waited`` +
    ``over_limit`` (+ checks still waiting); ``held`` is the number of live holders
    (concurrent only); hold times are measured for concurrent limiters only."""

    name: str
    kind: str
    limit: int
    period: float
    calls: int
    immediate: int
    waited: int
    over_limit: int
    average_wait: float  # seconds, over the checks that waited and got in
    average_hold: float  # seconds, over released concurrent slots
    expired: int  # concurrent slots whose lock ran out before release
    held: int | None
    last_used: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def limiters(redis: Any) -> list[LimiterStatus]:
    """Every limiter used within its ttl, most recently used first."""
    k = keys.of(redis)
    entries = redis.zrevrange(k.LIMITERS, 0, -1, withscores=True)
    names = [raw.decode(errors="replace") for raw, _ in entries]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(k.limiter("stats", name))
    found, gone = [], []
    for (raw, last_used), name, stats in zip(entries, names, pipe.execute(), strict=True):
        if not stats:
            gone.append(raw)
            continue
        found.append(
            _status(redis, name, {k.decode(): v.decode() for k, v in stats.items()}, last_used)
        )
    if gone:
        redis.zrem(k.LIMITERS, *gone)
    return found


def _status(redis: Any, name: str, stats: dict[str, str], last_used: float) -> LimiterStatus:
    def count(field: str) -> int:
        return int(stats.get(field, 0))

    waited, holds = count("waited"), count("holds")
    kind = stats.get("kind", "?")
    return LimiterStatus(
        name=name,
        kind=kind,
        limit=count("limit"),
        period=float(stats.get("period", 0)),
        calls=count("calls"),
        immediate=count("immediate"),
        waited=waited,
        over_limit=count("over_limit"),
        average_wait=count("wait_ms") / waited / 1000 if waited else 0.0,
        average_hold=count("hold_ms") / holds / 1000 if holds else 0.0,
        expired=count("expired"),
        held=held_now(redis, name, clock.now()) if kind == "concurrent" else None,
        last_used=float(last_used),
    )


def limiter_usage(
    redis: Any, statuses: list[LimiterStatus], now: float | None = None
) -> dict[str, float]:
    """How full each limiter is now, by name, in one round trip however many: a
    concurrent limiter's live holders (its ``held``), a bucket's calls in the current
    calendar interval, a window's calls in the last interval, a leaky bucket's level
    drained to now. What the dashboard shows next to each limit."""
    at = clock.now() if now is None else now
    pipe = redis.pipeline(transaction=False)
    for status in statuses:
        _queue_usage(pipe, status, at)
    replies = iter(pipe.execute())
    return {status.name: _usage(status, replies, at) for status in statuses}


def _queue_usage(pipe: Any, status: LimiterStatus, now: float) -> None:
    k = keys.of(pipe)
    if status.kind == "bucket" and status.period > 0:
        pipe.get(k.limiter_bucket(status.name, interval_bounds(now, status.period)[0]))
    elif status.kind == "window":
        pipe.zcount(k.limiter("window", status.name), f"({now - status.period!r}", "+inf")
    elif status.kind == "leaky":
        pipe.hmget(k.limiter("leaky", status.name), "level", "at")


def _usage(status: LimiterStatus, replies: Any, now: float) -> float:
    if status.kind == "bucket" and status.period > 0:
        return float(next(replies) or 0)
    if status.kind == "window":
        return float(next(replies))
    if status.kind == "leaky":
        level, at = next(replies)
        if level is None or status.period <= 0:
            return 0.0
        drained = max(0.0, now - float(at or now)) * status.limit / status.period
        return max(0.0, float(level) - drained)
    return float(status.held or 0)


__all__ = ["LimiterStatus", "limiter_usage", "limiters"]
