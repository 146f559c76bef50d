"""Processed and failed over time: per-minute counters written by the capsules' flush and
read back for the last hour, and Sidekiq's per-day counters for the last days."""

from __future__ import annotations

import datetime as dt

import redis as redis_py
from freezegun import freeze_time

from limitd import keys
from limitd.api.stats import daily_history, minute_history
from limitd.supervisor.stats import JobStats

T0 = dt.datetime(2026, 11, 23, 10, 15, 30, tzinfo=dt.timezone.utc)


def flush(redis: redis_py.Redis, processed: int, failed: int) -> None:
    stats = JobStats()
    for index in range(processed):
        stats.record(failed=index < failed)
    stats.flush(redis)


def test_the_last_hour_per_minute_with_quiet_minutes_as_zeros(redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        flush(redis, 5, 1)
        frozen.tick(dt.timedelta(minutes=2))
        flush(redis, 3, 0)
        flush(redis, 2, 2)
        history = minute_history(redis, minutes=4)
    start = T0.replace(second=0).timestamp()
    assert history == [
        (start - 60, 0, 0),
        (start, 5, 1),
        (start + 60, 0, 0),
        (start + 120, 5, 2),
    ]


def test_minute_counters_expire_after_two_hours(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        flush(redis, 1, 1)
    minute = int(T0.timestamp() // 60)
    for stat in (keys.of(redis).STAT_PROCESSED, keys.of(redis).STAT_FAILED):
        assert 0 < redis.ttl(keys.minute_stat(stat, minute)) <= keys.MINUTE_STAT_TTL


def test_the_last_days_from_the_per_day_keys(redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        flush(redis, 4, 1)
        frozen.tick(dt.timedelta(days=1))
        flush(redis, 2, 0)
        history = daily_history(redis, days=3)
    assert history == [("2026-11-22", 0, 0), ("2026-11-23", 4, 1), ("2026-11-24", 2, 0)]
    assert int(redis.get(keys.of(redis).STAT_PROCESSED)) == 6
