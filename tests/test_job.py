"""Defining jobs (both styles) and every way of enqueueing them, checked in Redis."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd.registry import DuplicateJobName, registry


@limitd.job(name="job_test.Send", queue="mail", retry=5)
def send(to: str, subject: str) -> str:
    return f"{to}:{subject}"


@limitd.job
def bare(x: int) -> int:
    return x * 2


class HardJob(limitd.Job, name="RubyStyleJob", queue="critical", retry_for=3600):
    def perform(self, a: int, b: int) -> None:
        self.seen = (a, b)

    def retry_in(self, count: int, exc: BaseException, payload: dict) -> int:
        return 7


def queued(redis: redis_py.Redis, queue: str) -> list[dict]:
    """Jobs of a queue, oldest first."""
    return [json.loads(raw) for raw in reversed(redis.lrange(f"queue:{queue}", 0, -1))]


def test_function_job_keeps_working_as_a_function() -> None:
    assert send("a", "b") == "a:b"
    assert bare(4) == 8
    assert bare.spec.name == f"{__name__}.bare"
    assert registry.resolve("job_test.Send") is send.spec


def test_class_job_registers_under_its_wire_name() -> None:
    spec = registry.resolve("RubyStyleJob")
    assert spec is HardJob.spec
    assert spec.options == {"queue": "critical", "retry_for": 3600.0}
    assert spec.retry_in is not None
    assert spec.retry_in(1, RuntimeError(), {}) == 7
    assert spec.retries_exhausted is None


def test_unknown_option_fails_at_definition_time() -> None:
    with pytest.raises(limitd.InvalidJobOption, match=r"unknown option 'retyr'.*known options"):

        @limitd.job(retyr=3)
        def typo() -> None: ...

    with pytest.raises(limitd.InvalidJobOption, match="option 'retry'=-1 is invalid"):

        class Negative(limitd.Job, retry=-1):
            def perform(self) -> None: ...


def test_class_without_perform_is_rejected() -> None:
    with pytest.raises(TypeError, match="must define perform"):

        class Empty(limitd.Job):
            pass


def test_two_jobs_cannot_share_a_name() -> None:
    with pytest.raises(DuplicateJobName, match=r"job_test\.Send"):

        @limitd.job(name="job_test.Send")
        def other() -> None: ...


def test_perform_async_pushes_a_sidekiq_payload(redis: redis_py.Redis) -> None:
    with freeze_time("2026-11-21 12:00:00"):
        jid = send.perform_async("ann@example.com", "hi")
    assert redis.smembers("queues") == {b"mail"}
    [payload] = queued(redis, "mail")
    assert payload == {
        "class": "job_test.Send",
        "args": ["ann@example.com", "hi"],
        "queue": "mail",
        "retry": 5,
        "jid": jid,
        "created_at": 1795262400.0,
        "enqueued_at": 1795262400.0,
    }


def test_set_returns_a_configured_copy(redis: redis_py.Redis) -> None:
    low = send.set(queue="low", retry=False)
    low.perform_async("a", "b")
    send.perform_async("c", "d")
    assert [p["retry"] for p in queued(redis, "low")] == [False]
    assert [p["retry"] for p in queued(redis, "mail")] == [5]
    with pytest.raises(limitd.InvalidJobOption):
        send.set(qeue="x")
    HardJob.set(queue="other").perform_async(1, 2)
    assert queued(redis, "other")[0]["class"] == "RubyStyleJob"


@freeze_time("2026-11-21 12:00:00")
def test_perform_in_and_at_schedule_the_job(redis: redis_py.Redis) -> None:
    now = 1795262400.0
    send.perform_in(30, "a", "b")
    send.perform_in(dt.timedelta(minutes=2), "c", "d")
    HardJob.perform_at(now + 3600, 1, 2)
    HardJob.perform_at(dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc), 3, 4)
    scheduled = redis.zrange("schedule", 0, -1, withscores=True)
    assert [score - now for _, score in scheduled] == [30, 120, 3600, 86400]
    assert all("at" not in json.loads(member) for member, _ in scheduled)
    assert all("enqueued_at" not in json.loads(member) for member, _ in scheduled)
    assert redis.llen("queue:mail") == 0


@freeze_time("2026-11-21 12:00:00")
def test_a_time_in_the_past_enqueues_now(redis: redis_py.Redis) -> None:
    send.perform_in(-5, "a", "b")
    send.perform_at(0, "c", "d")
    assert redis.zcard("schedule") == 0
    assert redis.llen("queue:mail") == 2


def test_perform_bulk_pushes_ten_thousand_jobs_in_chunks(redis: redis_py.Redis) -> None:
    before = redis.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0)
    jids = bare.perform_bulk([[i] for i in range(10_000)], batch_size=1000)
    after = redis.info("commandstats")["cmdstat_lpush"]["calls"]
    assert len(set(jids)) == 10_000
    assert after - before == 10
    jobs = queued(redis, "default")
    assert [job["args"] for job in jobs] == [[i] for i in range(10_000)]
    assert [job["jid"] for job in jobs] == jids


def test_bulk_rejects_unsafe_arguments_before_writing(redis: redis_py.Redis) -> None:
    with pytest.raises(limitd.UnsafeArgument, match=r"args\[0\]"):
        bare.perform_bulk([[1], [(2, 3)]])
    assert redis.llen("queue:default") == 0


def test_current_payload_is_visible_inside_the_job(redis: redis_py.Redis) -> None:
    from limitd.supervisor import Capsule, CapsuleConfig

    seen: list[object] = []

    @limitd.job(name="job_test.WhoAmI")
    def who_am_i() -> None:
        payload = limitd.current_payload()
        seen.append(payload["jid"] if payload else None)

    jid = who_am_i.perform_async()
    Capsule(CapsuleConfig(), redis=redis).drain()
    assert seen == [jid]
    assert limitd.current_payload() is None
