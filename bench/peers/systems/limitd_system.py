"""limitd: ``limitd start`` from the project venv, 1 and 2 capsule processes x 10
threads, limit fetch with a limit of 1,000 on the queue (never binding, so the
limit-aware fetch is what is measured), logging at WARNING (no per-job INFO line)."""

from __future__ import annotations

from collections.abc import Callable

from systems.base import PROJECT_BIN, QUEUE, Context, System, project_python

THREADS = 10
LIMIT = 1000
BULK = 1000

CONFIG = """\
redis:
  url: {url}
logging:
  level: WARNING
require: [limitd_app]
queues: [{queue}]
concurrency: {threads}
processes: {processes}
fetch: limit
limits: {{{queue}: {limit}}}
"""


def enqueue(jobs: int) -> None:
    """The documented bulk path: one LPUSH per 1,000 jobs through the default client."""
    import limitd_app
    import redis

    import limitd

    limitd.set_default_client(limitd.Client(redis.Redis.from_url(_url())))
    limitd_app.noop.perform_bulk([[i] for i in range(jobs)], batch_size=BULK)


def _url() -> str:
    from bench_counter import redis_url

    return redis_url()


def workers(processes: int) -> Callable[[Context], list[list[str]]]:
    """``limitd start`` on a YAML config written for this run (flags cannot set the log
    level)."""

    def commands(ctx: Context) -> list[list[str]]:
        config = ctx.tmp / f"limitd-{processes}.yml"
        config.write_text(
            CONFIG.format(
                url=ctx.url, queue=QUEUE, threads=THREADS, processes=processes, limit=LIMIT
            )
        )
        return [[str(PROJECT_BIN / "limitd"), "start", str(config)]]

    return commands


def missing() -> str | None:
    if not (PROJECT_BIN / "limitd").exists():
        return f"{PROJECT_BIN / 'limitd'} not found (pip install -e . in the project venv)"
    return None


SYSTEMS = [
    System(
        name=f"limitd-{processes}",
        settings=(
            f"limitd start, {processes} capsule process{'es' if processes > 1 else ''} x "
            f"{THREADS} threads, fetch: limit, limits {{{QUEUE}: {LIMIT}}} (not binding), "
            "logging WARNING"
        ),
        enqueue_api=f"perform_bulk, {BULK} per LPUSH",
        workers=workers(processes),
        app="limitd_app",
        enqueue=enqueue,
        python=project_python(),
        missing=missing,
    )
    for processes in (1, 2)
]
