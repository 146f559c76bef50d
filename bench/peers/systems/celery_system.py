"""Celery with the Redis broker: the prefork pool with 2 processes, and the threads pool
with 10 threads in one process. No result backend, prefetch multiplier 32, no gossip,
mingle or worker heartbeat, log level WARNING."""

from __future__ import annotations

from collections.abc import Callable

from systems.base import PEERS_BIN, QUEUE, Context, System

FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]


def enqueue(jobs: int) -> None:
    """Celery has no bulk send for independent tasks: a loop of ``delay``."""
    import celery_app

    for i in range(jobs):
        celery_app.noop.delay(i)


def workers(pool: str, concurrency: int) -> Callable[[Context], list[list[str]]]:
    def commands(ctx: Context) -> list[list[str]]:
        return [
            [
                str(PEERS_BIN / "celery"),
                *("-A", "celery_app", "worker", "-Q", QUEUE),
                *("-P", pool, "-c", str(concurrency), *FLAGS),
            ]
        ]

    return commands


def _system(name: str, pool: str, concurrency: int, shape: str) -> System:
    return System(
        name=name,
        settings=(
            f"celery worker -P {pool} -c {concurrency} ({shape}), Redis broker, "
            "prefetch multiplier 32, ignore_result, without gossip/mingle/heartbeat, -l WARNING"
        ),
        enqueue_api="loop of delay()",
        workers=workers(pool, concurrency),
        app="celery_app",
        enqueue=enqueue,
    )


SYSTEMS = [
    _system("celery-prefork", "prefork", 2, "2 processes"),
    _system("celery-threads", "threads", 10, "1 process x 10 threads"),
]
