"""Atomic moves of a job out of a sorted set (``schedule``, ``retry``, ``dead``).

The poller uses them for due jobs, the admin API for "retry now" and "kill". Each move
is one Lua call whose ZREM decides who owns the member, so a job moved by two pollers,
or retried by two operators at once, is pushed once and never lost in between.

In cluster mode the sets and the queue are on different shards: the move goes through
the hand-off set (``limitd.handoff``).
"""

from __future__ import annotations

import redis as redis_py

from limitd import handoff, keys
from limitd.connection import LuaScript
from limitd.payload import DEFAULT_QUEUE, Payload, dumps

ENQUEUE_MEMBER = LuaScript(__package__ or "limitd.retry", "enqueue_member.lua")
MOVE_DUE_PAGE = LuaScript(__package__ or "limitd.retry", "move_due_page.lua")

BURY_MEMBER = LuaScript(__package__ or "limitd.retry", "bury_member.lua")


def enqueue_member(
    redis: redis_py.Redis, zset: str, member: bytes, payload: Payload, now: float
) -> bool:
    """Push ``payload`` (parsed from ``member``) to its queue with ``enqueued_at = now``.
    False when the member had already left ``zset``."""
    k = keys.of(redis)
    queue = str(payload.get("queue") or DEFAULT_QUEUE)
    body = dumps({**payload, "enqueued_at": now})
    if k.cluster:  # the queue is on another shard: hand it off
        if not handoff.claim_from(redis, zset, member, now):
            return False
        handoff.push_claimed(redis, member, now)
        return True
    moved = ENQUEUE_MEMBER(
        redis, [zset, k.QUEUES, k.queue(queue)], [member, body, queue, keys.WAKE_CHANNEL]
    )
    return bool(moved)


def move_due_page(
    redis: redis_py.Redis, zset: str, now: float, page: int
) -> tuple[int, int, list[bytes]]:
    """Move the first ``page`` members of ``zset`` due at ``now`` to their queues, with
    ``enqueued_at = now``, in one call that reads them in Redis (``move_due_page.lua``;
    standalone only). Returns how many due members it read, how many of them moved, and
    those it left in ``zset`` because it could not be sure how to read them: the caller
    moves those one at a time (:func:`enqueue_member`) or buries them."""
    k = keys.of(redis)
    prefix = k.queue("")
    read, moved, *left = MOVE_DUE_PAGE(
        redis, [zset, k.QUEUES], [repr(now), page, keys.WAKE_CHANNEL, prefix]
    )
    return int(read), int(moved), left


def bury_member(
    redis: redis_py.Redis, zset: str, member: bytes, entry: bytes | str, now: float
) -> bool:
    """Move ``member`` to the dead set as ``entry``, scored ``now``. False when the
    member had already left ``zset``. The caller trims the dead set."""
    k = keys.of(redis)
    return bool(BURY_MEMBER(redis, [zset, k.DEAD], [member, entry, now]))
