"""Celery's benchmark app: Redis broker, no result backend, a larger prefetch for short
tasks (Celery's own advice for many short tasks)."""

from __future__ import annotations

from bench_counter import QUEUE, incr, redis_url
from celery import Celery

PREFETCH_MULTIPLIER = 32

app = Celery("celery_app", broker=redis_url())
app.conf.update(
    task_ignore_result=True,
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.noop")
def noop(i: int) -> None:
    incr()
