"""The Redis state of limited-capacity jobs, and the atomic steps that change it.

Per job class (its wire name ``N``), three keys sharing one hash slot:

- ``limitd:capacity:{N}:running``: zset jid -> lease deadline, the copies running;
- ``limitd:capacity:{N}:queued``: zset jid -> reservation deadline, the copies pushed
  but not started;
- ``limitd:capacity:{N}:state``: hash of what the gauges show (``max_running_jobs``,
  ``remaining_work_count``, ``updated_at``);

and one index of the classes refilled, ``limitd:capacity:names`` (zset name -> last
refill), which the listing and the gauges read.

A place is reserved (``queued``) before a copy is pushed and becomes a running place
when the copy starts, so the queue and the running copies together never exceed
``max_running_jobs``. Nothing can leak: a running copy holds a lease that its process
renews (``limitd.capacity.leases``); a copy killed by SIGKILL stops renewing, and the
next script to look drops it. A copy requeued after its process died runs again under
the same jid and keeps its place. A reservation whose copy never starts (deleted from
its queue, say) runs out after ``queued_ttl``.

Time comes from :mod:`limitd.clock` and is passed to the scripts, as for the limiters:
the processes running one class need synchronised clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from limitd import clock, keys
from limitd.connection import LuaScript
from limitd.middleware.work import RedisClient

PACKAGE = __package__ or "limitd.capacity"
_LIB = ("capacity_lib.lua",)
RESERVE = LuaScript(PACKAGE, "capacity_reserve.lua", prelude=_LIB)
CLAIM = LuaScript(PACKAGE, "capacity_claim.lua", prelude=_LIB)
FINISH = LuaScript(PACKAGE, "capacity_finish.lua", prelude=_LIB)
RENEW = LuaScript(PACKAGE, "capacity_renew.lua")


def names_key(layout: keys.KeyLayout) -> str:
    """Zset of refilled classes."""
    return layout.LIMITD_PREFIX + "capacity:names"


NAMES_TTL = 30 * 86400.0  # a class not refilled this long leaves the listing and the gauges
NO_SUCCESSOR = -1


def running_key(layout: keys.KeyLayout, name: str) -> str:
    return f"{layout.LIMITD_PREFIX}capacity:{{{name}}}:running"


def queued_key(layout: keys.KeyLayout, name: str) -> str:
    return f"{layout.LIMITD_PREFIX}capacity:{{{name}}}:queued"


def state_key(layout: keys.KeyLayout, name: str) -> str:
    return f"{layout.LIMITD_PREFIX}capacity:{{{name}}}:state"


@dataclass(frozen=True)
class Timing:
    """How long a running copy's lease lasts without renewal, and how long a reserved
    place waits for its copy to start (a copy stuck behind a long queue longer than
    this may let one more copy be queued; it still starts only if a place is free)."""

    lease: float = 60.0
    queued_ttl: float = 3600.0

    def __post_init__(self) -> None:
        for field_name in ("lease", "queued_ttl"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"capacity {field_name} must be seconds > 0, not {value!r}")


class CapacityStore:
    """One job class's capacity, on one Redis."""

    def __init__(self, redis: RedisClient, name: str, timing: Timing | None = None) -> None:
        self.redis = redis
        self.name = name
        self.timing = timing or Timing()
        k = keys.of(redis)
        self.keys = (running_key(k, name), queued_key(k, name), state_key(k, name))

    def reserve(self, maximum: int, remaining: int, jids: Sequence[str]) -> list[str]:
        """Reserve places for copies, at most the free capacity and ``remaining``:
        returns the jids whose copies the caller must now push."""
        args = [clock.now(), maximum, self.timing.queued_ttl, max(0, remaining), *jids]
        reserved = int(self._call(RESERVE, args, index=True))
        return list(jids[:reserved])

    def unreserve(self, jids: Sequence[str]) -> None:
        """Give back places reserved for copies that were not pushed."""
        if jids:
            self.redis.zrem(self.keys[1], *jids)

    def claim(self, jid: str, maximum: int) -> bool:
        """A copy starts: True if it got a running place (see ``capacity_claim.lua``)."""
        return bool(self._call(CLAIM, [clock.now(), maximum, jid, self.timing.lease]))

    def finish(self, jid: str, maximum: int, remaining: int, successor: str) -> bool:
        """Free the copy's place; reserve one for ``successor`` when ``remaining`` > 0
        and capacity allows (``NO_SUCCESSOR`` after a failure). True: push it."""
        args = [clock.now(), maximum, jid, remaining, successor, self.timing.queued_ttl]
        return bool(self._call(FINISH, args))

    def renew(self, jids: Sequence[str]) -> int:
        """Extend the leases of ``jids``; returns how many were still valid."""
        now = clock.now()
        return int(RENEW(self.redis, self.keys[:1], [now, now + self.timing.lease, *jids]))

    def _call(self, script: LuaScript, args: list[Any], *, index: bool = False) -> Any:
        """One EVALSHA (no pipeline: redis-py's would check SCRIPT EXISTS first, a
        round trip per call). ``index``: also note the class in the index of classes,
        another key slot the script cannot write; refills do, so the listing and the
        gauges know every class that is refilled."""
        reply = script(self.redis, self.keys, args)
        if index:
            self.redis.zadd(names_key(keys.of(self.redis)), {self.name: clock.now()})
        return reply


@dataclass(frozen=True)
class CapacityState:
    """A class's capacity as the gauges and ``limitd capacity`` show it.
    ``max_running_jobs`` and ``remaining_work_count`` are the values read by the last
    refill or copy (None before any); ``updated_at`` is when (epoch seconds)."""

    name: str
    running: int
    queued: int
    max_running_jobs: int | None
    remaining_work_count: int | None
    updated_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_states(redis: RedisClient) -> list[CapacityState]:
    """Every class refilled in the last ``NAMES_TTL``, in two round trips whatever their
    number. Expired leases and reservations are not counted, pruned or not."""
    now = clock.now()
    k = keys.of(redis)
    pipe = redis.pipeline(transaction=False)
    pipe.zremrangebyscore(names_key(k), "-inf", now - NAMES_TTL)
    pipe.zrange(names_key(k), 0, -1)
    names = [member.decode() for member in pipe.execute()[1]]
    if not names:
        return []
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.zcount(running_key(k, name), f"({now}", "+inf")
        pipe.zcount(queued_key(k, name), f"({now}", "+inf")
        pipe.hmget(state_key(k, name), "max_running_jobs", "remaining_work_count", "updated_at")
    replies = pipe.execute()
    states = []
    for index, name in enumerate(names):
        running, queued, (maximum, remaining, updated) = replies[3 * index : 3 * index + 3]
        states.append(
            CapacityState(
                name,
                int(running),
                int(queued),
                _number(maximum, int),
                _number(remaining, int),
                _number(updated, float),
            )
        )
    return states


def _number(raw: bytes | None, kind: type[Any]) -> Any:
    return None if raw is None else kind(float(raw))
