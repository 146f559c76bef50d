"""Periodic entries with ``capacity: true``: each tick calls ``perform_with_capacity``
on the limited-capacity job, and Redis records the jids it enqueued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.capacity.job import LimitedCapacityJob
from limitd.config import load_config
from limitd.config.app_checks import check_app
from limitd.periodic.scheduler import PeriodicScheduler
from limitd.periodic.section import PeriodicEntry
from limitd.periodic.store import PeriodicStore, entry_key

QUEUE = "periodic_capacity"
T0 = 1_800_000_000.0


class Refill(LimitedCapacityJob, name="periodic_capacity_test.Refill", queue=QUEUE):
    """Three copies at most, with as much work left as the test says."""

    remaining = 10

    def perform_work(self, *args: Any) -> None:
        """Never run here: the tests only enqueue."""

    def remaining_work_count(self, *args: Any) -> int:
        return Refill.remaining

    def max_running_jobs(self) -> int:
        return 3


def refill_entry() -> PeriodicEntry:
    return PeriodicEntry("refill", "* * * * *", "periodic_capacity_test.Refill", capacity=True)


def queued(redis: redis_py.Redis) -> list[str]:
    return [json.loads(raw)["jid"] for raw in redis.lrange(keys.of(redis).queue(QUEUE), 0, -1)]


def test_capacity_entries_fill_the_free_places_and_record_their_jids(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Refill, "remaining", 10)
    scheduler = PeriodicScheduler(redis, [refill_entry()])
    jids = scheduler.fire(refill_entry(), T0)
    assert jids is not None and len(jids) == 3 and sorted(queued(redis)) == sorted(jids)
    record = PeriodicStore(redis).records(["refill"])["refill"]
    assert record.last_tick == T0 and sorted((record.last_jid or "").split()) == sorted(jids)
    assert scheduler.fire(refill_entry(), T0 + 60) == [], "no free place: nothing more"
    assert PeriodicStore(redis).records(["refill"])["refill"].last_jid is None


def test_a_failing_capacity_refill_gives_the_tick_back(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any, *args: Any) -> int:
        raise RuntimeError("backlog table unreachable")

    monkeypatch.setattr(Refill, "remaining_work_count", broken)
    assert PeriodicScheduler(redis, [refill_entry()]).fire(refill_entry(), T0) is None
    assert redis.hgetall(entry_key(keys.of(redis), "refill")) == {}
    assert queued(redis) == []


def test_capacity_true_on_a_limited_capacity_job_passes_the_check(tmp_path: Path) -> None:
    file = tmp_path / "a.yml"
    file.write_text(
        "periodic:\n  refill:\n    cron: '*/5 * * * *'\n"
        "    job: periodic_capacity_test.Refill\n    capacity: true\n"
    )
    check_app(load_config([file]), [Refill.spec])  # other modules' jobs fail other checks


def test_capacity_job_finds_the_class_by_wire_name_as_the_scheduler_needs() -> None:
    from limitd.capacity.job import capacity_job

    assert capacity_job("periodic_capacity_test.Refill") is Refill
    assert limitd.LimitedCapacityJob is LimitedCapacityJob
