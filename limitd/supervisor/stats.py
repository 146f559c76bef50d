"""Processed and failed counters, kept in memory and written in one round trip.

Counting in Redis on every job would double the commands per job; instead the heartbeat
flushes the totals every few seconds and the capsule flushes once more when it stops,
into ``stat:processed`` / ``stat:failed``, their per-day keys, and per-minute keys kept
for two hours (the dashboard's last hour).
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
        now = clock.now()
        day = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d")
        minute = int(now // 60)
        pipe = redis.pipeline(transaction=False)
        for key, count in ((keys.STAT_PROCESSED, processed), (keys.STAT_FAILED, failed)):
            if not count:
                continue
            pipe.incrby(key, count)
            pipe.incrby(keys.daily_stat(key, day), count)
            pipe.incrby(keys.minute_stat(key, minute), count)
            pipe.expire(keys.minute_stat(key, minute), keys.MINUTE_STAT_TTL)
        try:
            pipe.execute()
        except redis_py.RedisError:
            with self._lock:
                self._processed += processed
                self._failed += failed
            raise
