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

import redis
from bench_counter import COUNTER_KEY, redis_url
from reporter import Reporter

WORK = os.environ.get("BENCH_WORK", "wait")
REPORT_EVERY = 0.005  # seconds; the driver reads the counter every 10 ms

_reporter = Reporter(
    lambda: redis.Redis.from_url(redis_url()),
    lambda client, now, before: client.incrby(COUNTER_KEY, now["done"] - before["done"]),
    REPORT_EVERY,
    "done",
)


def incr_in_job() -> bool:
    """Whether the job INCRs the counter itself (``wait+incr``)."""
    return WORK == "wait+incr"


def done() -> None:
    """One more job finished in this process; thread-safe, and costs the job no I/O."""
    _reporter.count("done")
