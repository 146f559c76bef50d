"""saq's worker for bench/async_io.py (``saq saq_io_app.settings``: one process),
concurrency 1,000, each job waits 100 ms then counts itself done; the saq command logs
at ERROR unless -v is given."""

from __future__ import annotations

import asyncio
from typing import Any

import tally
from bench_counter import COUNTER_KEY, redis_url
from saq import Queue

QUEUE = "io"
CONCURRENCY = 1000
WAIT_SECONDS = 0.1

queue = Queue.from_url(redis_url(), name=QUEUE)


async def wait_io(ctx: dict[str, Any], *, i: int) -> None:
    await asyncio.sleep(WAIT_SECONDS)
    if tally.incr_in_job():
        await ctx["worker"].queue.redis.incr(COUNTER_KEY)
    else:
        tally.done()


settings = {"queue": queue, "functions": [wait_io], "concurrency": CONCURRENCY}


async def enqueue(jobs: int, batch: int) -> None:
    """Job records deleted on completion (ttl=-1), as in bench/peers; ``batch`` enqueues
    run at once."""
    await queue.connect()
    try:
        for start in range(0, jobs, batch):
            calls = (
                queue.enqueue("wait_io", i=i, ttl=-1)
                for i in range(start, min(jobs, start + batch))
            )
            await asyncio.gather(*calls)
    finally:
        await queue.disconnect()
