"""Queue limits, pause and busy counts as stored in Redis, for the server and the API.

Limits live in two hashes (``limitd:limits`` for all capsules together,
``limitd:process_limits`` per capsule). A limit cleared at run time is stored as
``none`` rather than deleted, so capsules re-applying their configured defaults (which
they do only where no value exists) do not bring it back. Resetting a queue to its
configured limit deletes the value: the next capsule heartbeat writes the default.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import redis as redis_py

from limitd import keys
from limitd.connection import pipeline, set_members
from limitd.queues.per_queue import forget_applied, hash_by_queue, queue_fields
from limitd.queues.rates import Rate, parse_rate

NO_LIMIT = "none"


@dataclass(frozen=True)
class LimitSettings:
    """Limits from configuration: defaults that runtime changes override. Rate limits
    (``limitd.fetch.rates``) follow the same rules."""

    limits: Mapping[str, int] = field(default_factory=dict)
    process_limits: Mapping[str, int] = field(default_factory=dict)
    rate_limits: Mapping[str, Rate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind, values in (("limits", self.limits), ("process_limits", self.process_limits)):
            for queue, value in values.items():
                check_limit(value, f"{kind}.{queue}")
        for queue, rate in self.rate_limits.items():
            try:
                parse_rate(rate)
            except ValueError as exc:
                raise ValueError(f"rate_limits.{queue}: {exc}") from None

    def apply_defaults(self, redis: redis_py.Redis) -> None:
        """Write each configured limit unless Redis already has a value (a runtime change,
        or the same default). Idempotent: run at start and on every heartbeat, it also
        restores the limits after Redis lost its data. Standalone, a marker of what was
        written (``LIMITS_APPLIED``, which a data loss loses too and a reset deletes)
        lets a heartbeat check a few keys instead of writing one field per queue."""
        k = keys.of(redis)
        if not self.limits and not self.process_limits and not self.rate_limits:
            return
        if not k.cluster and self._still_applied(redis):
            return
        pipe = pipeline(redis)
        for queue, value in self.limits.items():
            pipe.hsetnx(k.limits_of(queue), queue, value)
        for queue, value in self.process_limits.items():
            pipe.hsetnx(k.process_limits_of(queue), queue, value)
        for queue, rate in self.rate_limits.items():
            pipe.hsetnx(k.rate_limits_of(queue), queue, parse_rate(rate).stored())
        if not k.cluster:
            pipe.sadd(k.LIMITS_APPLIED, self._digest)
        pipe.execute()

    def _still_applied(self, redis: redis_py.Redis) -> bool:
        """Whether this config's limits were written and nothing lost them since: the
        marker is there, and so is every hash they were written to."""
        k = keys.of(redis)
        written = [
            hash_key
            for hash_key, configured in (
                (k.LIMITS, self.limits),
                (k.PROCESS_LIMITS, self.process_limits),
                (k.RATE_LIMITS, self.rate_limits),
            )
            if configured
        ]
        pipe = pipeline(redis)
        pipe.sismember(k.LIMITS_APPLIED, self._digest)
        pipe.exists(*written)
        marked, found = pipe.execute()
        return bool(marked) and found == len(written)

    @functools.cached_property
    def _digest(self) -> str:
        """What the marker records: the settings, hashed once (they do not change)."""
        configured = {
            "limits": sorted(self.limits.items()),
            "process_limits": sorted(self.process_limits.items()),
            "rate_limits": sorted((q, parse_rate(r).stored()) for q, r in self.rate_limits.items()),
        }
        return hashlib.sha1(json.dumps(configured).encode()).hexdigest()


def check_limit(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: a limit must be an integer >= 0, got {value!r}")
    return value


def _hash(redis: redis_py.Redis, process: bool, queue: str) -> str:
    layout = keys.of(redis)
    return layout.process_limits_of(queue) if process else layout.limits_of(queue)


def get_limit(redis: redis_py.Redis, queue: str, *, process: bool = False) -> int | None:
    """The limit in force, or None when the queue has none."""
    raw = redis.hget(_hash(redis, process, queue), queue)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def set_limit(redis: redis_py.Redis, queue: str, value: int, *, process: bool = False) -> None:
    """Change a limit now; running capsules apply it on their next fetch."""
    pipe = pipeline(redis)
    pipe.hset(_hash(redis, process, queue), queue, check_limit(value, queue))
    pipe.publish(keys.WAKE_CHANNEL, queue)  # a raised limit may make jobs fetchable
    pipe.execute()


def clear_limit(redis: redis_py.Redis, queue: str, *, process: bool = False) -> None:
    """Remove the limit, and keep it removed even if configuration sets one."""
    pipe = pipeline(redis)
    pipe.hset(_hash(redis, process, queue), queue, NO_LIMIT)
    pipe.publish(keys.WAKE_CHANNEL, queue)
    pipe.execute()


def reset_limit(redis: redis_py.Redis, queue: str, *, process: bool = False) -> None:
    """Forget the runtime value: capsules write their configured default at their next
    heartbeat (or leave the queue unlimited if they configure none)."""
    redis.hdel(_hash(redis, process, queue), queue)
    forget_applied(redis)


def pause(redis: redis_py.Redis, queue: str) -> None:
    """Stop fetching from ``queue``; jobs already running finish, limits are kept."""
    k = keys.of(redis)
    redis.sadd(k.paused_of(queue), queue)


def resume(redis: redis_py.Redis, queue: str) -> None:
    k = keys.of(redis)
    pipe = pipeline(redis)
    pipe.srem(k.paused_of(queue), queue)
    pipe.publish(keys.WAKE_CHANNEL, queue)
    pipe.execute()


def is_paused(redis: redis_py.Redis, queue: str) -> bool:
    k = keys.of(redis)
    return bool(redis.sismember(k.paused_of(queue), queue))


def busy(redis: redis_py.Redis, queue: str) -> int:
    """Jobs of ``queue`` in progress in all capsules."""
    k = keys.of(redis)
    return int(cast("bytes | None", redis.hget(k.busy_of(queue), queue)) or 0)


def busy_by_capsule(redis: redis_py.Redis, queue: str) -> dict[str, int]:
    """Jobs of ``queue`` in progress, per capsule id (capsules running none omitted)."""
    k = keys.of(redis)
    capsules = set_members(redis, k.capsules_of(queue))
    pipe = pipeline(redis)
    for capsule in capsules:
        pipe.llen(k.in_progress(capsule, queue))
    counts = pipe.execute()
    return {c: int(n) for c, n in zip(capsules, counts, strict=True) if n}


def paused_queues(redis: redis_py.Redis) -> set[str]:
    """Every paused queue (in cluster mode, of those Redis knows)."""
    k = keys.of(redis)
    if not k.cluster:
        return set(set_members(redis, k.PAUSED))
    return {name for name in set_members(redis, k.QUEUES) if is_paused(redis, name)}


def all_limits(redis: redis_py.Redis) -> dict[str, dict[str, int | None]]:
    """Every queue with a stored limit: ``{queue: {"limit": n, "process_limit": m}}``."""
    k = keys.of(redis)
    if k.cluster:
        limits = hash_by_queue(redis, k.limits_of)
        process_limits = hash_by_queue(redis, k.process_limits_of)
    else:  # one round trip
        pipe = pipeline(redis)
        pipe.hgetall(k.LIMITS)
        pipe.hgetall(k.PROCESS_LIMITS)
        limits, process_limits = map(queue_fields, pipe.execute())
    result: dict[str, dict[str, int | None]] = {}
    for kind, values in (("limit", limits), ("process_limit", process_limits)):
        for queue, raw in values.items():
            entry = result.setdefault(queue.decode(), {"limit": None, "process_limit": None})
            entry[kind] = int(raw) if raw.isdigit() else None
    return result
