"""Which capsules are alive, and recovering the jobs of those that are not.

A capsule is alive while its heartbeat key exists. The key is written by the capsule's
own heartbeat thread *and* by its supervisor, a separate process that writes it for
every child whose process still exists: a child stalled by a job holding the GIL (or
stopped by SIGSTOP) keeps its key, so it is never reaped while it lives. The key
expires ``4 x heartbeat_period`` after the last write.

The reaper runs on every heartbeat of every capsule: it finds capsules whose key is
gone and, in one Lua call each (``reap_capsule.lua``), returns their in-progress jobs to
the front of their queues and frees their busy slots, and removes their Sidekiq process
record (``forget_process``), so process lists stop showing them at once.

Whatever Redis refuses, a live process is not reaped: its key is kept by EXPIRE, which a
Redis out of memory still allows (``vouch``), and a process whose own beat failed judges
nobody until it has beaten for a full expiry period again (``ReapGate``).
"""

from __future__ import annotations

import logging
import math

import redis as redis_py

from limitd import clock, keys
from limitd.connection import LuaScript, set_members
from limitd.fetch.recoveries import RECOVERIES_TTL

log = logging.getLogger("limitd.liveness")

REAP_CAPSULE = LuaScript(__package__ or "limitd.fetch", "reap_capsule.lua", ("fair_lib.lua",))
EXPIRY_PERIODS = 4
STILL_ALIVE = -1
QUEUES_CHANGED = -2


def vouch(redis: redis_py.Redis, capsule_ids: list[str], heartbeat_period: float) -> None:
    """Mark capsules alive for ``4 x heartbeat_period`` seconds.

    Refreshing the expiry of a key that exists (EXPIRE) is one of the few writes a Redis
    at ``maxmemory`` still allows; SET and SADD are refused there. So the expiry is
    refreshed first, with a read of the registration, in one round trip, and only a
    capsule whose key or registration is missing (new, or reaped) is written in full, in
    a second one. A Redis out of memory thus cannot let a live capsule's key expire."""
    k = keys.of(redis)
    ttl = max(1, math.ceil(EXPIRY_PERIODS * heartbeat_period))
    pipe = redis.pipeline(transaction=False)
    for capsule_id in capsule_ids:
        pipe.expire(k.capsule_heartbeat(capsule_id), ttl)
        pipe.sismember(k.CAPSULES, capsule_id)
    found = pipe.execute()
    missing = [
        capsule_id
        for capsule_id, refreshed, registered in zip(
            capsule_ids, found[::2], found[1::2], strict=True
        )
        if not (refreshed and registered)
    ]
    if not missing:
        return
    pipe = redis.pipeline(transaction=False)
    for capsule_id in missing:
        pipe.sadd(k.CAPSULES, capsule_id)
        pipe.set(k.capsule_heartbeat(capsule_id), "1", ex=ttl)
    pipe.execute()


def forget_process(redis: redis_py.Redis, capsule_id: str) -> None:
    """Remove the record of the dead process that ran ``capsule_id``, so that process
    lists (``limitd status``, the Busy page, Sidekiq's ``ProcessSet``) stop showing it
    as alive and busy. Found by the suffix of its identity among ``processes`` (one
    read; reaping is rare). Only removals (SREM, DEL), which a Redis out of memory
    still allows. A process that lives after all writes its record again."""
    k = keys.of(redis)
    suffix = f":{capsule_id}"
    dead = [m for m in set_members(redis, k.PROCESSES) if m.endswith(suffix)]
    if not dead:
        return
    pipe = redis.pipeline(transaction=True)
    for identity in dead:
        pipe.srem(k.PROCESSES, identity)
        pipe.delete(identity, *_record_keys(identity))
    pipe.execute()


def _record_keys(identity: str) -> tuple[str, str, str]:
    """The keys beside the record's hash: its work (twice) and its signals from afar."""
    return (
        keys.process_work(identity),
        keys.process_workers(identity),
        keys.process_signals(identity),
    )


class ReapGate:
    """Whether this process may judge others dead, from what it knows of its own beats.

    A capsule's key expires when its beats fail, and beats fail for everyone at once
    (Redis out of memory, unreachable, failing over). When Redis recovers, the first
    process to beat would find every other key gone and reap live processes before they
    beat again. So a process whose own beat failed reaps nobody until its beats have
    succeeded for a full expiry period: by then every live process has had time to
    write its key again. A process starts trusted (a fresh process reaps at once)."""

    def __init__(self, heartbeat_period: float) -> None:
        self.grace = EXPIRY_PERIODS * heartbeat_period
        self._steady_since: float | None = -math.inf

    def failed(self) -> None:
        """A beat of this process failed: distrust its view until it has been steady."""
        self._steady_since = None

    def succeeded(self) -> None:
        if self._steady_since is None:
            self._steady_since = clock.monotonic()

    def open(self) -> bool:
        since = self._steady_since
        return since is not None and clock.monotonic() - since >= self.grace


def retire(redis: redis_py.Redis, capsule_id: str, reason: str = "", *, blame: bool = False) -> int:
    """A capsule that stopped: drop its heartbeat and reap it at once, which returns any
    job it could not requeue itself. Returns how many jobs that was. With ``blame`` (its
    process died unasked) the crash is charged to its jobs as ``reap`` says, with
    ``reason`` (how it stopped); a capsule stopped on purpose charges nothing."""
    k = keys.of(redis)
    redis.delete(k.capsule_heartbeat(capsule_id))
    forget_process(redis, capsule_id)
    why = reason or f"capsule {capsule_id} stopped"
    return max(0, reap(redis, capsule_id, why, blame=blame))


def reap(redis: redis_py.Redis, capsule_id: str, reason: str = "", *, blame: bool = True) -> int:
    """Requeue a dead capsule's jobs and free its slots; with ``blame``, charge the crash
    to the jobs that could have caused it (see ``reap_capsule.lua`` and
    ``limitd/fetch/recoveries.py``)."""
    k = keys.of(redis)
    why = reason or f"capsule {capsule_id} stopped beating while running the job"
    charge = b"1" if blame else b"0"
    if k.cluster:
        return _reap_per_queue(redis, capsule_id, why, charge)
    for _ in range(3):
        names = set_members(redis, k.capsule_queues(capsule_id))
        script_keys = [
            k.capsule_heartbeat(capsule_id),
            k.CAPSULES,
            k.BUSY,
            k.capsule_queues(capsule_id),
        ]
        for name in names:
            script_keys += [k.queue(name), k.in_progress(capsule_id, name)]
        script_keys += [k.FAIR_QUEUES, k.RECOVERIES]
        args = [
            capsule_id, *names, k.fair_template, charge, why, RECOVERIES_TTL, keys.WAKE_CHANNEL
        ]
        moved = int(REAP_CAPSULE(redis, script_keys, args))
        if moved >= 0:  # gone: its ready index too (limitd.fetch.ready_index)
            redis.delete(k.ready_index(capsule_id), k.rate_wait(capsule_id))
        if moved != QUEUES_CHANGED:
            return moved
    return QUEUES_CHANGED


def _reap_per_queue(redis: redis_py.Redis, capsule_id: str, why: str, charge: bytes) -> int:
    """Cluster mode: the capsule's jobs of each queue are on that queue's shard, so it
    is reaped queue by queue, each atomically as above. Which queues: no set spans
    shards, so every shard is scanned for the capsule's in-progress lists (reaping is
    rare; the scan reads names only). The heartbeat lives on another shard: checked once
    first, and the script is given the name it would have in the queue's slot, which no
    capsule writes."""
    k = keys.of(redis)
    if redis.exists(k.capsule_heartbeat(capsule_id)):
        return STILL_ALIVE
    moved = 0
    pattern = k.in_progress(capsule_id, "*")
    held = {keys.queue_of_in_progress(key.decode()) for key in redis.scan_iter(match=pattern)}
    for name in sorted(held):
        script_keys = [
            k.capsule_queues(capsule_id, name) + ":heartbeat",
            k.capsules_of(name),
            k.busy_of(name),
            k.capsule_queues(capsule_id, name),
            k.queue(name),
            k.in_progress(capsule_id, name),
            k.fair_queues_of(name),
            k.recoveries_of(name),
        ]
        args = [capsule_id, name, k.fair_template, charge, why, RECOVERIES_TTL, keys.WAKE_CHANNEL]
        moved += max(0, int(REAP_CAPSULE(redis, script_keys, args)))
    redis.srem(k.CAPSULES, capsule_id)
    return moved


def reap_dead(redis: redis_py.Redis) -> dict[str, int]:
    """Reap every registered capsule whose heartbeat expired; returns jobs requeued per
    capsule reaped. Safe to run from many processes at once."""
    k = keys.of(redis)
    capsule_ids = set_members(redis, k.CAPSULES)
    if not capsule_ids:
        return {}
    pipe = redis.pipeline(transaction=False)
    for capsule_id in capsule_ids:
        pipe.exists(k.capsule_heartbeat(capsule_id))
    alive = pipe.execute()
    reaped: dict[str, int] = {}
    for capsule_id, exists in zip(capsule_ids, alive, strict=True):
        if not exists:
            moved = reap(redis, capsule_id)
            if moved >= 0:
                reaped[capsule_id] = moved
                forget_process(redis, capsule_id)
                log.warning("capsule %s stopped beating: requeued its %d jobs", capsule_id, moved)
    return reaped
