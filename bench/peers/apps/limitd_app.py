"""limitd's benchmark job (imported by ``limitd start -r limitd_app``)."""

from __future__ import annotations

from bench_counter import QUEUE, incr

import limitd


@limitd.job(name="bench.Noop", queue=QUEUE)
def noop(i: int) -> None:
    incr()
