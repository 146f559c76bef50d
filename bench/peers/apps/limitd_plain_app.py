"""The same job as limitd_app, counting through a plain ``redis.Redis`` client (the one
the Python peers' jobs use, bench_counter.incr) instead of ``limitd.redis_client()``: to
show what the job's own client costs."""

from __future__ import annotations

from bench_counter import QUEUE, incr

import limitd


@limitd.job(name="bench.Noop", queue=QUEUE)
def noop(i: int) -> None:
    incr()
