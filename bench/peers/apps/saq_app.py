"""saq's benchmark worker settings (``saq saq_app.settings --workers 2``); the saq
command logs at ERROR unless -v is given."""

from __future__ import annotations

from typing import Any

from bench_counter import COUNTER_KEY, QUEUE, redis_url
from saq import Queue

CONCURRENCY = 10

queue = Queue.from_url(redis_url(), name=QUEUE)


async def noop(ctx: dict[str, Any], *, i: int) -> None:
    await ctx["worker"].queue.redis.incr(COUNTER_KEY)


settings = {"queue": queue, "functions": [noop], "concurrency": CONCURRENCY}
