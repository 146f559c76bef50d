"""Figures an operator watches: global counters and set sizes (``Stats``), and one row
per queue with its size, latency, limits, busy slots and pause flag
(``queue_overview``, what ``limitd queues`` prints).

Both are snapshots read in a fixed number of round trips, however many queues there
are: a dashboard refreshing every second must not cost one round trip per queue.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any, cast

import redis as redis_py

from limitd import clock, keys
from limitd.api.records import JobRecord
from limitd.client import connection_or_default
from limitd.connection import decode_name
from limitd.fair_queues import store as fair_store
from limitd.fair_queues.store import fair_queues
from limitd.queues import limits, rates
from limitd.queues.per_queue import hash_by_queue, queue_fields


class Stats:
    """A snapshot of the figures an operator watches, read when built and on
    ``refresh()``: two round trips, one MULTI for counters and set sizes, then the
    lengths of the queues it named (key names are built here, never in Lua)."""

    processed: int
    failed: int
    scheduled_size: int
    retry_size: int
    dead_size: int
    processes_size: int
    queues: dict[str, int]

    def __init__(self, redis: redis_py.Redis | None = None) -> None:
        self.redis = connection_or_default(redis)
        self.refresh()

    @property
    def enqueued(self) -> int:
        """Jobs waiting in all queues together."""
        return sum(self.queues.values())

    def refresh(self) -> None:
        k = keys.of(self.redis)
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(k.STAT_PROCESSED)
        pipe.get(k.STAT_FAILED)
        pipe.zcard(k.SCHEDULE)
        pipe.zcard(k.RETRY)
        pipe.zcard(k.DEAD)
        pipe.scard(k.PROCESSES)
        pipe.smembers(k.QUEUES)
        processed, failed, scheduled, retries, dead, processes, names = pipe.execute()
        self.processed, self.failed = int(processed or 0), int(failed or 0)
        self.scheduled_size, self.retry_size, self.dead_size = scheduled, retries, dead
        self.processes_size = processes
        self.queues = self._queue_sizes(sorted(map(decode_name, names)))

    def _queue_sizes(self, names: list[str]) -> dict[str, int]:
        k = keys.of(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(k.queue(name))
        return dict(zip(names, map(int, pipe.execute()), strict=True))


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """One queue at a glance. ``busy`` counts its jobs in progress in all capsules,
    the figure ``limit`` is checked against; a limit of None means unlimited.
    ``rate_limit`` reads like "100/minute"."""

    name: str
    size: int
    latency: float
    limit: int | None
    process_limit: int | None
    busy: int
    paused: bool
    rate_limit: str | None = None
    # A fair queue (limitd.fair_queues): ``size`` counts its tenants' lines too.
    fair: bool = False
    tenants_waiting: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as plain data, for JSON output."""
        return dataclasses.asdict(self)


def queue_overview(redis: redis_py.Redis | None = None) -> list[QueueStatus]:
    """Every queue an operator can steer, sorted by name: those named in ``queues`` and
    those with a stored limit, a pause flag or jobs in progress (an idle limited queue
    may have no list yet). Three round trips whatever the number of queues (in cluster
    mode, where each queue's state is its own, a few per queue)."""
    conn = connection_or_default(redis)
    k = keys.of(conn)
    stored_limits = limits.all_limits(conn)
    if k.cluster:  # per-queue state, queue by queue
        listed = conn.smembers(k.QUEUES)
        paused_raw: Any = limits.paused_queues(conn)
        busy_raw = hash_by_queue(conn, k.busy_of)
        rates_raw = hash_by_queue(conn, k.rate_limits_of)
        fair = fair_queues(conn)
    else:
        pipe = conn.pipeline(transaction=False)
        pipe.smembers(k.QUEUES)
        pipe.smembers(k.PAUSED)
        pipe.hgetall(k.BUSY)
        pipe.hgetall(k.RATE_LIMITS)
        pipe.hgetall(k.FAIR_QUEUES)
        listed, paused_raw, busy_raw, rates_raw, fair_raw = pipe.execute()
        busy_raw = queue_fields(busy_raw)
        fair = fair_store.settings_of(fair_raw)
    stored_rates = rates.rates_of(rates_raw)
    paused = set(map(decode_name, paused_raw))
    busy = {decode_name(queue): int(count) for queue, count in busy_raw.items()}
    names = set(map(decode_name, listed)) | stored_limits.keys() | stored_rates.keys() | paused
    names |= {queue for queue, count in busy.items() if count}
    names |= fair.keys()
    sizes = _sizes_and_latencies(conn, sorted(names))
    lines = _fair_lines(conn, sorted(fair))
    unlimited: dict[str, int | None] = {"limit": None, "process_limit": None}
    return [
        QueueStatus(
            name=name,
            size=size + lines.get(name, (0, 0))[0],
            latency=latency,
            limit=stored_limits.get(name, unlimited)["limit"],
            process_limit=stored_limits.get(name, unlimited)["process_limit"],
            busy=busy.get(name, 0),
            paused=name in paused,
            rate_limit=None if (rate := stored_rates.get(name)) is None else str(rate),
            fair=name in fair,
            tenants_waiting=lines[name][1] if name in lines else None,
        )
        for name, (size, latency) in sizes.items()
    ]


def _fair_lines(conn: redis_py.Redis, names: list[str]) -> dict[str, tuple[int, int]]:
    """Jobs and tenants waiting in each fair queue's lines, in one pipeline."""
    if not names:
        return {}
    k = keys.of(conn)
    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.hget(k.fair_part(name, "state"), "jobs")
        pipe.zcard(k.fair_part(name, "backlog"))
    replies = pipe.execute()
    return {
        name: (int(jobs or 0), int(tenants))
        for name, jobs, tenants in zip(names, replies[0::2], replies[1::2], strict=True)
    }


def _sizes_and_latencies(conn: redis_py.Redis, names: list[str]) -> dict[str, tuple[int, float]]:
    """Length and oldest-job age of each queue, in one pipeline."""
    k = keys.of(conn)
    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.llen(k.queue(name))
        pipe.lindex(k.queue(name), -1)
    replies = pipe.execute()
    result: dict[str, tuple[int, float]] = {}
    for name, size, oldest in zip(names, replies[0::2], replies[1::2], strict=True):
        result[name] = (int(size), 0.0 if oldest is None else JobRecord(oldest).latency())
    return result


def minute_history(
    redis: redis_py.Redis | None = None, minutes: int = 60
) -> list[tuple[float, int, int]]:
    """(minute start as epoch seconds, processed, failed) for each of the last
    ``minutes`` minutes, oldest first, the current one last; quiet minutes are zeros.
    Counts land in the minute their capsule flushed them (every heartbeat). One MGET."""
    conn = connection_or_default(redis)
    now_minute = int(clock.now() // 60)
    span = range(now_minute - minutes + 1, now_minute + 1)
    return _history(conn, [(m * 60.0, m) for m in span], keys.minute_stat)


def daily_history(
    redis: redis_py.Redis | None = None, days: int = 30
) -> list[tuple[str, int, int]]:
    """(UTC day, processed, failed) for each of the last ``days`` days, oldest first,
    today last, from Sidekiq's per-day keys. One MGET."""
    conn = connection_or_default(redis)
    today = dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc).date()
    names = [(today - dt.timedelta(days=back)).isoformat() for back in range(days - 1, -1, -1)]
    return _history(conn, [(name, name) for name in names], keys.daily_stat)


def _history(
    conn: redis_py.Redis,
    points: list[tuple[Any, Any]],
    key_of: Callable[[str, Any], str],
) -> list[Any]:
    k = keys.of(conn)
    stat_keys = [
        key_of(stat, part) for stat in (k.STAT_PROCESSED, k.STAT_FAILED) for _, part in points
    ]
    values = cast("list[bytes | None]", conn.mget(stat_keys)) if points else []
    processed, failed = values[: len(points)], values[len(points) :]
    return [
        (label, int(done or 0), int(bad or 0))
        for (label, _), done, bad in zip(points, processed, failed, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class RedisInfo:
    """The Redis server at a glance, as Sidekiq's dashboard shows it: its version, the
    memory it uses (``used_memory_human``, e.g. "1.21M") and its connected clients.
    None when the server does not say (a proxy may hide INFO fields)."""

    version: str | None
    used_memory_human: str | None
    connected_clients: int | None
    uptime_seconds: int | None

    def as_dict(self) -> dict[str, Any]:
        """The figures as plain data, for JSON output."""
        return dataclasses.asdict(self)


def redis_info(redis: redis_py.Redis | None = None) -> RedisInfo:
    """The server's version, memory and clients from one INFO call (its default
    sections, which are small; ``INFO everything`` would list every client's keyspace)."""
    info = connection_or_default(redis).info()

    def field(name: str) -> str | None:
        value = info.get(name)
        if value is None:
            return None
        return decode_name(value) if isinstance(value, bytes) else str(value)

    def count(name: str) -> int | None:
        value = field(name)
        return int(value) if value is not None and value.isdigit() else None

    return RedisInfo(
        version=field("redis_version"),
        used_memory_human=field("used_memory_human"),
        connected_clients=count("connected_clients"),
        uptime_seconds=count("uptime_in_seconds"),
    )
