"""Helpers shared by the benchmarks: a Redis to run against, counting the commands it
served (INFO commandstats), and timing one capsule draining a known number of jobs."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis as redis_py

from limitd.embedded import RedisServer
from limitd.supervisor import Capsule


def command_counts(conn: redis_py.Redis) -> Counter[str]:
    """Calls served so far, per command, leaving out the INFO calls that read them."""
    stats = conn.info("commandstats")
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name != "cmdstat_info"
        }
    )


def command_calls(conn: redis_py.Redis) -> int:
    return sum(command_counts(conn).values())


@contextmanager
def redis_for_bench(url: str | None) -> Iterator[redis_py.Redis]:
    """A client on ``url``, or on a private redis-server started for the run."""
    server = None
    if url is None:
        server = RedisServer()
        server.start()
        url = server.url
    conn = redis_py.Redis.from_url(url)
    try:
        yield conn
    finally:
        conn.close()
        if server:
            server.stop()


def timed_drain(
    conn: redis_py.Redis, capsule: Capsule, done: threading.Semaphore, jobs: int
) -> tuple[float, int]:
    """Start ``capsule`` and wait until its jobs released ``done`` ``jobs`` times. Returns
    the seconds and the Redis commands that took; the capsule is left running."""
    calls = command_calls(conn)
    started = time.perf_counter()
    capsule.start()
    for _ in range(jobs):
        done.acquire()
    return time.perf_counter() - started, command_calls(conn) - calls
