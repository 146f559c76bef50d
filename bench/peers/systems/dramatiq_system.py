"""Dramatiq on the Redis broker: 2 processes x 8 threads (its default middleware; it
logs no line per message)."""

from __future__ import annotations

from systems.base import PEERS_BIN, QUEUE, Context, System

PROCESSES = 2
THREADS = 8


def enqueue(jobs: int) -> None:
    """Dramatiq's Redis broker enqueues one message per call: a loop of ``send``."""
    import dramatiq_app

    for i in range(jobs):
        dramatiq_app.noop.send(i)


def workers(ctx: Context) -> list[list[str]]:
    return [
        [
            str(PEERS_BIN / "dramatiq"),
            *("dramatiq_app", "-p", str(PROCESSES), "-t", str(THREADS), "-Q", QUEUE),
        ]
    ]


SYSTEMS = [
    System(
        name="dramatiq",
        settings=f"dramatiq -p {PROCESSES} -t {THREADS}, Redis broker, max_retries=0",
        enqueue_api="loop of send()",
        workers=workers,
        app="dramatiq_app",
        enqueue=enqueue,
    )
]
