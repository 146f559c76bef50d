"""A fair queue's settings and state in Redis, for the config, the admin API, the
commands, the dashboard and the metrics. The fetch itself reads and moves the lines in
its own script (``limitd/fetch/limit_fetch.lua`` with ``fair_lib.lua``).

Settings: ``limitd:fair_queues`` holds, per queue, ``fair``, ``fair/<tenant limit>``
or ``off`` (made plain at run time: the config does not make it fair again), like the
limits; tenant weights are in the queue's ``<base>:weights`` hash.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, cast

import redis as redis_py

from limitd import keys, options
from limitd.connection import LuaScript, pipeline


@functools.cache
def script(filename: str) -> LuaScript:
    """An admin script of this folder, with the fetch's fair_lib.lua before it; read
    when first used (``import limitd`` loads this module for the settings alone)."""
    fair_lib = ("limitd.fetch", "fair_lib.lua")
    return LuaScript(__package__ or "limitd.fair_queues", filename, (fair_lib,))


MAX_TENANT_BYTES = options.MAX_TENANT_BYTES  # as fair_lib.lua's FAIR_TENANT_MAX
_SETTING = re.compile(r"^fair(?:/(\d+))?$")


@dataclass(frozen=True)
class FairSetting:
    """A queue made fair; ``tenant_limit``: jobs of one tenant running at once, across
    every process (None: no limit); ``weights``: tenant -> turns per round (default 1)."""

    tenant_limit: int | None = None
    weights: dict[str, int] = field(default_factory=dict)

    def stored(self) -> str:
        return "fair" if self.tenant_limit is None else f"fair/{self.tenant_limit}"


def parse_stored(raw: bytes | str | None) -> FairSetting | None:
    """The setting a stored value means; None for a plain queue (absent, or ``off``)."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    found = _SETTING.match(text)
    if not found:
        return None
    return FairSetting(tenant_limit=int(found.group(1)) if found.group(1) else None)


def check_tenant_limit(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: tenant_limit must be an integer >= 1, got {value!r}")
    return value


def check_weight(tenant: object, weight: object, where: str) -> None:
    check_tenant(tenant, where)
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
        raise ValueError(f"{where}: weight of {tenant!r} must be an integer >= 1, got {weight!r}")


def check_tenant(tenant: object, where: str) -> str:
    """A tenant id as a fair queue keeps it: a non-empty string of at most 1 KB."""
    try:
        return options.tenant_id(tenant)
    except ValueError as exc:
        shown = repr(tenant) if len(repr(tenant)) <= 40 else repr(tenant)[:37] + "..."
        raise ValueError(f"{where}: fair_tenant={shown}: {exc}") from None


def weights_key(redis: redis_py.Redis, queue: str) -> str:
    return keys.of(redis).fair_part(queue, "weights")


def make_fair(
    redis: redis_py.Redis, queue: str, setting: FairSetting, *, only_if_unset: bool = False
) -> bool:
    """Make ``queue`` fair now (running capsules apply it at their next fetch), with its
    tenant limit and weights. ``only_if_unset``: as a configured default, only where
    Redis holds no value (a run-time change, ``off`` included, wins). Returns whether
    the setting was written."""
    k = keys.of(redis)
    pipe = pipeline(redis)
    if only_if_unset:
        pipe.hsetnx(k.fair_queues_of(queue), queue, setting.stored())
    else:
        pipe.hset(k.fair_queues_of(queue), queue, setting.stored())
    weights = weights_key(redis, queue)
    for tenant, weight in setting.weights.items():
        if only_if_unset:
            pipe.hsetnx(weights, tenant, weight)
        else:
            pipe.hset(weights, tenant, weight)
    pipe.publish(keys.WAKE_CHANNEL, queue)
    return bool(pipe.execute()[0])


def set_weight(redis: redis_py.Redis, queue: str, tenant: str, weight: int) -> None:
    """A tenant's turns per round (1 by default); applies from its next turn."""
    check_weight(tenant, weight, f"queue {queue!r}")
    redis.hset(weights_key(redis, queue), tenant, weight)


def make_plain(redis: redis_py.Redis, queue: str) -> int:
    """Make ``queue`` plain, and keep it so even where configuration makes it fair: its
    tenants' jobs go back to its list, in the order turns would have given them.
    Returns how many jobs went back."""
    k = keys.of(redis)
    script_keys = [k.queue(queue), k.fair_queues_of(queue), k.fair_queue(queue)]
    moved = int(script("fair_plain.lua")(redis, script_keys, [queue]))
    redis.publish(keys.WAKE_CHANNEL, queue)
    return moved


def reset(redis: redis_py.Redis, queue: str) -> None:
    """Forget the run-time setting: the configured one applies again (at the next start
    or housekeeping), or the queue stays as it is now if the config names none."""
    k = keys.of(redis)
    redis.hdel(k.fair_queues_of(queue), queue)


def clear_lines(redis: redis_py.Redis, queue: str) -> int:
    """Drop the jobs waiting in the queue's tenant lines; returns how many."""
    return int(script("fair_clear.lua")(redis, [keys.of(redis).fair_queue(queue)], []))


@dataclass(frozen=True)
class TenantLoad:
    """One tenant of a fair queue: jobs waiting in its line, and running."""

    tenant: str
    waiting: int
    running: int


@dataclass(frozen=True)
class FairQueueStatus:
    """A fair queue at a glance: its jobs waiting in tenant lines (and not sorted yet,
    ``arrivals``), how many tenants wait, and the largest tenants by backlog."""

    queue: str
    tenant_limit: int | None
    jobs_waiting: int
    arrivals: int
    tenants_waiting: int
    largest: list[TenantLoad]
    # False when ranking met LARGEST_READ_MAX: then ``largest`` is the largest of the
    # lines read, and the next call reads on from where this one stopped.
    largest_exact: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "tenant_limit": self.tenant_limit,
            "jobs_waiting": self.jobs_waiting,
            "arrivals": self.arrivals,
            "tenants_waiting": self.tenants_waiting,
            "largest": [load.__dict__ for load in self.largest],
            "largest_exact": self.largest_exact,
        }


# At most this many tenants' lines are read to rank the largest in one status call.
# The fetch leaves each tenant's backlog score at its length when a job last joined
# (fair_lib.lua), an upper bound; ranking corrects the scores it reads, so only after a
# drain of many tenants that no status call saw does a call meet this bound.
LARGEST_READ_MAX = 1000


def status(redis: redis_py.Redis, queue: str, top: int = 10) -> FairQueueStatus | None:
    """The queue's fair state (None: a plain queue), in two round trips whatever the
    number of tenants: the ``top`` tenants by backlog, with what each runs."""
    k = keys.of(redis)
    state, backlog = k.fair_part(queue, "state"), k.fair_part(queue, "backlog")
    pipe = pipeline(redis)
    pipe.hget(k.fair_queues_of(queue), queue)
    pipe.hget(state, "jobs")
    pipe.llen(k.queue(queue))
    pipe.zcard(backlog)
    script("fair_largest.lua")(pipe, [k.fair_queue(queue)], [top, LARGEST_READ_MAX])
    raw, jobs, arrivals, tenants, ranked = pipe.execute()
    setting = parse_stored(raw)
    if setting is None:
        return None
    largest = [(ranked[i].decode(), int(ranked[i + 1])) for i in range(0, len(ranked) - 1, 2)]
    names = [name for name, _ in largest]
    running = redis.hmget(state, [f"b:{name}" for name in names]) if names else []
    return FairQueueStatus(
        queue=queue,
        tenant_limit=setting.tenant_limit,
        jobs_waiting=int(jobs or 0),
        arrivals=int(arrivals),
        tenants_waiting=int(tenants),
        largest=[
            TenantLoad(name, waiting, int(busy or 0))
            for (name, waiting), busy in zip(largest, running, strict=True)
        ],
        largest_exact=ranked[-1] == 1,
    )


def fair_queues(redis: redis_py.Redis) -> dict[str, FairSetting]:
    """Every fair queue (standalone: one read; in a cluster, the queues named in
    ``queues``, one read each)."""
    k = keys.of(redis)
    if not k.cluster:
        return settings_of(cast("dict[bytes, bytes]", redis.hgetall(k.FAIR_QUEUES)))
    names = [name.decode() for name in cast("set[bytes]", redis.smembers(k.QUEUES))]
    found = {name: parse_stored(redis.hget(k.fair_queues_of(name), name)) for name in names}
    return {name: setting for name, setting in found.items() if setting is not None}


def settings_of(stored: dict[bytes, bytes]) -> dict[str, FairSetting]:
    """The fair queues of ``limitd:fair_queues`` as read (HGETALL), without weights."""
    found = {name.decode(): parse_stored(value) for name, value in stored.items()}
    return {name: setting for name, setting in found.items() if setting is not None}


def lines_page(
    redis: redis_py.Redis, queue: str, start: int, count: int
) -> list[tuple[str, bytes]]:
    """``count`` jobs waiting in the tenants' lines from the ``start``-th, as (tenant,
    job): tenant by tenant in turn order (those at their limit last), each line oldest
    first. Reads every tenant's line length to find the page (admin use: O(tenants);
    the backlog's scores only bound them)."""
    k = keys.of(redis)
    pipe = pipeline(redis)
    pipe.zrange(k.fair_part(queue, "turns"), 0, -1)
    pipe.zrange(k.fair_part(queue, "backlog"), 0, -1)
    turns, backlog = pipe.execute()
    tenants = [name.decode() for name in backlog]
    pipe = pipeline(redis)
    for tenant in tenants:
        pipe.llen(k.fair_line(queue, tenant))
    sizes = dict(zip(tenants, (int(n) for n in pipe.execute()), strict=True))
    order = [name.decode() for name in turns if name.decode() in sizes]
    order += sorted(set(sizes) - set(order))
    found: list[tuple[str, bytes]] = []
    for tenant in order:
        if len(found) >= count:
            break
        if start >= sizes[tenant]:
            start -= sizes[tenant]
            continue
        want = count - len(found)
        line = cast(
            "list[bytes]",
            redis.lrange(k.fair_line(queue, tenant), -(start + want), -(start + 1)),
        )
        found += [(tenant, raw) for raw in reversed(line)]
        start = 0
    return found


def delete_from_line(redis: redis_py.Redis, queue: str, tenant: str, raw: bytes) -> bool:
    """Remove one waiting job from its tenant's line; False if it was taken first."""
    base = keys.of(redis).fair_queue(queue)
    return bool(script("fair_delete.lua")(redis, [base], [tenant, raw]))
