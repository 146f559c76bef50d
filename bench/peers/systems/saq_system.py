"""saq: ``saq --workers 2`` (2 processes), concurrency 10 each, job records deleted on
completion (ttl=-1), default (ERROR) logging."""

from __future__ import annotations

from systems.base import PEERS_BIN, Context, System

PROCESSES = 2


def enqueue(jobs: int) -> None:
    """saq has no bulk enqueue (``map`` also waits for results): a loop of ``enqueue``."""
    import asyncio

    asyncio.run(_enqueue(jobs))


async def _enqueue(jobs: int) -> None:
    from saq_app import queue

    await queue.connect()
    try:
        for i in range(jobs):
            await queue.enqueue("noop", i=i, ttl=-1)
    finally:
        await queue.disconnect()


def workers(ctx: Context) -> list[list[str]]:
    return [[str(PEERS_BIN / "saq"), "saq_app.settings", "--workers", str(PROCESSES)]]


SYSTEMS = [
    System(
        name="saq",
        settings=f"saq --workers {PROCESSES}, concurrency 10, ttl=-1",
        enqueue_api="loop of enqueue()",
        workers=workers,
        app="saq_app",
        enqueue=enqueue,
    )
]
