"""huey: one consumer with 10 worker threads on Redis storage (blocking dequeue),
results off, quiet logging, no periodic tasks."""

from __future__ import annotations

from systems.base import PEERS_BIN, Context, System

THREADS = 10


def enqueue(jobs: int) -> None:
    """``task.map``: huey's call for enqueueing many (one LPUSH per task inside)."""
    import huey_app

    huey_app.noop.map(range(jobs))


def workers(ctx: Context) -> list[list[str]]:
    return [
        [
            str(PEERS_BIN / "huey_consumer"),
            *("huey_app.huey", "-w", str(THREADS), "-k", "thread", "-q", "-n"),
        ]
    ]


SYSTEMS = [
    System(
        name="huey",
        settings=f"huey_consumer -w {THREADS} -k thread, RedisHuey(results=False), -q -n",
        enqueue_api="task.map()",
        workers=workers,
        app="huey_app",
        enqueue=enqueue,
    )
]
