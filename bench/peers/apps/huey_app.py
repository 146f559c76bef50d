"""huey's benchmark task: Redis storage, results off (nobody reads them)."""

from __future__ import annotations

from bench_counter import QUEUE, incr, redis_url
from huey import RedisHuey

huey = RedisHuey(QUEUE, url=redis_url(), results=False)


@huey.task()
def noop(i: int) -> None:
    incr()
