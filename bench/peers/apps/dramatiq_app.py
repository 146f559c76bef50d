"""Dramatiq's benchmark actor on the Redis broker (default middleware, no results)."""

from __future__ import annotations

import dramatiq
from bench_counter import QUEUE, incr, redis_url
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop(i: int) -> None:
    incr()
