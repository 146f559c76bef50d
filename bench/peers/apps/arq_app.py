"""arq's benchmark worker settings. Run as a script (``python arq_app.py``) rather than
with the ``arq`` command, which always logs every job at INFO: a user running for
throughput starts the worker from Python with logging at WARNING."""

from __future__ import annotations

import logging
from typing import Any

from arq import run_worker
from arq.connections import RedisSettings
from bench_counter import COUNTER_KEY, QUEUE, redis_url

QUEUE_NAME = f"arq:queue:{QUEUE}"


async def noop(ctx: dict[str, Any], i: int) -> None:
    await ctx["redis"].incr(COUNTER_KEY)


class WorkerSettings:
    functions = [noop]
    redis_settings = RedisSettings.from_dsn(redis_url())
    queue_name = QUEUE_NAME
    max_jobs = 10
    keep_result = 0
    poll_delay = 0.05
    log_results = False
    handle_signals = True


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_worker(WorkerSettings)  # type: ignore[arg-type]
