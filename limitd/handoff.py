"""Moving jobs to queues on other shards, in cluster mode (see ``limitd.keys``).

A script cannot push into a queue whose shard is not its own. So in cluster mode a job
bound for a queue is first put in the hand-off set (``limitd:moving``, in the ``{limitd}``
slot beside the schedule, retry and batch keys that send it), in the same script that
decides it goes (a due job leaves ``schedule``, a batch fires its callbacks); the push
follows, then the entry is removed. An entry's score says who may push it:

- a score far in the past (``UNCLAIMED``, or for batch callbacks ``now - 10^9`` rising
  with the order they fired in): nobody has claimed it yet;
- a time: claimed then by one process, which is pushing it.

:func:`push_waiting` claims entries that are unclaimed or whose claim is older than
``STALLED_SECONDS`` (the claimer died between claim and push) and pushes them. A job is
so never lost; it is pushed twice only when a process dies between its push and the
removal of the entry.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from limitd import keys
from limitd.connection import LuaScript, apipeline, pipeline
from limitd.payload import DEFAULT_QUEUE, MalformedPayload, dumps, parse

log = logging.getLogger("limitd.handoff")

STALLED_SECONDS = 60.0
# The score of an entry nobody has claimed, when order does not matter (a script that
# hands off several entries in order scores them like batch_lib.lua's unclaimed_score).
UNCLAIMED = 0.0
CLAIM_BATCH = 100  # entries claimed per call

CLAIM_MEMBER = LuaScript(__package__ or "limitd", "handoff_claim_member.lua")
CLAIM_WAITING = LuaScript(__package__ or "limitd", "handoff_claim.lua")


def claim_from(redis: Any, zset: str, member: bytes, now: float) -> bool:
    """Take ``member`` out of ``zset`` into the hand-off set, claimed now; False when
    another process took it first."""
    k = keys.of(redis)
    return bool(CLAIM_MEMBER(redis, [zset, k.MOVING], [member, now]))


def push_claimed(redis: Any, member: bytes, now: float) -> None:
    """Push a claimed entry (a job payload) to its queue with ``enqueued_at = now``,
    then release it. An unreadable entry is left in place and logged."""
    k = keys.of(redis)
    queue, body = _destination(member, now)
    if queue is None:
        return
    pipe = pipeline(redis)
    _queue_push(pipe, queue, body)
    pipe.execute()
    redis.zrem(k.MOVING, member)


def _queue_push(pipe: Any, queue: str, body: str) -> None:
    """The push of one entry, queued on a sync or asyncio pipeline (as a client's)."""
    k = keys.of(pipe)
    pipe.sadd(k.QUEUES, queue)
    pipe.lpush(k.queue(queue), body)
    pipe.publish(keys.WAKE_CHANNEL, queue)


def _destination(member: bytes, now: float) -> tuple[str | None, str]:
    """The queue an entry goes to and its body as pushed; (None, "") for an unreadable
    entry, which is left in place and logged."""
    try:
        payload = parse(member)
    except MalformedPayload as exc:
        moving = keys.CLUSTER.MOVING  # only a cluster hands off
        log.error("unreadable entry in %s left as is (%s): %r", moving, exc, member[:200])
        return None, ""
    queue = str(payload.get("queue") or DEFAULT_QUEUE)
    return queue, dumps({**payload, "enqueued_at": now})


async def apush_waiting(redis: Any, now: float) -> int:
    """:func:`push_waiting` on an asyncio cluster client."""
    k = keys.of(redis)
    pushed = 0
    while True:
        claimed = await CLAIM_WAITING.acall(
            redis, [k.MOVING], [now, now - STALLED_SECONDS, CLAIM_BATCH]
        )
        for member in claimed:
            await apush_claimed(redis, member, now)
        pushed += len(claimed)
        if len(claimed) < CLAIM_BATCH:
            return pushed


async def apush_claimed(redis: Any, member: bytes, now: float) -> None:
    """:func:`push_claimed` on an asyncio cluster client."""
    k = keys.of(redis)
    queue, body = _destination(member, now)
    if queue is None:
        return
    pipe = apipeline(redis)
    _queue_push(pipe, queue, body)
    await pipe.execute()
    await redis.zrem(k.MOVING, member)


def push_waiting(redis: Any, now: float) -> int:
    """Claim and push every entry nobody is pushing (see the module docstring); returns
    how many. Cheap when there are none: one script call that finds nothing."""
    k = keys.of(redis)
    pushed = 0
    while True:
        claimed = cast(
            "list[bytes]",
            CLAIM_WAITING(redis, [k.MOVING], [now, now - STALLED_SECONDS, CLAIM_BATCH]),
        )
        for member in claimed:
            push_claimed(redis, member, now)
        pushed += len(claimed)
        if len(claimed) < CLAIM_BATCH:
            return pushed
