"""The floor worker (apps/floor_app.py): not a job system but the smallest honest Python
worker, threads of BRPOP + json.loads + call, run from the project venv with limitd's
Redis client. 1 and 2 processes x 10 threads. The jobs are enqueued by limitd's own bulk
enqueue, so the payloads and the queue list are exactly limitd's."""

from __future__ import annotations

from collections.abc import Callable

from systems import limitd_system
from systems.base import APPS_DIR, Context, System, project_python

THREADS = 10


def workers(processes: int) -> Callable[[Context], list[list[str]]]:
    """One command per process, each its own session."""

    def commands(ctx: Context) -> list[list[str]]:
        command = [str(project_python()), str(APPS_DIR / "floor_app.py")]
        return [[*command, "--threads", str(THREADS)]] * processes

    return commands


SYSTEMS = [
    System(
        name=f"floor-{processes}",
        settings=(
            f"floor: {processes} process{'es' if processes > 1 else ''} x {THREADS} threads "
            "of BRPOP + json.loads + call, no framework"
        ),
        enqueue_api=f"limitd perform_bulk, {limitd_system.BULK} per LPUSH",
        workers=workers(processes),
        app="limitd_app",
        enqueue=limitd_system.enqueue,
        python=project_python(),
        missing=limitd_system.missing,
    )
    for processes in (1, 2)
]
