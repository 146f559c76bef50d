"""RQ: 2 ``rq worker`` processes (each forks a work horse per job, RQ's default), and
2 processes of the non-forking SimpleWorker. Results not kept (result_ttl=0), --quiet
(no per-job line).

Both drain at a few hundred jobs/s or less on 2 cores (the forking one about 75), so
they run fewer jobs per run to keep a default run under 15 minutes; their start-up is
still well under 2% of a drain."""

from __future__ import annotations

from collections.abc import Callable

from systems.base import PEERS_BIN, QUEUE, Context, System

PROCESSES = 2
BULK = 1000


def enqueue(jobs: int) -> None:
    """``Queue.enqueue_many``: one pipeline per 1,000 jobs."""
    import rq_app
    from bench_counter import redis_url
    from redis import Redis
    from rq import Queue

    queue = Queue(QUEUE, connection=Redis.from_url(redis_url()))
    for start in range(0, jobs, BULK):
        queue.enqueue_many(
            [
                Queue.prepare_data(rq_app.noop, (i,), result_ttl=0)
                for i in range(start, min(start + BULK, jobs))
            ]
        )


def workers(worker_class: str) -> Callable[[Context], list[list[str]]]:
    def commands(ctx: Context) -> list[list[str]]:
        command = [str(PEERS_BIN / "rq"), "worker", "--url", ctx.url, "-w", worker_class]
        command += ["--quiet", "--disable-job-desc-logging", QUEUE]
        return [command] * PROCESSES

    return commands


def _system(name: str, worker_class: str, max_jobs: int) -> System:
    return System(
        name=name,
        settings=f"{PROCESSES} x rq worker -w {worker_class}, result_ttl=0, --quiet",
        max_jobs=max_jobs,
        enqueue_api=f"enqueue_many, {BULK} per pipeline",
        workers=workers(worker_class),
        app="rq_app",
        enqueue=enqueue,
    )


SYSTEMS = [
    _system("rq", "rq.worker.Worker", max_jobs=2_000),
    _system("rq-simple", "rq.worker.SimpleWorker", max_jobs=4_000),
]
