"""Expiring jobs (``expires_in``) through real Redis in one process: the deadline stamped
at push (from ``created_at``, or from ``at`` for a scheduled job), a job past it dropped
unrun by a capsule's drain, counted, logged and settled (its batch, its stats), a retry
that comes due after it dropped too, and the option's forms and mistakes. The run under
``limitd start`` is in test_expiry_processes.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Iterator

import pytest
import redis as redis_py
from freezegun import freeze_time
from prometheus_client import CollectorRegistry

import limitd
from limitd import keys
from limitd.expiry.middleware import ExpiryCheck, deadline_of
from limitd.metrics.jobs import JobMetrics
from limitd.options import InvalidJobOption
from limitd.supervisor import Capsule, CapsuleConfig

T0 = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.timezone.utc)
EPOCH0 = T0.timestamp()
ran: list[str] = []


@limitd.job(name="expiry_test.Warm", expires_in=60)
def warm(key: str) -> None:
    ran.append(key)


@limitd.job(name="expiry_test.Plain")
def plain(key: str) -> None:
    ran.append(key)


@limitd.job(
    name="expiry_test.FailsOnce", expires_in=dt.timedelta(seconds=30), retry_in=lambda *_: 40
)
def fails_once(key: str) -> None:
    if "retry_count" not in (limitd.current_payload() or {}):
        raise ValueError("first run fails")
    ran.append(key)


@limitd.job(name="expiry_test.AsyncWarm", expires_in=60)
async def async_warm(key: str) -> None:
    ran.append(key)


@limitd.job(name="expiry_test.Callback", queue="callbacks")
def callback(status: dict, options: dict) -> None: ...


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Iterator[Capsule]:
    ran.clear()
    yield Capsule(CapsuleConfig(queues=["default"]), redis=redis)


def queued(redis: redis_py.Redis, queue: str = "default") -> list[dict]:
    return [json.loads(raw) for raw in redis.lrange(keys.of(redis).queue(queue), 0, -1)]


def test_the_deadline_is_stamped_at_push_from_created_at(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        warm.perform_async("a")
        plain.set(expires_in=dt.timedelta(minutes=2)).perform_async("b")
        plain.perform_async("c")
    by_arg = {payload["args"][0]: payload for payload in queued(redis)}
    assert by_arg["a"]["expires_at"] == EPOCH0 + 60 and by_arg["a"]["expires_in"] == 60.0
    assert by_arg["b"]["expires_at"] == EPOCH0 + 120 and by_arg["b"]["expires_in"] == 120.0
    assert isinstance(by_arg["b"]["expires_at"], float), "a float epoch in the JSON"
    assert "expires_at" not in by_arg["c"] and "expires_in" not in by_arg["c"]


def test_a_scheduled_job_expires_counting_from_when_it_was_due(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        warm.perform_in(300, "later")
    [raw] = redis.zrange(keys.of(redis).SCHEDULE, 0, -1)
    assert json.loads(raw)["expires_at"] == EPOCH0 + 300 + 60


def test_a_job_in_time_runs_and_one_past_its_deadline_is_dropped_unrun(
    capsule: Capsule, redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="limitd.expiry")
    with freeze_time(T0) as frozen:
        warm.perform_async("in time")
        frozen.tick(59)
        assert capsule.drain() == {"done": 1}
        jid = warm.perform_async("too late")  # due by T0 + 119
        frozen.tick(61.5)
        assert capsule.drain() == {"expired": 1}
    assert ran == ["in time"]
    assert queued(redis) == [] and redis.zcard(keys.of(redis).RETRY) == 0
    assert redis.zcard(keys.of(redis).DEAD) == 0
    assert redis.get(keys.of(redis).STAT_FAILED) in (None, b"0"), "not a failure"
    [line] = [r.getMessage() for r in caplog.records if r.name == "limitd.expiry"]
    assert f"jid={jid} class=expiry_test.Warm queue=default late=1.500s" in line


def test_an_async_job_past_its_deadline_is_dropped_unrun(capsule: Capsule) -> None:
    with freeze_time(T0) as frozen:
        async_warm.perform_async("late")
        frozen.tick(61)
        assert capsule.drain() == {"expired": 1}
    assert ran == []


def test_a_retry_that_comes_due_after_the_deadline_is_dropped(
    capsule: Capsule, redis: redis_py.Redis
) -> None:
    with freeze_time(T0) as frozen:
        fails_once.perform_async("x")
        assert capsule.drain() == {"retry": 1}
        [raw] = redis.zrange(keys.of(redis).RETRY, 0, -1)
        assert json.loads(raw)["expires_at"] == EPOCH0 + 30, "the retry keeps the deadline"
        frozen.tick(41)  # the retry is due at T0 + 40, ten seconds past the deadline
        assert capsule.drain(scheduled=True) == {"expired": 1}
    assert ran == []
    assert redis.zcard(keys.of(redis).RETRY) == 0 and redis.zcard(keys.of(redis).DEAD) == 0


def test_a_retry_due_before_the_deadline_runs(capsule: Capsule) -> None:
    with freeze_time(T0) as frozen:
        fails_once.set(expires_in=600).perform_async("y")
        assert capsule.drain() == {"retry": 1}
        frozen.tick(41)
        assert capsule.drain(scheduled=True) == {"done": 1}
    assert ran == ["y"]


def test_an_expired_job_settles_its_batch_as_a_success(
    capsule: Capsule, redis: redis_py.Redis
) -> None:
    batch = limitd.Batch("warmers")
    for event in ("complete", "success", "death"):
        batch.on(event, callback, {"event_was": event})
    with freeze_time(T0) as frozen:
        with batch.jobs():
            plain.perform_async("kept")
            warm.perform_async("dropped")
            plain.set(expires_in=1).perform_async("dropped too")
        frozen.tick(61)
        status = limitd.Batch.status(batch.bid)
        assert status is not None and (status.total, status.pending) == (3, 3)
        assert capsule.drain() == {"done": 1, "expired": 2}
    status = limitd.Batch.status(batch.bid)
    assert status is not None
    assert (status.pending, status.failures, status.complete, status.success) == (0, {}, True, True)
    callbacks = redis.lrange(keys.of(redis).queue("callbacks"), 0, -1)
    fired = [json.loads(raw)["args"][0] for raw in callbacks]
    assert sorted(status["event"] for status in fired) == ["complete", "success"]
    assert {(status["pending"], status["failures"]) for status in fired} == {(0, 0)}


def test_expired_jobs_are_counted_in_the_process_metrics(capsule: Capsule) -> None:
    registry = CollectorRegistry()
    capsule.executor.chain.prepend(JobMetrics(registry))
    with freeze_time(T0) as frozen:
        warm.perform_async("late")
        warm.perform_async("late too")
        frozen.tick(61)
        assert capsule.drain() == {"expired": 2}
    labels = {"job_class": "expiry_test.Warm", "queue": "default"}
    assert registry.get_sample_value("limitd_jobs_expired_total", labels) == 2
    assert registry.get_sample_value("limitd_jobs_total", {**labels, "outcome": "expired"}) == 2


def test_a_deadline_in_milliseconds_from_sidekiq_8_is_read(capsule: Capsule) -> None:
    client = limitd.Client(capsule.redis)
    with freeze_time(T0) as frozen:
        ms = int(EPOCH0 * 1000)
        client.push({"class": "expiry_test.Plain", "args": ["ms"], "expires_at": ms})
        assert deadline_of(queued(capsule.redis)[0]) == EPOCH0
        frozen.tick(1)
        assert capsule.drain() == {"expired": 1}
    assert ran == []


def test_only_jobs_with_a_deadline_pass_the_check() -> None:
    check = ExpiryCheck()
    assert check.concerns({"class": "a", "expires_at": 1.0})
    assert not check.concerns({"class": "a"})


@pytest.mark.parametrize("value", [0, -5, "soon", True, None])
def test_a_bad_expires_in_is_refused_where_the_job_is_defined(value: object) -> None:
    with pytest.raises(InvalidJobOption, match=r"expires_in.*positive number of seconds"):
        limitd.job(name="expiry_test.Bad", expires_in=value)(lambda: None)
    with pytest.raises(InvalidJobOption, match="expires_in"):
        plain.set(expires_in=value)


@limitd.job(name="expiry_test.UniqueWarm", expires_in=60, unique_for=3600)
def unique_warm(key: str) -> None:
    ran.append(key)


@pytest.mark.parametrize("until", ["executed", "executing"])
def test_an_expired_job_frees_its_unique_lock(capsule: Capsule, until: str) -> None:
    with freeze_time(T0) as frozen:
        assert unique_warm.set(unique_until=until).perform_async("k") is not None
        assert unique_warm.set(unique_until=until).perform_async("k") is None, "locked"
        frozen.tick(61)
        assert capsule.drain() == {"expired": 1}
        assert unique_warm.set(unique_until=until).perform_async("k") is not None, "freed"
    assert ran == []


def test_a_bulk_push_stamps_every_job(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        warm.perform_bulk([["a"], ["b"], ["c"]])
    assert [payload["expires_at"] for payload in queued(redis)] == [EPOCH0 + 60] * 3


def test_the_asyncio_client_stamps_the_deadline(redis_server, redis: redis_py.Redis) -> None:
    from redis.asyncio import Redis as AsyncRedis

    from limitd.aio.client import AsyncClient

    async def push() -> str | None:
        conn = AsyncRedis.from_url(redis_server.url)
        try:
            item = {"class": "expiry_test.Plain", "args": ["aio"], "expires_in": 90.0}
            return await AsyncClient(conn).push(item)
        finally:
            await conn.aclose()

    with freeze_time(T0):
        jid = asyncio.run(push())
    [payload] = queued(redis)
    assert (payload["jid"], payload["expires_at"]) == (jid, EPOCH0 + 90)


@pytest.mark.parametrize("value", ["30", -5, 0, True])
def test_a_raw_push_with_a_bad_expires_in_is_refused_and_writes_nothing(
    redis: redis_py.Redis, value: object
) -> None:
    client = limitd.Client(redis)
    with pytest.raises(InvalidJobOption, match="expires_in"):
        client.push({"class": "expiry_test.Plain", "args": ["x"], "expires_in": value})
    assert redis.llen(keys.of(redis).queue("default")) == 0


def test_a_raw_push_may_give_expires_in_as_a_timedelta(redis: redis_py.Redis) -> None:
    client = limitd.Client(redis)
    client.push(
        {"class": "expiry_test.Plain", "args": ["x"], "expires_in": dt.timedelta(minutes=1)}
    )
    [raw] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    payload = json.loads(raw)
    assert payload["expires_in"] == 60.0
    assert payload["expires_at"] == pytest.approx(payload["created_at"] + 60.0)
