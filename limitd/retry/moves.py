"""Atomic moves of a job out of a sorted set (``schedule``, ``retry``, ``dead``).

The poller uses them for due jobs, the admin API for "retry now" and "kill". Each move
is one Lua call whose ZREM decides who owns the member, so a job moved by two pollers,
or retried by two operators at once, is pushed once and never lost in between.

In cluster mode the sets and the queue are on different shards, so a move to a queue
takes three steps: one script claims the member into a hand-off set beside the sorted
sets (``limitd:moving``), the push follows, then the hand-off entry is removed. A
poller that dies between the claim and the removal leaves the entry; any poller pushes
entries older than ``STALLED_MOVE_SECONDS`` (at-least-once: the job may then run twice,
never zero times).
"""

from __future__ import annotations

import logging
from typing import cast

import redis as redis_py

from limitd import keys
from limitd.payload import DEFAULT_QUEUE, MalformedPayload, Payload, dumps, parse
from limitd.redis import LuaScript, pipeline

log = logging.getLogger("limitd.retry")

ENQUEUE_MEMBER = LuaScript(__package__ or "limitd.retry", "enqueue_member.lua")
CLAIM_MEMBER = LuaScript(__package__ or "limitd.retry", "claim_member.lua")
STALLED_MOVE_SECONDS = 60.0
BURY_MEMBER = LuaScript(__package__ or "limitd.retry", "bury_member.lua")


def enqueue_member(
    redis: redis_py.Redis, zset: str, member: bytes, payload: Payload, now: float
) -> bool:
    """Push ``payload`` (parsed from ``member``) to its queue with ``enqueued_at = now``.
    False when the member had already left ``zset``."""
    queue = str(payload.get("queue") or DEFAULT_QUEUE)
    body = dumps({**payload, "enqueued_at": now})
    if keys.is_cluster_layout():
        if not CLAIM_MEMBER(redis, [zset, keys.MOVING], [member, now]):
            return False
        _push_then_release(redis, member, queue, body)
        return True
    moved = ENQUEUE_MEMBER(
        redis, [zset, keys.QUEUES, keys.queue(queue)], [member, body, queue, keys.WAKE_CHANNEL]
    )
    return bool(moved)


def _push_then_release(redis: redis_py.Redis, member: bytes, queue: str, body: str) -> None:
    pipe = pipeline(redis)
    pipe.sadd(keys.QUEUES, queue)
    pipe.lpush(keys.queue(queue), body)
    pipe.publish(keys.WAKE_CHANNEL, queue)
    pipe.execute()
    redis.zrem(keys.MOVING, member)


def finish_stalled_moves(redis: redis_py.Redis, now: float) -> int:
    """Cluster mode: push the hand-off entries a poller claimed but did not finish (it
    died in between); returns how many."""
    stalled = cast(
        "list[bytes]", redis.zrangebyscore(keys.MOVING, "-inf", now - STALLED_MOVE_SECONDS)
    )
    for member in stalled:
        try:
            payload = parse(member)
        except MalformedPayload:
            log.error("unreadable entry in %s left as is: %r", keys.MOVING, member[:200])
            continue
        queue = str(payload.get("queue") or DEFAULT_QUEUE)
        _push_then_release(redis, member, queue, dumps({**payload, "enqueued_at": now}))
        log.warning(
            "pushed jid=%s class=%s to %s: its move from the schedule had stalled",
            payload.get("jid"),
            payload.get("class"),
            queue,
        )
    return len(stalled)


def bury_member(
    redis: redis_py.Redis, zset: str, member: bytes, entry: bytes | str, now: float
) -> bool:
    """Move ``member`` to the dead set as ``entry``, scored ``now``. False when the
    member had already left ``zset``. The caller trims the dead set."""
    return bool(BURY_MEMBER(redis, [zset, keys.DEAD], [member, entry, now]))
