"""arq's worker for bench/async_io.py: one process, ``max_jobs`` 1,000, each job waits
100 ms then counts itself done. Run as a script, like bench/peers/apps/arq_app.py, so
the worker logs at WARNING rather than a line per job."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import tally
from arq import create_pool, run_worker
from arq.connections import RedisSettings
from bench_counter import COUNTER_KEY, redis_url

QUEUE_NAME = "arq:queue:io"
MAX_JOBS = 1000
WAIT_SECONDS = 0.1


async def wait_io(ctx: dict[str, Any], i: int) -> None:
    await asyncio.sleep(WAIT_SECONDS)
    if tally.incr_in_job():
        await ctx["redis"].incr(COUNTER_KEY)
    else:
        tally.done()


class WorkerSettings:
    functions = [wait_io]
    redis_settings = RedisSettings.from_dsn(redis_url())
    queue_name = QUEUE_NAME
    max_jobs = MAX_JOBS
    keep_result = 0
    poll_delay = 0.05
    log_results = False
    handle_signals = True


async def enqueue(jobs: int, batch: int) -> None:
    """``enqueue_job`` has no bulk form; ``batch`` of them run at once."""
    pool = await create_pool(WorkerSettings.redis_settings, default_queue_name=QUEUE_NAME)
    try:
        for start in range(0, jobs, batch):
            calls = (pool.enqueue_job("wait_io", i) for i in range(start, min(jobs, start + batch)))
            await asyncio.gather(*calls)
    finally:
        await pool.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_worker(WorkerSettings)  # type: ignore[arg-type]
