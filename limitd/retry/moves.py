"""Atomic moves of a job out of a sorted set (``schedule``, ``retry``, ``dead``).

The poller uses them for due jobs, the admin API for "retry now" and "kill". Each move
is one Lua call whose ZREM decides who owns the member, so a job moved by two pollers,
or retried by two operators at once, is pushed once and never lost in between.

In cluster mode the sets and the queue are on different shards: the move goes through
the hand-off set (``limitd.handoff``).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis as redis_py

from limitd import handoff, keys
from limitd.connection import LuaScript
from limitd.payload import DEFAULT_QUEUE, Payload, dumps

ENQUEUE_MEMBER = LuaScript(__package__ or "limitd.retry", "enqueue_member.lua")
ENQUEUE_DUE = LuaScript(__package__ or "limitd.retry", "enqueue_due.lua")

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


def enqueue_page(
    redis: redis_py.Redis, zset: str, due: Sequence[tuple[bytes, Payload]], now: float
) -> int:
    """Push each ``(member, payload)`` of ``due`` to its queue with ``enqueued_at =
    now``, in one call (``enqueue_due.lua``); returns how many moved (those that had left
    ``zset`` already are skipped). In cluster mode the queues are on other shards: one
    hand-off each, as :func:`enqueue_member`."""
    k = keys.of(redis)
    if k.cluster:
        return sum(enqueue_member(redis, zset, member, payload, now) for member, payload in due)
    if not due:
        return 0
    numbers: dict[str, int] = {}
    jobs: list[bytes | str | int] = []
    for member, payload in due:
        queue = str(payload.get("queue") or DEFAULT_QUEUE)
        number = numbers.setdefault(queue, len(numbers) + 1)
        jobs += [member, dumps({**payload, "enqueued_at": now}), number]
    script_keys = [zset, k.QUEUES, *(k.queue(name) for name in numbers)]
    return int(ENQUEUE_DUE(redis, script_keys, [keys.WAKE_CHANNEL, len(numbers), *numbers, *jobs]))


def bury_member(
    redis: redis_py.Redis, zset: str, member: bytes, entry: bytes | str, now: float
) -> bool:
    """Move ``member`` to the dead set as ``entry``, scored ``now``. False when the
    member had already left ``zset``. The caller trims the dead set."""
    k = keys.of(redis)
    return bool(BURY_MEMBER(redis, [zset, k.DEAD], [member, entry, now]))
