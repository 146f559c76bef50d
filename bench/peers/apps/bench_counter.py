"""The one thing every benchmark job does: increment a Redis counter, so the driver can
check that exactly N jobs ran. Sync apps share this helper; the async apps (arq, saq)
increment through their own client, and the Ruby app through Sidekiq's pool."""

from __future__ import annotations

import os
import threading

import redis

COUNTER_KEY = "bench:done"
QUEUE = "bench"

_client: redis.Redis | None = None
_lock = threading.Lock()


def redis_url() -> str:
    """The URL (with this system's db) the driver gives every process it starts."""
    return os.environ["BENCH_REDIS_URL"]


def incr() -> None:
    """INCR the counter through one client per process, made on first use so that it is
    created after any fork (the pool is thread-safe)."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(redis_url())
    _client.incr(COUNTER_KEY)
