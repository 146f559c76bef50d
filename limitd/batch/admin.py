"""Batches for operators: the newest first, with their counts and flags.

The index (``limitd:batches``, bid -> creation time) outlives batches whose data has
expired; listing drops those entries as it meets them, and running capsules' pollers
sweep the rest once an hour (``limitd.batch.store.prune_index``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from limitd import keys
from limitd.batch.store import EVENTS, BatchStatus, _status, read_status, read_statuses

DEFAULT_LIMIT = 50


def list_batches(redis: Any, limit: int = DEFAULT_LIMIT) -> list[BatchStatus]:
    """Up to ``limit`` batches that still exist, newest first."""
    k = keys.of(redis)
    found: list[BatchStatus] = []
    start = 0
    while len(found) < limit:
        raw = redis.zrevrange(k.BATCHES, start, start + limit - 1)
        if not raw:
            break
        bids = [bid.decode() for bid in raw]
        statuses = read_statuses(redis, bids)
        gone = [bid for bid, status in zip(bids, statuses, strict=True) if status is None]
        if gone:
            redis.zrem(k.BATCHES, *gone)
        found.extend(status for status in statuses if status is not None)
        start += len(bids) - len(gone)
    return found[:limit]


def batch_status(redis: Any, bid: str) -> BatchStatus | None:
    """One batch, or None when it is unknown or expired."""
    return read_status(redis, bid)


FAILURES_SHOWN = 100  # failures one batch page lists; the rest are counted


@dataclass(frozen=True)
class BatchCallback:
    """A callback registered with ``batch.on(event, job, options)``: the job, its queue
    and options, and ``fired_at`` (the batch's time of that event, None until it
    happened: the same script that records the event pushes the callback)."""

    event: str
    job: str
    queue: str
    options: Any
    fired_at: float | None

    @property
    def fired(self) -> bool:
        return self.fired_at is not None


@dataclass(frozen=True)
class BatchDetail:
    """One batch for a page that shows it alone. ``status.failures`` holds at most the
    number of failures asked for (a batch of a million failed jobs is not read whole);
    ``failure_count`` counts them all."""

    status: BatchStatus
    failure_count: int
    callbacks: tuple[BatchCallback, ...]


def batch_detail(redis: Any, bid: str, failures_shown: int = FAILURES_SHOWN) -> BatchDetail | None:
    """The batch, some of its failures and its callbacks, in one round trip whatever
    its size; None when it is unknown or expired."""
    k = keys.of(redis)
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(k.batch(bid))
    pipe.hlen(k.batch_failures(bid))
    pipe.hscan(k.batch_failures(bid), 0, count=failures_shown)
    meta, failure_count, (_, failures) = pipe.execute()
    shown = dict(sorted(failures.items())[:failures_shown])
    status = _status(bid, meta, shown)
    if status is None:
        return None
    fired = {"success": status.success_at, "complete": status.complete_at,
             "death": status.death_at}  # fmt: skip
    callbacks = [
        _callback(event, template, fired[event])
        for event in EVENTS
        for template in _templates(meta.get(f"on_{event}".encode()))
    ]
    return BatchDetail(status, int(failure_count), tuple(callbacks))


def _templates(raw: bytes | None) -> list[dict[str, str]]:
    if not raw:
        return []
    try:
        entries = json.loads(raw)
    except ValueError:
        return []
    return (
        [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []
    )


def _callback(event: str, template: dict[str, str], fired_at: float | None) -> BatchCallback:
    """A stored callback template (a payload cut where the status goes, see
    ``batch_lib.lua``) made whole again with ``null`` for the status, to read it."""
    try:
        payload = json.loads(template.get("head", "") + "null" + template.get("tail", "") + "}")
        args = payload.get("args") or [None, None]
        job, options = str(payload.get("class", "?")), args[1] if len(args) > 1 else None
    except (ValueError, AttributeError, TypeError):
        job, options = "?", None
    return BatchCallback(event, job, str(template.get("queue", "?")), options, fired_at)


__all__ = [
    "BatchCallback",
    "BatchDetail",
    "BatchStatus",
    "batch_detail",
    "batch_status",
    "list_batches",
]


def state(status: BatchStatus) -> str:
    """The one word the CLI and the dashboard show for where a batch stands."""
    if status.building:
        word = "building"
    elif status.success:
        word = "success"
    elif status.complete:
        word = "complete"
    else:
        word = "running"
    return word + ("+death" if status.death_at is not None else "")
