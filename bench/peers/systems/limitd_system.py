"""limitd: ``limitd start`` from the project venv, 1 and 2 capsule processes x 10
threads, logging at WARNING (no per-job INFO line). ``limitd-N`` uses the limit fetch
with a limit of 1,000 on the queue (never binding, so the limit-aware fetch is what is
measured); ``limitd-basic-N`` the basic fetch, no limits, to show what the limit fetch
costs on top of it. Their job counts through ``limitd.redis_client()``;
``limitd-plain-N`` is ``limitd-N`` with a job that counts through a plain ``redis.Redis``
(apps/limitd_plain_app.py), as the Python peers' jobs do. ``limitd-N`` runs with the
default ``cpu_affinity: auto``; ``limitd-pinned-N`` with ``cpu_affinity: 1`` (each
capsule process keeps its threads on one CPU, whatever else runs there), and
``limitd-unpinned-N`` with ``cpu_affinity: none`` (the kernel places the threads: the
default before ``auto``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from systems.base import PROJECT_BIN, QUEUE, Context, System, project_python

THREADS = 10
LIMIT = 1000
BULK = 1000
OTHER = "@other"  # the suffix of the twins run.py --compare adds

CONFIG = """\
redis:
  url: {url}
logging:
  level: WARNING
require: [{app}]
queues: [{queue}]
concurrency: {threads}
processes: {processes}
fetch: {fetch}
"""
LIMITS_LINE = "limits: {{{queue}: {limit}}}\n"


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


def workers(
    processes: int,
    fetch: str,
    app: str = "limitd_app",
    threads: int = THREADS,
    extra: str = "",
) -> Callable[[Context], list[list[str]]]:
    """``limitd start`` on a YAML config written for this run (flags cannot set the log
    level); the limit fetch gets its (never binding) limit; ``extra``: more lines."""

    def commands(ctx: Context) -> list[list[str]]:
        config = ctx.tmp / f"{app}-{fetch}-{processes}x{threads}{'-extra' if extra else ''}.yml"
        text = CONFIG.format(
            url=ctx.url,
            app=app,
            queue=QUEUE,
            threads=threads,
            processes=processes,
            fetch=fetch,
        )
        if fetch == "limit":
            text += LIMITS_LINE.format(queue=QUEUE, limit=LIMIT)
        config.write_text(text + extra)
        return [[str(PROJECT_BIN / "limitd"), "start", str(config)]]

    return commands


def twin(system: System, root: Path, origin: str) -> System:
    """``system`` named ``NAME@other``, its enqueue and workers importing the limitd
    package of the checkout at ``root`` (put first on their PYTHONPATH: the project
    venv's ``limitd`` script then imports it from there); ``origin`` is where a process
    with that PYTHONPATH was seen to import it from, for the settings line. The enqueue
    is the original's (enqueue.py looks the system up by its name)."""
    return replace(
        system,
        name=system.name + OTHER,
        settings=f"{system.settings}; limitd imported from {origin} (--compare)",
        enqueue_command=system.enqueue_argv,
        pythonpath=(root, *system.pythonpath),
    )


def missing() -> str | None:
    if not (PROJECT_BIN / "limitd").exists():
        return f"{PROJECT_BIN / 'limitd'} not found (pip install -e . in the project venv)"
    return None


def _settings(processes: int, fetch: str) -> str:
    plural = "es" if processes > 1 else ""
    limits = f", limits {{{QUEUE}: {LIMIT}}} (not binding)" if fetch == "limit" else ""
    return (
        f"limitd start, {processes} capsule process{plural} x {THREADS} threads, "
        f"fetch: {fetch}{limits}, logging WARNING"
    )


def _name(processes: int, fetch: str) -> str:
    return f"limitd-{processes}" if fetch == "limit" else f"limitd-{fetch}-{processes}"


def _limit_variant(
    name: str, processes: int, what: str, app: str = "limitd_app", extra: str = ""
) -> System:
    """``limitd-N`` (the limit fetch) with one thing changed: ``what``."""
    return System(
        name=name,
        settings=f"{_settings(processes, 'limit')}, {what}",
        enqueue_api=f"perform_bulk, {BULK} per LPUSH",
        workers=workers(processes, "limit", app=app, extra=extra),
        app="limitd_app",
        enqueue=enqueue,
        python=project_python(),
        missing=missing,
    )


SYSTEMS = (
    [
        System(
            name=_name(processes, fetch),
            settings=_settings(processes, fetch),
            enqueue_api=f"perform_bulk, {BULK} per LPUSH",
            workers=workers(processes, fetch),
            app="limitd_app",
            enqueue=enqueue,
            python=project_python(),
            missing=missing,
        )
        for fetch in ("limit", "basic")
        for processes in (1, 2)
    ]
    + [
        _limit_variant(
            f"limitd-plain-{p}",
            p,
            "the job's INCR through a plain redis.Redis",
            app="limitd_plain_app",
        )
        for p in (1, 2)
    ]
    + [
        _limit_variant(
            f"limitd-pinned-{p}",
            p,
            "cpu_affinity: 1 (each process on one CPU)",
            extra="cpu_affinity: 1\n",
        )
        for p in (1, 2)
    ]
    + [
        _limit_variant(
            f"limitd-unpinned-{p}",
            p,
            "cpu_affinity: none (the kernel places the threads)",
            extra="cpu_affinity: none\n",
        )
        for p in (1, 2)
    ]
)
