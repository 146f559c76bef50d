"""A batch's state in Redis: the scripts that change it and the read that reports it.

Every change is one Lua script (``batch_*.lua``, sharing ``batch_lib.lua``), so counting
a job and firing a callback happen together: two processes finishing a batch's last two
jobs at once see one of them fire, never both and never neither. Callbacks are pushed
by the script itself, straight into their queue, so a crash cannot separate "the batch
succeeded" from "its callback was enqueued" (they do not pass the client middleware).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from limitd import clock, handoff, keys
from limitd.connection import LuaScript, ScriptCall, decode_name
from limitd.middleware.work import RedisClient

_PACKAGE = __package__ or "limitd.batch"
_LIB = ("batch_lib.lua",)
OPEN = LuaScript(_PACKAGE, "batch_open.lua", _LIB)
CLOSE = LuaScript(_PACKAGE, "batch_close.lua", _LIB)
ADD = LuaScript(_PACKAGE, "batch_add.lua", _LIB)
REMOVE = LuaScript(_PACKAGE, "batch_remove.lua", _LIB)
JOB_SETTLED = LuaScript(_PACKAGE, "batch_job_settled.lua", _LIB)

EVENTS = ("success", "complete", "death")


class BatchNotOpen(RuntimeError):
    """Jobs cannot be added: the batch has completed, or does not exist (any more)."""


@dataclass(frozen=True)
class NewBatch:
    """What the first ``jobs()`` block writes: the batch's fixed attributes."""

    bid: str
    description: str
    expires_in: float
    callbacks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    parent: str | None = None


def open_batch(redis: RedisClient, bid: str, new: NewBatch | None = None) -> None:
    """Count one more open block; create the batch first when ``new`` describes it."""
    check_opened(bid, open_call(keys.of(redis), bid, new).run(redis))


def open_call(layout: keys.KeyLayout, bid: str, new: NewBatch | None = None) -> ScriptCall:
    """:func:`open_batch` as a call, for a sync or an asyncio client; its reply goes to
    :func:`check_opened`."""
    parent_keys = layout.batch_keys(new.parent) if new and new.parent else []
    args = [
        bid,
        repr(clock.now()),
        "1" if new else "0",
        new.description if new else "",
        int(new.expires_in) if new else 0,
        keys.BATCH_CHILD_PREFIX + bid,
        (new.parent or "") if new else "",
        json.dumps(parent_keys) if parent_keys else "",
        *(_callbacks_json(new, event) for event in EVENTS),
    ]
    return OPEN.later([*layout.batch_keys(bid), layout.BATCHES, *parent_keys], args)


def check_opened(bid: str, opened: Any) -> None:
    if opened == 0:
        raise BatchNotOpen(f"batch {bid} has already completed: no jobs can be added to it")
    if opened == -1:
        raise BatchNotOpen(f"batch {bid} does not exist (never created, or expired)")


def close_batch(redis: RedisClient, bid: str) -> None:
    """End one open block; the last one lets the batch fire."""
    close_call(keys.of(redis), bid).run(redis)
    push_handed_off(redis)


def close_call(layout: keys.KeyLayout, bid: str) -> ScriptCall:
    return CLOSE.later(
        [*layout.batch_keys(bid), _callbacks_to(layout)], [repr(clock.now()), keys.WAKE_CHANNEL]
    )


def add_jobs_call(layout: keys.KeyLayout, bid: str, jids: Sequence[str]) -> ScriptCall:
    """The registration of ``jids`` in batch ``bid``, to make now or later."""
    return ADD.later(layout.batch_keys(bid), jids)


def remove_jobs_call(layout: keys.KeyLayout, bid: str, jids: Sequence[str]) -> ScriptCall:
    """The removal of ``jids`` from batch ``bid`` (a push that did not happen)."""
    return REMOVE.later(layout.batch_keys(bid), jids)


def add_jobs(redis: RedisClient, bid: str, jids: Sequence[str]) -> int:
    k = keys.of(redis)
    return int(ADD(redis, k.batch_keys(bid), list(jids)))


def remove_jobs(redis: RedisClient, bid: str, jids: Sequence[str]) -> int:
    k = keys.of(redis)
    return int(REMOVE(redis, k.batch_keys(bid), list(jids)))


def job_settled(redis: RedisClient, bid: str, jid: str, result: str, error: str = "") -> int:
    """Record one run's ``result`` (success, failure or death). Returns 1 when it
    changed the batch, 0 for a repeat, -1 for an unknown batch."""
    result_code = int(job_settled_call(keys.of(redis), bid, jid, result, error).run(redis))
    push_handed_off(redis)
    return result_code


def push_handed_off(redis: RedisClient) -> None:
    """Cluster mode: push the callbacks the script just handed off (``limitd.handoff``)."""
    k = keys.of(redis)
    if k.cluster:
        handoff.push_waiting(redis, clock.now())


def job_settled_call(
    layout: keys.KeyLayout,
    bid: str,
    jid: str,
    result: str,
    error: str = "",
    *,
    on_reply: Callable[[Any], None] | None = None,
) -> ScriptCall:
    """The same, as a call to make with the job's acknowledgement; calls for one batch
    made together are merged into one script run."""
    return JOB_SETTLED.later(
        _settled_keys(layout, bid),
        (jid, result, error, repr(clock.now())),
        on_reply,
        (keys.WAKE_CHANNEL,),  # the arguments every update of every batch begins with
    )


@functools.lru_cache(maxsize=1024)
def _settled_keys(layout: keys.KeyLayout, bid: str) -> tuple[str, ...]:
    return (*layout.batch_keys(bid), _callbacks_to(layout))


def _callbacks_to(layout: keys.KeyLayout) -> str:
    """KEYS[5] of the scripts that may fire callbacks: the set of queue names, or in
    cluster mode the hand-off set the callbacks go to (``limitd.handoff``)."""
    return layout.MOVING if layout.cluster else layout.QUEUES


def prune_index(redis: RedisClient, page: int = 500) -> int:
    """Drop the index entries of batches whose data has expired, oldest first, a page
    at a time; returns how many went. The index is only read by the admin API, so
    without this it would keep one entry for every batch ever made."""
    k = keys.of(redis)
    removed = start = 0
    while True:
        page_of = cast("list[bytes]", redis.zrange(k.BATCHES, start, start + page - 1))
        bids = [bid.decode() for bid in page_of]
        if not bids:
            return removed
        pipe = redis.pipeline(transaction=False)
        for bid in bids:
            pipe.exists(k.batch(bid))
        gone = [bid for bid, alive in zip(bids, pipe.execute(), strict=True) if not alive]
        if gone:
            removed += int(redis.zrem(k.BATCHES, *gone))
        start += len(bids) - len(gone)


PRUNE_EVERY = 3600  # seconds between two prunings of the index, across all processes


def prune_index_hourly(redis: RedisClient) -> int:
    """The batch feature's housekeeping, asked by every capsule's poller at each of its
    upkeeps: :func:`prune_index`, by one process an hour (the lock key), since it reads
    the whole index. Returns how many entries went (0 when another process pruned)."""
    if not redis.set(keys.of(redis).BATCH_INDEX_PRUNE_LOCK, "1", nx=True, ex=PRUNE_EVERY):
        return 0
    return prune_index(redis)


def _callbacks_json(new: NewBatch | None, event: str) -> str:
    entries = new.callbacks.get(event) if new else None
    return json.dumps(entries) if entries else ""


@dataclass(frozen=True)
class BatchStatus:
    """A batch as it stands. ``pending`` counts jobs not yet succeeded; ``failures``
    maps the jids whose last run failed to their error."""

    bid: str
    description: str
    total: int
    pending: int
    failures: dict[str, str]
    created_at: float
    complete_at: float | None
    success_at: float | None
    death_at: float | None
    parent: str | None
    children: int
    building: int

    @property
    def complete(self) -> bool:
        return self.complete_at is not None

    @property
    def success(self) -> bool:
        return self.success_at is not None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "complete": self.complete, "success": self.success}


def read_status(redis: RedisClient, bid: str) -> BatchStatus | None:
    """The batch's status, or None when it does not exist (or expired)."""
    return read_statuses(redis, [bid])[0]


def read_statuses(redis: RedisClient, bids: Sequence[str]) -> list[BatchStatus | None]:
    """Statuses of several batches in one round trip, None for those that are gone."""
    k = keys.of(redis)
    pipe = redis.pipeline(transaction=False)
    for bid in bids:
        pipe.hgetall(k.batch(bid))
        pipe.hgetall(k.batch_failures(bid))
    replies = pipe.execute()
    return [_status(bid, replies[2 * i], replies[2 * i + 1]) for i, bid in enumerate(bids)]


def _status(
    bid: str, meta_raw: dict[bytes, bytes], failures_raw: dict[bytes, bytes]
) -> BatchStatus | None:
    if not meta_raw:
        return None
    meta = {decode_name(k): decode_name(v) for k, v in meta_raw.items()}
    return BatchStatus(
        bid=bid,
        description=meta.get("description", ""),
        total=int(meta.get("total", 0)),
        pending=int(meta.get("pending", 0)),
        failures={decode_name(k): decode_name(v) for k, v in failures_raw.items()},
        created_at=float(meta.get("created_at", 0)),
        complete_at=_time(meta.get("complete_at")),
        success_at=_time(meta.get("success_at")),
        death_at=_time(meta.get("death_at")),
        parent=meta.get("parent") or None,
        children=int(meta.get("children", 0)),
        building=int(meta.get("building", 0)),
    )


def _time(value: str | None) -> float | None:
    return float(value) if value else None
