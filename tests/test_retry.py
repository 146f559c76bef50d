"""Failure handling through real Redis: backoff windows, hooks, retry options, the dead
set and its trimming. Time is frozen; ``drain`` runs jobs in the test thread."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd.retry import DeadSetPolicy
from limitd.supervisor import Capsule, CapsuleConfig

T0 = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.timezone.utc)
deaths: list[tuple[str, str]] = []
exhausted_calls: list[tuple[str, str]] = []


@limitd.job(name="retry_test.Flaky", retry=3)
def flaky() -> None:
    raise ValueError("boom")


@limitd.job(name="retry_test.NoRetry", retry=False)
def no_retry() -> None:
    raise ValueError("once only")


@limitd.job(name="retry_test.ZeroRetry", retry=0)
def zero_retry() -> None:
    raise ValueError("straight to dead")


@limitd.job(name="retry_test.NotKept", retry=0, dead=False)
def not_kept() -> None:
    raise ValueError("forgotten")


@limitd.job(name="retry_test.Rerouted", retry_queue="slow")
def rerouted() -> None:
    raise ValueError("try elsewhere")


@limitd.job(name="retry_test.ForAMinute", retry_for=60)
def for_a_minute() -> None:
    raise ValueError("time-boxed")


class Hooked(limitd.Job, name="retry_test.Hooked"):
    def perform(self, decision: Any) -> None:
        raise RuntimeError(f"decision {decision}")

    def retry_in(self, count: int, exc: BaseException, payload: dict) -> Any:
        return payload["args"][0]

    def retries_exhausted(self, payload: dict, exc: BaseException) -> Any:
        exhausted_calls.append((payload["jid"], str(exc)))
        return "discard" if payload["args"][0] == "kill-then-discard" else None


def record_death(payload: dict, exc: BaseException) -> None:
    deaths.append((payload["class"], str(exc)))


def broken_death_handler(payload: dict, exc: BaseException) -> None:
    raise RuntimeError("handler bug")


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Iterator[Capsule]:
    deaths.clear()
    exhausted_calls.clear()
    config = CapsuleConfig(
        queues=["default", "slow"], death_handlers=[broken_death_handler, record_death]
    )
    yield Capsule(config, redis=redis)


def retry_entries(redis: redis_py.Redis) -> list[tuple[dict, float]]:
    return [(json.loads(m), s) for m, s in redis.zrange("retry", 0, -1, withscores=True)]


def dead_entries(redis: redis_py.Redis) -> list[dict]:
    return [json.loads(m) for m in redis.zrange("dead", 0, -1)]


def test_backoff_window_each_time_then_dead(capsule: Capsule, redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        jid = flaky.perform_async()
        for count in range(3):
            now = frozen().timestamp()
            assert capsule.drain(scheduled=True) == {"retry": 1}
            [(payload, score)] = retry_entries(redis)
            assert payload["retry_count"] == count
            assert payload["error_class"] == "ValueError"
            assert payload["error_message"] == "boom"
            low = now + count**4 + 15
            assert low <= score <= low + 9 * (count + 1)
            frozen.move_to(dt.datetime.fromtimestamp(score, dt.timezone.utc))
        assert capsule.drain(scheduled=True) == {"dead": 1}
    assert redis.zcard("retry") == 0
    [dead] = dead_entries(redis)
    assert dead["jid"] == jid
    assert dead["retry_count"] == 3
    assert dead["failed_at"] == T0.timestamp()
    assert dead["retried_at"] > dead["failed_at"]
    assert deaths == [("retry_test.Flaky", "boom")]


def test_default_retry_count_is_25(capsule: Capsule, redis: redis_py.Redis) -> None:
    redis.lpush(
        "queue:default",
        json.dumps(
            {
                "class": "retry_test.Flaky",
                "args": [],
                "jid": "a" * 24,
                "retry": True,
                "retry_count": 24,
                "failed_at": 1.0,
            }
        ),
    )
    assert capsule.drain() == {"dead": 1}
    redis.lpush(
        "queue:default",
        json.dumps(
            {
                "class": "retry_test.Flaky",
                "args": [],
                "jid": "b" * 24,
                "retry": True,
                "retry_count": 23,
                "failed_at": 1.0,
            }
        ),
    )
    assert capsule.drain() == {"retry": 1}


def test_retry_false_discards_and_calls_death_handlers(
    capsule: Capsule, redis: redis_py.Redis
) -> None:
    no_retry.perform_async()
    assert capsule.drain() == {"discarded": 1}
    assert redis.zcard("retry") == redis.zcard("dead") == 0
    assert deaths == [("retry_test.NoRetry", "once only")]


def test_retry_zero_goes_straight_to_dead(capsule: Capsule, redis: redis_py.Redis) -> None:
    zero_retry.perform_async()
    assert capsule.drain() == {"dead": 1}
    assert dead_entries(redis)[0]["retry_count"] == 0


def test_dead_false_keeps_nothing(capsule: Capsule, redis: redis_py.Redis) -> None:
    not_kept.perform_async()
    assert capsule.drain() == {"discarded": 1}
    assert redis.zcard("dead") == 0
    assert deaths == [("retry_test.NotKept", "forgotten")]


@freeze_time(T0)
def test_retry_queue_reroutes_the_retry(capsule: Capsule, redis: redis_py.Redis) -> None:
    rerouted.perform_async()
    capsule.drain()
    [(payload, score)] = retry_entries(redis)
    assert payload["queue"] == "slow"
    moved = capsule.poller.enqueue_due(now=score)
    assert moved == 1
    assert json.loads(redis.lindex("queue:slow", 0))["retry_count"] == 0


def test_retry_for_bounds_retries_by_time(capsule: Capsule, redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        for_a_minute.perform_async()
        assert capsule.drain() == {"retry": 1}
        frozen.tick(dt.timedelta(seconds=59))
        capsule.poller.enqueue_due(now=frozen().timestamp() + 10_000)
        assert capsule.drain() == {"retry": 1}
        frozen.tick(dt.timedelta(seconds=2))
        capsule.poller.enqueue_due(now=frozen().timestamp() + 10_000)
        assert capsule.drain() == {"dead": 1}
    assert dead_entries(redis)[0]["retry_count"] == 2


@freeze_time(T0)
def test_retry_in_hook_sets_the_exact_delay(capsule: Capsule, redis: redis_py.Redis) -> None:
    Hooked.perform_async(42)
    capsule.drain()
    [(_, score)] = retry_entries(redis)
    assert score == T0.timestamp() + 42


@pytest.mark.parametrize("ignored", [None, 0, -3, "later", True])
def test_retry_in_falls_back_to_backoff(
    capsule: Capsule, redis: redis_py.Redis, ignored: Any
) -> None:
    with freeze_time(T0):
        Hooked.perform_async(ignored)
        capsule.drain()
    [(_, score)] = retry_entries(redis)
    assert T0.timestamp() + 15 <= score <= T0.timestamp() + 24


def test_retry_in_discard(capsule: Capsule, redis: redis_py.Redis) -> None:
    Hooked.perform_async("discard")
    assert capsule.drain() == {"discarded": 1}
    assert redis.zcard("retry") == redis.zcard("dead") == 0
    assert exhausted_calls == []


def test_retry_in_kill_runs_exhaustion(capsule: Capsule, redis: redis_py.Redis) -> None:
    jid = Hooked.perform_async("kill")
    assert capsule.drain() == {"dead": 1}
    assert exhausted_calls == [(jid, "decision kill")]
    assert deaths == [("retry_test.Hooked", "decision kill")]


def test_retries_exhausted_may_discard(capsule: Capsule, redis: redis_py.Redis) -> None:
    Hooked.set(retry=0).perform_async("kill-then-discard")
    assert capsule.drain() == {"discarded": 1}
    assert redis.zcard("dead") == 0
    assert deaths == []


def test_unknown_class_takes_the_retry_path(capsule: Capsule, redis: redis_py.Redis) -> None:
    limitd.Client(redis).push({"class": "retry_test.NotDeployedYet", "args": [1]})
    assert capsule.drain() == {"retry": 1}
    [(payload, _)] = retry_entries(redis)
    assert payload["error_class"] == "limitd.supervisor.executor.UnknownJob"
    assert "retry_test.NotDeployedYet" in payload["error_message"]


def test_dead_set_is_trimmed_by_size_and_age(redis: redis_py.Redis) -> None:
    capsule = Capsule(
        CapsuleConfig(dead_set=DeadSetPolicy(timeout_seconds=100, max_jobs=3)), redis=redis
    )
    with freeze_time(T0) as frozen:
        zero_retry.perform_async()
        capsule.drain()
        frozen.tick(dt.timedelta(seconds=150))
        for _ in range(4):
            zero_retry.perform_async()
        capsule.drain()
        scores = [s for _, s in redis.zrange("dead", 0, -1, withscores=True)]
    assert len(scores) == 3
    assert min(scores) == T0.timestamp() + 150
