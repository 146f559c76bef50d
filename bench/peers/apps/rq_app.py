"""RQ's benchmark job; the queue is built by the enqueuer, the workers name it."""

from __future__ import annotations

from bench_counter import incr


def noop(i: int) -> None:
    incr()
