"""The periodic feature as plugged in: a scheduler service only for a config with
entries, and the metrics ``limitd metrics`` gathers from it."""

from __future__ import annotations

import time
from typing import Any

import redis as redis_py

import limitd
from limitd.periodic.plug import PERIODIC, periodic_services
from limitd.periodic.scheduler import PeriodicScheduler
from limitd.periodic.section import PeriodicEntry, PeriodicSettings
from limitd.plugins import ProcessContext

T0 = 1_800_000_000.0


@limitd.job(name="periodic_plug_test.Job")
def job(*args: Any) -> None:
    """Enqueued, never run here."""


def context(redis: redis_py.Redis, settings: PeriodicSettings | None) -> ProcessContext:
    sections = {} if settings is None else {"periodic": settings}
    return ProcessContext(redis, sections, capsule=None, chain=None)


def test_a_scheduler_runs_only_when_the_config_has_entries(redis: redis_py.Redis) -> None:
    entries = (PeriodicEntry("e", "* * * * *", "periodic_plug_test.Job"),)
    [service] = periodic_services(context(redis, PeriodicSettings(entries)))
    assert isinstance(service, PeriodicScheduler) and service.entries == entries
    assert periodic_services(context(redis, PeriodicSettings())) == []
    assert periodic_services(context(redis, None)) == []


def test_metrics_give_last_and_next_run_by_name(redis: redis_py.Redis) -> None:
    ran = PeriodicEntry("ran", "* * * * *", "periodic_plug_test.Job")
    waiting = PeriodicEntry("waiting", "0 3 * * *", "periodic_plug_test.Job")
    scheduler = PeriodicScheduler(redis, [ran, waiting])
    scheduler.catch_up(T0)
    assert scheduler.fire(ran, T0)
    assert PERIODIC.metrics is not None
    families = {family.name: family for family in PERIODIC.metrics(redis)}
    last = families["limitd_periodic_last_run_timestamp_seconds"]
    upcoming = families["limitd_periodic_next_run_timestamp_seconds"]
    [sample] = last.samples
    assert sample.labels == {"name": "ran"} and abs(sample.value - time.time()) < 60
    assert sorted(s.labels["name"] for s in upcoming.samples) == ["ran", "waiting"]


def test_the_metrics_read_redis_in_two_round_trips(redis: redis_py.Redis) -> None:
    entries = [PeriodicEntry(f"e{n}", "* * * * *", "periodic_plug_test.Job") for n in range(50)]
    PeriodicScheduler(redis, entries).catch_up(T0)
    calls: list[str] = []
    original = redis.execute_command
    pipeline = redis.pipeline

    def counted(*args: Any, **options: Any) -> Any:
        calls.append(str(args[0]))
        return original(*args, **options)

    def counted_pipeline(*args: Any, **options: Any) -> Any:
        calls.append("PIPELINE")
        return pipeline(*args, **options)

    redis.execute_command = counted  # type: ignore[method-assign]
    redis.pipeline = counted_pipeline  # type: ignore[method-assign]
    try:
        assert PERIODIC.metrics is not None
        samples = [s for family in PERIODIC.metrics(redis) for s in family.samples]
    finally:
        del redis.execute_command, redis.pipeline
    assert len(samples) == 50
    assert calls == ["SMEMBERS", "PIPELINE"]
