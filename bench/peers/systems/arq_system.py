"""arq: 2 worker processes, max_jobs 10 each, results not kept, poll_delay 0.05 s
(default 0.5 s), logging at WARNING."""

from __future__ import annotations

from systems.base import APPS_DIR, PEERS_BIN, Context, System

PROCESSES = 2


def enqueue(jobs: int) -> None:
    """arq has no bulk enqueue: a loop of ``enqueue_job``."""
    import asyncio

    asyncio.run(_enqueue(jobs))


async def _enqueue(jobs: int) -> None:
    from arq import create_pool
    from arq_app import QUEUE_NAME, WorkerSettings

    pool = await create_pool(WorkerSettings.redis_settings, default_queue_name=QUEUE_NAME)
    try:
        for i in range(jobs):
            await pool.enqueue_job("noop", i)
    finally:
        await pool.aclose()


def workers(ctx: Context) -> list[list[str]]:
    return [[str(PEERS_BIN / "python"), str(APPS_DIR / "arq_app.py")]] * PROCESSES


SYSTEMS = [
    System(
        name="arq",
        settings=(
            f"{PROCESSES} worker processes x max_jobs 10, keep_result 0, poll_delay 0.05 s, "
            "logging WARNING"
        ),
        enqueue_api="loop of enqueue_job()",
        workers=workers,
        app="arq_app",
        enqueue=enqueue,
    )
]
