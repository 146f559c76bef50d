"""A limiter's definition, its Redis state and the scripts that check it.

Each check is one atomic script call (``*_acquire.lua``), plus one to release a
concurrent slot. Time comes from :mod:`limitd.clock` and is passed to the scripts, so
every process (and a test under freezegun) agrees on it through one seam; the
processes sharing a limiter are assumed to have synchronised clocks (skew between hosts
shortens or lengthens windows and lock timeouts by that much).

The kinds:

- ``concurrent``: at most ``limit`` holders at once; a holder's lock expires after
  ``lock_timeout`` seconds, so one killed inside its block leaks nothing;
- ``bucket``: ``limit`` calls per calendar interval (per UTC minute, hour, day ...);
- ``window``: ``limit`` calls in any rolling interval;
- ``leaky``: a bucket of ``limit`` calls draining ``limit`` per interval: a burst of
  ``limit``, then a steady rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from limitd import keys
from limitd.connection import LuaScript
from limitd.middleware.work import RedisClient

PACKAGE = __package__ or "limitd.limiters"
KINDS = ("concurrent", "bucket", "window", "leaky")
INTERVALS = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
DEFAULT_TTL = 90 * 86400.0  # an unused limiter's stats and index entry go after this
DEFAULT_LOCK_TIMEOUT = 30.0
DEFAULT_WAIT_TIMEOUT = 5.0

_LIB = ("limiter_lib.lua",)
ACQUIRE = {kind: LuaScript(PACKAGE, f"limiter_{kind}_acquire.lua", prelude=_LIB) for kind in KINDS}
RELEASE = LuaScript(PACKAGE, "limiter_concurrent_release.lua")


class OverLimit(Exception):
    """No room appeared within the limiter's ``wait_timeout``. Escaping a job, it
    reschedules the job instead of failing it (see :mod:`limitd.limiters.middleware`)."""

    wire_name = "limitd.OverLimit"

    def __init__(self, name: str, kind: str, waited: float) -> None:
        super().__init__(f"limiter {name!r} ({kind}) is over its limit (waited {waited:.3f}s)")
        self.name = name
        self.kind = kind
        self.waited = waited


@dataclass(frozen=True)
class Definition:
    """What a limiter is; ``period`` is the interval, or the lock timeout of a
    concurrent limiter, in seconds."""

    name: str
    kind: str
    limit: int
    period: float
    ttl: float = DEFAULT_TTL

    def __post_init__(self) -> None:
        where = f"limiter {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"limiter name must be a non-empty string, not {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"{where}: count must be a whole number >= 1, not {self.limit!r}")
        if not self.ttl > 0:
            raise ValueError(f"{where}: ttl must be a positive number of seconds, not {self.ttl!r}")


def parse_interval(name: str, value: Any) -> float:
    """Seconds from a number (a millisecond at least) or one of ``second``, ``minute``, ``hour``,
    ``day``; a ValueError naming the limiter and the value otherwise."""
    if isinstance(value, str) and value in INTERVALS:
        return INTERVALS[value]
    # Waits and interval starts are counted in milliseconds: a shorter interval could
    # not be told from the next one.
    if _finite_number(value) and value >= 0.001:
        return float(value)
    names = ", ".join(repr(n) for n in INTERVALS)
    raise ValueError(
        f"limiter {name!r}: interval {value!r} is not a number of seconds >= 0.001 "
        f"or one of {names}"
    )


def positive_seconds(name: str, what: str, value: Any, *, zero: bool = False) -> float:
    """A duration option (``lock_timeout``, ``wait_timeout``), checked at definition."""
    if _finite_number(value) and (value > 0 or (zero and value == 0)):
        return float(value)
    expected = "a number of seconds >= 0" if zero else "a positive number of seconds"
    raise ValueError(f"limiter {name!r}: {what} {value!r} is not {expected}")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def interval_bounds(now: float, interval: float) -> tuple[str, float]:
    """The start and end of the calendar interval holding ``now``. Counted from the
    epoch, so minutes, hours and days start where UTC's do. The start names the
    interval's counter: in whole seconds when it is one (every second, minute, hour and
    day), else to the millisecond, so that two intervals within one second (a bucket of
    0.3 s) never share a counter."""
    start = math.floor(now / interval) * interval
    ms = round(start * 1000)
    label = str(ms // 1000) if ms % 1000 == 0 else f"{ms // 1000}.{ms % 1000:03d}"
    return label, start + interval


def state_key(layout: keys.KeyLayout, definition: Definition, now: float) -> str:
    if definition.kind == "concurrent":
        return layout.limiter("holders", definition.name)
    if definition.kind == "bucket":
        return layout.limiter_bucket(definition.name, interval_bounds(now, definition.period)[0])
    return layout.limiter(definition.kind, definition.name)


Call = tuple[LuaScript, list[Any], list[Any]]  # a script, its keys and its arguments


def acquire_call(
    layout: keys.KeyLayout,
    definition: Definition,
    now: float,
    token: str,
    *,
    attempt: int,
    waited: float,
) -> Call:
    """One try's script call, built without doing it: the sync and the async
    ``within_limit`` make the very same call, each on its own connection."""
    name = definition.name
    script_keys = [state_key(layout, definition, now)]
    if definition.kind == "concurrent":
        script_keys.append(wake_key(layout, definition))
    script_keys += [layout.limiter("stats", name), layout.LIMITERS]
    finish = interval_bounds(now, definition.period)[1] if definition.kind == "bucket" else 0
    args = [repr(now), definition.limit, repr(definition.period), token, attempt]
    args += [round(waited * 1000), math.ceil(definition.ttl), name, definition.kind, repr(finish)]
    return ACQUIRE[definition.kind], script_keys, args


def acquire_reply(reply: Any) -> tuple[bool, float]:
    """What a try's script said: (taken, seconds until room may appear when not taken)."""
    allowed, wait_ms = reply
    return bool(allowed), int(wait_ms) / 1000


def release_call(layout: keys.KeyLayout, definition: Definition, token: str, held: float) -> Call:
    """The script call giving back a concurrent slot held ``held`` seconds."""
    name = definition.name
    holders, stats = layout.limiter("holders", name), layout.limiter("stats", name)
    script_keys = [holders, wake_key(layout, definition), stats]
    lock_ms = math.ceil(definition.period * 1000)
    return RELEASE, script_keys, [token, round(held * 1000), definition.limit, lock_ms]


def release(redis: RedisClient, definition: Definition, token: str, held: float) -> bool:
    """Give back a concurrent slot; False when its lock had expired meanwhile."""
    script, script_keys, args = release_call(keys.of(redis), definition, token, held)
    return bool(script(redis, script_keys, args))


def wake_key(layout: keys.KeyLayout, definition: Definition) -> str:
    """A concurrent limiter's wake list: every release pushes to it, and waiters block on
    it (BLPOP). A release pushed while a waiter was between its try and its BLPOP is
    still there when it blocks, so no release is missed."""
    return layout.limiter("wake", definition.name)


def queue_over_limit(pipe: Any, definition: Definition) -> None:
    """Count a check that gave up (its calls were counted by the scripts), on a sync or
    an asyncio pipeline the caller then executes."""
    k = keys.of(pipe)
    stats = k.limiter("stats", definition.name)
    pipe.hincrby(stats, "over_limit", 1)
    pipe.expire(stats, math.ceil(definition.ttl))


def record_over_limit(redis: RedisClient, definition: Definition) -> None:
    pipe = redis.pipeline(transaction=False)
    queue_over_limit(pipe, definition)
    pipe.execute()


def held_now(redis: RedisClient, name: str, now: float) -> int:
    """Holders of a concurrent limiter whose lock has not expired."""
    k = keys.of(redis)
    return int(redis.zcount(k.limiter("holders", name), f"({now!r}", "+inf"))
