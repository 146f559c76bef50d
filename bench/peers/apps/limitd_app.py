"""limitd's benchmark job (imported by ``limitd start -r limitd_app``). It increments the
counter through ``limitd.redis_client()``, as the Ruby job does through ``Sidekiq.redis``:
the client limitd gives jobs for their own Redis work."""

from __future__ import annotations

from bench_counter import COUNTER_KEY, QUEUE

import limitd


@limitd.job(name="bench.Noop", queue=QUEUE)
def noop(i: int) -> None:
    limitd.redis_client().incr(COUNTER_KEY)
