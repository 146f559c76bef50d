"""Processed and failed counters, kept in memory and written in one round trip.

Counting in Redis on every job would double the commands per job; instead the heartbeat
flushes the totals every few seconds and the capsule flushes once more when it stops,
into ``stat:processed`` / ``stat:failed`` and their per-day keys.
"""

from __future__ import annotations

import datetime as dt
import threading

import redis as redis_py

from limitd import clock, keys


class JobStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processed = 0
        self._failed = 0

    def record(self, failed: bool) -> None:
        with self._lock:
            self._processed += 1
            if failed:
                self._failed += 1

    def flush(self, redis: redis_py.Redis) -> None:
        """Write what was counted since the last flush. On error the counts are kept for
        the next flush, so a Redis blip loses no statistics."""
        with self._lock:
            processed, failed = self._processed, self._failed
            self._processed = self._failed = 0
        if not processed:
            return
        day = dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc).strftime("%Y-%m-%d")
        pipe = redis.pipeline(transaction=False)
        pipe.incrby(keys.STAT_PROCESSED, processed)
        pipe.incrby(keys.daily_stat(keys.STAT_PROCESSED, day), processed)
        if failed:
            pipe.incrby(keys.STAT_FAILED, failed)
            pipe.incrby(keys.daily_stat(keys.STAT_FAILED, day), failed)
        try:
            pipe.execute()
        except redis_py.RedisError:
            with self._lock:
                self._processed += processed
                self._failed += failed
            raise
