"""Batches for operators: the newest first, with their counts and flags.

The index (``limitd:batches``, bid -> creation time) outlives batches whose data has
expired; listing drops those entries as it meets them, and running capsules' pollers
sweep the rest once an hour (``limitd.batch.store.prune_index``).
"""

from __future__ import annotations

from typing import Any

from limitd import keys
from limitd.batch.store import BatchStatus, read_status, read_statuses

DEFAULT_LIMIT = 50


def list_batches(redis: Any, limit: int = DEFAULT_LIMIT) -> list[BatchStatus]:
    """Up to ``limit`` batches that still exist, newest first."""
    found: list[BatchStatus] = []
    start = 0
    while len(found) < limit:
        raw = redis.zrevrange(keys.BATCHES, start, start + limit - 1)
        if not raw:
            break
        bids = [bid.decode() for bid in raw]
        statuses = read_statuses(redis, bids)
        gone = [bid for bid, status in zip(bids, statuses, strict=True) if status is None]
        if gone:
            redis.zrem(keys.BATCHES, *gone)
        found.extend(status for status in statuses if status is not None)
        start += len(bids) - len(gone)
    return found[:limit]


def batch_status(redis: Any, bid: str) -> BatchStatus | None:
    """One batch, or None when it is unknown or expired."""
    return read_status(redis, bid)


__all__ = ["BatchStatus", "batch_status", "list_batches"]
