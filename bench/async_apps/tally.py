"""How a job of bench/async_io.py says it is done, chosen by ``BENCH_WORK``:

- ``wait`` (the default): count in the worker process and let a reporter thread add the
  count to the Redis counter every few milliseconds. The job is then only its 100 ms wait,
  as the benchmark means it: a stand-in for an HTTP call, not a Redis client's cost.
- ``wait+incr``: INCR the counter from the job itself, through the system's own Redis
  client (asyncio for the async systems); the figure then includes that client's cost
  per call, which for redis-py's asyncio client is larger than limitd's per job.
"""

from __future__ import annotations

import os
import threading
import time

import redis
from bench_counter import COUNTER_KEY, redis_url

WORK = os.environ.get("BENCH_WORK", "wait")
REPORT_EVERY = 0.005  # seconds; the driver reads the counter every 10 ms

_lock = threading.Lock()
_done = 0
_reporter_pid = 0


def incr_in_job() -> bool:
    """Whether the job INCRs the counter itself (``wait+incr``)."""
    return WORK == "wait+incr"


def done() -> None:
    """One more job finished in this process; thread-safe, and costs the job no I/O."""
    global _done
    with _lock:
        _done += 1
    if _reporter_pid != os.getpid():
        _start_reporter()


def _start_reporter() -> None:
    """One reporter per process, started by its first job (after any fork)."""
    global _reporter_pid
    with _lock:
        if _reporter_pid == os.getpid():
            return
        _reporter_pid = os.getpid()
    threading.Thread(target=_report, name="bench-tally", daemon=True).start()


def _report() -> None:
    client = redis.Redis.from_url(redis_url())
    reported = 0
    while True:
        time.sleep(REPORT_EVERY)
        current = _done
        if current != reported:
            client.incrby(COUNTER_KEY, current - reported)
            reported = current
