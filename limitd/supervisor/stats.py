"""Processed and failed counters, kept in memory and written in one round trip.

Counting in Redis on every job would double the commands per job; instead a
:class:`StatsFlusher` thread writes the totals about a second after a job ends (one
write for every job that ended in that second, none while nothing runs), so Sidekiq's
``Stats`` and the dashboard are never more than a second behind. The capsule flushes
once more at each heartbeat and when it stops. The counters go to ``stat:processed`` /
``stat:failed``, their per-day keys, and per-minute keys kept for two hours (the
dashboard's last hour).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

import redis as redis_py

from limitd import clock, keys
from limitd.supervisor.refusals import REFUSALS

log = logging.getLogger("limitd.stats")

FLUSH_DELAY = 1.0
JOIN_TIMEOUT = 2.0


class JobStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processed = 0
        self._failed = 0
        # Set when there is something to flush: the flusher sleeps on it.
        self.pending = threading.Event()

    def record(self, failed: bool) -> None:
        with self._lock:
            if not self._processed:
                self.pending.set()
            self._processed += 1
            if failed:
                self._failed += 1

    def flush(self, redis: redis_py.Redis) -> int:
        """Write what was counted since the last flush; returns how many jobs that was.
        On error the counts are kept for the next flush, so a Redis blip loses no
        statistics."""
        k = keys.of(redis)
        with self._lock:
            processed, failed = self._processed, self._failed
            self._processed = self._failed = 0
            self.pending.clear()
        if not processed:
            return 0
        now = clock.now()
        day = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d")
        minute = int(now // 60)
        pipe = redis.pipeline(transaction=False)
        for key, count in ((k.STAT_PROCESSED, processed), (k.STAT_FAILED, failed)):
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
                self.pending.set()
            raise
        return processed


class StatsFlusher:
    """The thread that writes a capsule's counters ``delay`` seconds after the first job
    that ended since the last write. A failed write keeps the counts and is tried again
    ``delay`` later; it is not logged here (the heartbeat, which flushes too, tells
    Redis failures; ``REFUSALS`` tells Redis refusing writes)."""

    def __init__(self, stats: JobStats, redis: redis_py.Redis, delay: float = FLUSH_DELAY) -> None:
        self.stats = stats
        self.redis = redis
        self.delay = delay
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop without a last write: the capsule's own last flush follows."""
        self._done.set()
        self.stats.pending.set()
        if self._thread.ident is not None:
            self._thread.join(JOIN_TIMEOUT)

    def _run(self) -> None:
        while not self._done.is_set():
            self.stats.pending.wait()
            if self._done.wait(self.delay):
                return
            try:
                written = self.stats.flush(self.redis)
            except redis_py.RedisError as exc:
                if not REFUSALS.note(exc, "job counters"):
                    log.debug("job counters not written yet: %s", exc)
                continue
            if written:
                REFUSALS.accepted()
