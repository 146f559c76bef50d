"""Periodic jobs in one process: ticks across daylight-saving changes, the claim that
lets exactly one scheduler enqueue each tick, giving a tick back when its push fails,
and what a scheduler does on start about ticks missed while every scheduler was down."""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import clock, keys
from limitd.periodic.scheduler import PeriodicScheduler
from limitd.periodic.section import PeriodicEntry
from limitd.periodic.store import PeriodicStore, entry_key
from tests.helpers import wait_for


@limitd.job(name="periodic_test.Tick")
def tick_job(*args: Any) -> None:
    """Enqueued by the schedulers under test; never run here."""


JOB = "periodic_test.Tick"
BERLIN = "Europe/Berlin"
T0 = 1_800_000_000.0  # a whole minute (epoch seconds)


def entry(cron: str = "* * * * *", **fields: Any) -> PeriodicEntry:
    return PeriodicEntry(name=fields.pop("name", "tick"), cron=cron, job=JOB, **fields)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=timezone.utc)  # type: ignore[misc]


def queued(redis: redis_py.Redis) -> list[dict[str, Any]]:
    return [
        json.loads(raw) for raw in reversed(redis.lrange(keys.of(redis).queue("default"), 0, -1))
    ]


class Recording(PeriodicScheduler):
    """A scheduler that notes every tick it enqueued, by entry."""

    def __init__(self, redis: redis_py.Redis, entries: list[PeriodicEntry]) -> None:
        super().__init__(redis, entries)
        self.fired: list[tuple[str, float]] = []

    def fire(self, entry: PeriodicEntry, tick: float) -> list[str] | None:
        jids = super().fire(entry, tick)
        if jids:
            self.fired.append((entry.name, tick))
        return jids


def run_day(
    redis: redis_py.Redis, entries: list[PeriodicEntry], start: datetime, hours: float = 26
) -> dict[str, list[datetime]]:
    """Run one scheduler on a frozen clock from ``start`` for ``hours``, jumping to each
    wake-up time it asks for; the ticks it enqueued per entry, as UTC datetimes."""
    scheduler = Recording(redis, entries)
    with freeze_time(start) as frozen:
        end = clock.now() + hours * 3600
        while clock.now() < end:
            wait = scheduler.run_due(clock.now())
            frozen.tick(timedelta(seconds=max(wait, 0.001)))
    ticks: dict[str, list[datetime]] = {e.name: [] for e in entries}
    for name, tick in scheduler.fired:
        ticks[name].append(datetime.fromtimestamp(tick, timezone.utc))
    return ticks


def local(moments: list[datetime]) -> list[str]:
    zone = PeriodicEntry("x", "* * * * *", "x", tz=BERLIN).zone
    return [moment.astimezone(zone).strftime("%m-%d %H:%M%z") for moment in moments]


# --- ticks across daylight-saving changes -------------------------------------------


def test_spring_forward_runs_a_fixed_time_in_the_skipped_hour_once_after_the_gap(
    redis: redis_py.Redis,
) -> None:
    """2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist that day."""
    entries = [
        entry("30 2 * * *", name="fixed", tz=BERLIN),
        entry("0 4 * * *", name="after", tz=BERLIN),
        entry("*/30 * * * *", name="halfhour", tz=BERLIN),
        entry("15 * * * *", name="hourly", tz=BERLIN),
    ]
    ticks = run_day(redis, entries, utc(2026, 3, 28, 12), hours=48)
    assert local(ticks["fixed"]) == ["03-29 03:00+0200", "03-30 02:30+0200"]
    assert local(ticks["after"]) == ["03-29 04:00+0200", "03-30 04:00+0200"]
    gaps = {(b - a).total_seconds() for a, b in pairwise(ticks["halfhour"])}
    assert gaps == {1800.0}, "every half hour of real time, none lost, none twice"
    assert len(ticks["halfhour"]) == 48 * 2 - 1  # the ticks strictly inside the 48 hours
    hourly = {(b - a).total_seconds() for a, b in pairwise(ticks["hourly"])}
    assert hourly == {3600.0}, "no extra run at 03:00 for the 02:15 that did not exist"


def test_fall_back_runs_a_fixed_time_in_the_repeated_hour_once(redis: redis_py.Redis) -> None:
    """2026-10-25 03:00 CEST -> 02:00 CET: 02:00-02:59 happens twice."""
    entries = [
        entry("30 2 * * *", name="fixed", tz=BERLIN),
        entry("0 2 * * *", name="two", tz=BERLIN),
        entry("*/30 * * * *", name="halfhour", tz=BERLIN),
    ]
    ticks = run_day(redis, entries, utc(2026, 10, 24, 12), hours=48)
    assert local(ticks["fixed"]) == ["10-25 02:30+0200", "10-26 02:30+0100"]
    assert local(ticks["two"]) == ["10-25 02:00+0200", "10-26 02:00+0100"]
    gaps = {(b - a).total_seconds() for a, b in pairwise(ticks["halfhour"])}
    assert gaps == {1800.0}, "an every-hour entry follows real time through both passes"
    assert local(ticks["halfhour"]).count("10-25 02:30+0100") == 1
    assert local(ticks["halfhour"]).count("10-25 02:30+0200") == 1


def test_a_seconds_field_comes_first() -> None:
    every_20s = entry("*/20 * * * * *")
    assert every_20s.next_tick(T0) == T0 + 20
    assert every_20s.next_tick(T0 + 0.5) == T0 + 20
    assert every_20s.latest_tick(T0 + 19.9) == T0
    assert every_20s.latest_tick(T0 + 20) == T0 + 20


# --- the claim ------------------------------------------------------------------------


def test_each_tick_is_claimed_once_by_schedulers_racing_on_one_redis(
    redis: redis_py.Redis,
) -> None:
    ticks = [T0 + 60 * n for n in range(40)]
    every_minute = entry()
    schedulers = [PeriodicScheduler(redis, [every_minute]) for _ in range(8)]
    start = threading.Barrier(len(schedulers))
    won: list[tuple[float, str]] = []
    lock = threading.Lock()

    def race(scheduler: PeriodicScheduler) -> None:
        start.wait()
        for tick in ticks:
            jids = scheduler.fire(every_minute, tick)
            with lock:
                won.extend((tick, jid) for jid in jids or [])

    threads = [threading.Thread(target=race, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(tick for tick, _ in won) == ticks, "each tick won exactly once"
    assert sorted(job["jid"] for job in queued(redis)) == sorted(jid for _, jid in won)
    record = PeriodicStore(redis).records(["tick"])["tick"]
    assert record.last_tick == ticks[-1]


def test_an_older_or_equal_tick_is_refused(redis: redis_py.Redis) -> None:
    store = PeriodicStore(redis)
    assert store.claim("tick", T0 + 60, "a" * 24, T0 + 60) is not None
    assert store.claim("tick", T0 + 60, "b" * 24, T0 + 60) is None
    assert store.claim("tick", T0, "c" * 24, T0 + 60) is None
    assert store.claim("tick", T0 + 120, "d" * 24, T0 + 120) is not None


def test_a_failed_push_gives_the_tick_back_and_logs_jid_and_job(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    every_minute = entry()
    scheduler = PeriodicScheduler(redis, [every_minute])
    assert scheduler.fire(every_minute, T0)
    before = redis.hgetall(entry_key(keys.of(redis), "tick"))

    def refuse(payloads: Any) -> None:
        raise redis_py.ConnectionError("queue write lost")

    client = limitd.default_client()
    monkeypatch.setattr(client, "raw_push", refuse)
    with caplog.at_level(logging.ERROR, logger="limitd.periodic"):
        assert scheduler.fire(every_minute, T0 + 60) is None
    assert redis.hgetall(entry_key(keys.of(redis), "tick")) == before, "the claim was given back"
    [failure] = [r for r in caplog.records if "push failed" in r.getMessage()]
    assert "class=periodic_test.Tick" in failure.getMessage()
    jid = failure.getMessage().split("jid=")[1].split()[0]
    assert len(jid) == 24 and failure.exc_info is not None

    monkeypatch.undo()
    assert scheduler.fire(every_minute, T0 + 60), "the tick can be claimed again"
    assert [job["class"] for job in queued(redis)] == ["periodic_test.Tick"] * 2


def test_giving_back_never_undoes_a_later_tick(redis: redis_py.Redis) -> None:
    store = PeriodicStore(redis)
    first = store.claim("tick", T0, "a" * 24, T0)
    later = store.claim("tick", T0 + 60, "b" * 24, T0 + 60)
    assert first is not None and later is not None
    assert store.give_back(first) is False
    assert store.records(["tick"])["tick"].last_jid == "b" * 24
    assert store.give_back(later) is True
    assert store.records(["tick"])["tick"].last_tick == T0


def test_giving_back_the_first_ever_claim_leaves_no_run(redis: redis_py.Redis) -> None:
    store = PeriodicStore(redis)
    claim = store.claim("tick", T0, "a" * 24, T0)
    assert claim is not None and store.give_back(claim)
    assert store.records(["tick"])["tick"].last_tick is None


def test_a_halted_push_counts_the_tick_as_run_without_a_jid(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    every_minute = entry()
    monkeypatch.setattr(limitd.default_client(), "push", lambda item, spec=None: None)
    assert PeriodicScheduler(redis, [every_minute]).fire(every_minute, T0) == []
    record = PeriodicStore(redis).records(["tick"])["tick"]
    assert record.last_tick == T0 and record.last_jid is None


def test_the_job_is_pushed_with_its_args_through_the_default_client(
    redis: redis_py.Redis,
) -> None:
    by_path = PeriodicEntry("path", "* * * * *", f"{__name__}.tick_job", args=[1, "x"])
    [jid] = PeriodicScheduler(redis, [by_path]).fire(by_path, T0) or []
    [job] = queued(redis)
    assert (job["jid"], job["class"], job["args"]) == (jid, "periodic_test.Tick", [1, "x"])
    assert job["periodic"] == {"name": "path", "tick": T0}
    assert PeriodicStore(redis).records(["path"])["path"].last_jid == jid


def test_a_scheduler_woken_a_little_late_tries_each_tick_it_slept_through(
    redis: redis_py.Redis,
) -> None:
    every_second = entry("* * * * * *")
    scheduler = Recording(redis, [every_second])
    scheduler.run_due(T0 + 0.5)
    scheduler.run_due(T0 + 4.5)
    assert [tick for _, tick in scheduler.fired] == [T0 + 1, T0 + 2, T0 + 3, T0 + 4]


def test_a_scheduler_woken_much_later_runs_the_grace_window_not_the_backlog(
    redis: redis_py.Redis,
) -> None:
    every_second = entry("* * * * * *")
    scheduler = Recording(redis, [every_second])
    scheduler.run_due(T0 + 0.5)
    scheduler.run_due(T0 + 3600.5)
    assert [tick for _, tick in scheduler.fired] == [T0 + 3596 + n for n in range(5)]
    every_hour = entry("0 * * * *", name="hourly")
    hourly = Recording(redis, [every_hour])
    hourly.run_due(T0 + 0.5)
    hourly.run_due(T0 + 5 * 3600 + 60)
    assert [tick for _, tick in hourly.fired] == [T0 + 5 * 3600], "the latest, once"


def test_a_tick_claimed_elsewhere_is_not_enqueued_again_by_a_late_scheduler(
    redis: redis_py.Redis,
) -> None:
    every_second = entry("* * * * * *")
    late, punctual = Recording(redis, [every_second]), Recording(redis, [every_second])
    late.run_due(T0 + 0.5)
    assert punctual.fire(every_second, T0 + 3)
    late.run_due(T0 + 4.5)
    assert [tick for _, tick in late.fired] == [T0 + 4]
    assert len(queued(redis)) == 2


# --- missed ticks ----------------------------------------------------------------------


def ran_at(redis: redis_py.Redis, every_minute: PeriodicEntry, tick: float) -> None:
    assert PeriodicScheduler(redis, [every_minute]).fire(every_minute, tick)
    redis.delete(keys.of(redis).queue("default"))


def test_missed_once_runs_the_latest_missed_tick_once_on_start(redis: redis_py.Redis) -> None:
    every_minute = entry(missed="once")
    ran_at(redis, every_minute, T0)
    down_until = T0 + 5 * 60 + 30  # five ticks missed
    for _ in range(3):  # three supervisors start
        PeriodicScheduler(redis, [every_minute]).catch_up(down_until)
    assert len(queued(redis)) == 1, "once, never a burst"
    assert PeriodicStore(redis).records(["tick"])["tick"].last_tick == T0 + 5 * 60


def test_missed_skip_waits_for_the_next_tick(redis: redis_py.Redis) -> None:
    every_minute = entry(missed="skip")
    ran_at(redis, every_minute, T0)
    scheduler = PeriodicScheduler(redis, [every_minute])
    scheduler.catch_up(T0 + 5 * 60 + 30)
    assert queued(redis) == []
    assert scheduler.run_due(T0 + 5 * 60 + 30) == pytest.approx(30)


def test_nothing_is_missed_when_the_latest_tick_already_ran(redis: redis_py.Redis) -> None:
    every_minute = entry(missed="once")
    ran_at(redis, every_minute, T0 + 60)
    PeriodicScheduler(redis, [every_minute]).catch_up(T0 + 90)
    assert queued(redis) == []


def test_an_entry_that_never_ran_does_not_backfill(redis: redis_py.Redis) -> None:
    PeriodicScheduler(redis, [entry(missed="once")]).catch_up(T0 + 3600)
    assert queued(redis) == []


def test_start_records_the_entries_for_metrics_and_the_listing(redis: redis_py.Redis) -> None:
    PeriodicScheduler(redis, [entry("0 3 * * *", tz=BERLIN)]).catch_up(T0)
    store = PeriodicStore(redis)
    assert store.names() == ["tick"]
    record = store.records(["tick"])["tick"]
    assert (record.cron, record.tz, record.job) == ("0 3 * * *", BERLIN, JOB)


# --- the thread ----------------------------------------------------------------------------


def test_the_thread_enqueues_each_second_and_stops_promptly(redis: redis_py.Redis) -> None:
    every_second = entry("* * * * * *")
    scheduler = PeriodicScheduler(redis, [every_second])
    scheduler.start()
    try:
        wait_for(lambda: len(queued(redis)) >= 2, timeout=10, message="two ticks enqueued")
    finally:
        started = clock.monotonic()
        scheduler.stop()
    assert clock.monotonic() - started < 1.0, "stop wakes the sleeping thread"
    record = PeriodicStore(redis).records(["tick"])["tick"]
    assert record.last_jid == queued(redis)[-1]["jid"]


def test_redis_errors_are_logged_and_the_thread_keeps_going(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    every_second = entry("* * * * * *")
    scheduler = PeriodicScheduler(redis, [every_second])
    calls = {"n": 0}
    real_claim = scheduler.store.claim

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise redis_py.ConnectionError("redis went away")
        return real_claim(*args)

    monkeypatch.setattr(scheduler.store, "claim", flaky)
    scheduler.start()
    try:
        wait_for(lambda: queued(redis), timeout=10, message="a tick after the errors")
    finally:
        scheduler.stop()
    assert queued(redis), "a later tick was enqueued after the errors"
    assert any("could not claim" in r.getMessage() for r in caplog.records)
