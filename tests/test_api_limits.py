"""The admin API's queue limits, pause, busy counts, capsules and queue overview,
against a real Redis and the state the limit fetcher keeps there."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py
from freezegun import freeze_time
from redis.client import PubSub

from limitd import keys
from limitd.api import Capsule, Capsules, Queue, QueueStatus, queue_overview
from limitd.payload import dumps
from limitd.queues import limits as queue_limits
from limitd.queues.limits import LimitSettings

START = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = START.timestamp()


def payload(jid: str, enqueued_at: float) -> str:
    return dumps(
        {"class": "x.Job", "args": [], "jid": jid, "queue": "default", "enqueued_at": enqueued_at}
    )


def next_message(pubsub: PubSub, timeout: float = 5.0) -> dict[str, Any] | None:
    """The next message on the subscription, or None once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None:
            return message
    return None


@pytest.fixture
def wake(redis: redis_py.Redis) -> Iterator[PubSub]:
    """A subscription to the wake-up channel, confirmed before the test publishes."""
    pubsub = redis.pubsub()
    pubsub.subscribe(keys.WAKE_CHANNEL)
    confirmed = pubsub.get_message(timeout=5.0)
    assert confirmed is not None and confirmed["type"] == "subscribe"
    yield pubsub
    pubsub.close()


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Counts round trips from now on: direct commands plus pipeline executions."""
    count = 0
    direct = redis_py.Redis.execute_command
    flush = redis_py.client.Pipeline.execute

    def counted_command(self: redis_py.Redis, *args: Any, **options: Any) -> Any:
        nonlocal count
        count += 1
        return direct(self, *args, **options)

    def counted_execute(self: redis_py.client.Pipeline, *args: Any, **options: Any) -> Any:
        nonlocal count
        count += 1
        return flush(self, *args, **options)

    monkeypatch.setattr(redis_py.Redis, "execute_command", counted_command)
    monkeypatch.setattr(redis_py.client.Pipeline, "execute", counted_execute)
    return lambda: count


# Limits


def test_limit_get_set_and_clear(redis: redis_py.Redis) -> None:
    queue = Queue("mail")
    assert (queue.limit, queue.process_limit) == (None, None)
    queue.limit = 3
    assert (queue.limit, queue.process_limit) == (3, None)
    assert redis.hget(keys.of(redis).LIMITS, "mail") == b"3"
    queue.limit = 0
    assert queue.limit == 0
    queue.limit = None
    assert queue.limit is None
    assert redis.hget(keys.of(redis).LIMITS, "mail") == b"none"
    queue.limit = 4
    queue.clear_limit()
    assert queue.limit is None


def test_cleared_limit_stays_cleared_until_reset(redis: redis_py.Redis) -> None:
    settings = LimitSettings(limits={"mail": 5})
    queue = Queue("mail")
    settings.apply_defaults(redis)
    assert queue.limit == 5
    queue.limit = None
    settings.apply_defaults(redis)
    assert queue.limit is None
    queue.limit = 2
    settings.apply_defaults(redis)
    assert queue.limit == 2
    queue.reset_limit()
    assert queue.limit is None
    assert not redis.hexists(keys.of(redis).LIMITS, "mail")
    settings.apply_defaults(redis)
    assert queue.limit == 5


def test_process_limit_is_kept_apart_from_the_global_limit(redis: redis_py.Redis) -> None:
    settings = LimitSettings(limits={"mail": 10}, process_limits={"mail": 2})
    queue = Queue("mail")
    settings.apply_defaults(redis)
    assert (queue.limit, queue.process_limit) == (10, 2)
    queue.process_limit = 1
    assert (queue.limit, queue.process_limit) == (10, 1)
    assert redis.hget(keys.of(redis).PROCESS_LIMITS, "mail") == b"1"
    queue.process_limit = None
    settings.apply_defaults(redis)
    assert (queue.limit, queue.process_limit) == (10, None)
    queue.reset_limit(process=True)
    assert (queue.limit, queue.process_limit) == (10, None)
    settings.apply_defaults(redis)
    assert (queue.limit, queue.process_limit) == (10, 2)
    queue.clear_limit(process=True)
    assert (queue.limit, queue.process_limit) == (10, None)


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
@pytest.mark.parametrize("kind", ["limit", "process_limit"])
def test_invalid_limits_are_rejected_and_change_nothing(
    redis: redis_py.Redis, kind: str, value: object
) -> None:
    queue = Queue("mail")
    setattr(queue, kind, 4)
    with pytest.raises(ValueError, match=f"queue 'mail' {kind}: a limit must be an integer"):
        setattr(queue, kind, value)
    assert getattr(queue, kind) == 4


# Pause, resume and wake-ups


def test_pause_and_resume_keep_the_limit(redis: redis_py.Redis) -> None:
    queue = Queue("mail")
    queue.limit = 4
    assert queue.paused is False
    queue.pause()
    assert queue.paused is True
    assert redis.smembers(keys.of(redis).PAUSED) == {b"mail"}
    assert Queue("default").paused is False
    assert queue.limit == 4
    queue.resume()
    assert queue.paused is False
    assert queue.limit == 4


def test_resume_and_limit_changes_wake_fetchers(redis: redis_py.Redis, wake: PubSub) -> None:
    queue = Queue("mail")
    queue.pause()
    queue.resume()
    message = next_message(wake)
    assert message is not None
    assert (message["channel"], message["data"]) == (keys.WAKE_CHANNEL.encode(), b"mail")
    Queue("webhooks").limit = 3
    assert (message := next_message(wake)) is not None and message["data"] == b"webhooks"
    Queue("reports").process_limit = None
    assert (message := next_message(wake)) is not None and message["data"] == b"reports"


# Busy slots


def test_busy_counts_globally_and_per_capsule(redis: redis_py.Redis) -> None:
    redis.hset(keys.of(redis).BUSY, mapping={"mail": 3, "default": 0})
    redis.sadd(keys.of(redis).CAPSULES, "c1", "c2", "c3")
    redis.rpush(keys.of(redis).in_progress("c1", "mail"), "job-a", "job-b")
    redis.rpush(keys.of(redis).in_progress("c2", "mail"), "job-c")
    redis.rpush(keys.of(redis).in_progress("c3", "reports"), "job-d")
    assert Queue("mail").busy() == 3
    assert Queue("mail").busy_by_capsule() == {"c1": 2, "c2": 1}
    assert (Queue("default").busy(), Queue("default").busy_by_capsule()) == (0, {})
    assert (Queue("reports").busy(), Queue("reports").busy_by_capsule()) == (0, {"c3": 1})


# Capsules


def test_capsules_show_heartbeats_and_jobs_in_progress(redis: redis_py.Redis) -> None:
    assert list(Capsules()) == []
    redis.sadd(keys.of(redis).CAPSULES, "live", "gone")
    redis.set(keys.of(redis).capsule_heartbeat("live"), "1", ex=60)
    redis.sadd(keys.of(redis).capsule_queues("live"), "mail", "default")
    redis.rpush(keys.of(redis).in_progress("live", "mail"), "job-a", "job-b")
    redis.sadd(keys.of(redis).capsule_queues("gone"), "mail")
    redis.rpush(keys.of(redis).in_progress("gone", "mail"), "job-c")
    gone, live = Capsules(redis)
    assert gone == Capsule("gone", alive=False, ttl=None, in_progress={"mail": 1})
    assert (live.id, live.alive, live.in_progress) == ("live", True, {"default": 0, "mail": 2})
    assert live.ttl is not None and 55 <= live.ttl <= 60
    assert (live.busy, gone.busy) == (2, 1)


def test_capsules_refresh_and_a_heartbeat_without_expiry(redis: redis_py.Redis) -> None:
    capsules = Capsules()
    assert len(capsules) == 0
    redis.sadd(keys.of(redis).CAPSULES, "pinned")
    redis.set(keys.of(redis).capsule_heartbeat("pinned"), "1")
    capsules.refresh()
    assert list(capsules) == [Capsule("pinned", alive=True, ttl=None, in_progress={})]


def test_capsules_are_read_in_a_fixed_number_of_round_trips(
    redis: redis_py.Redis, round_trips: Callable[[], int]
) -> None:
    for i in range(20):
        redis.sadd(keys.of(redis).CAPSULES, f"c{i}")
        redis.set(keys.of(redis).capsule_heartbeat(f"c{i}"), "1", ex=60)
        redis.sadd(keys.of(redis).capsule_queues(f"c{i}"), "mail", "default")
        redis.rpush(keys.of(redis).in_progress(f"c{i}", "mail"), "job")
    before = round_trips()
    capsules = Capsules(redis)
    assert round_trips() - before == 3
    assert sum(capsule.busy for capsule in capsules) == 20


# Queue overview


def test_queue_overview(redis: redis_py.Redis) -> None:
    redis.sadd(keys.of(redis).QUEUES, "default")
    redis.lpush(
        keys.of(redis).queue("default"), payload("a" * 24, T0 - 10), payload("b" * 24, T0 - 5)
    )
    mail = Queue("mail")  # limited, busy and paused, nothing waiting
    mail.limit, mail.process_limit = 5, 2
    mail.pause()
    redis.hset(keys.of(redis).BUSY, mapping={"mail": 3, "finished": 0})
    Queue("cleared").clear_limit()
    with freeze_time(START):
        rows = queue_overview()
    assert rows == [
        QueueStatus("cleared", 0, 0.0, None, None, 0, False),
        QueueStatus("default", 2, pytest.approx(10.0), None, None, 0, False),
        QueueStatus("mail", 0, 0.0, 5, 2, 3, True),
    ]
    assert rows[2].as_dict() == {
        "name": "mail",
        "size": 0,
        "latency": 0.0,
        "limit": 5,
        "process_limit": 2,
        "busy": 3,
        "paused": True,
        "rate_limit": None,
        "fair": False,
        "tenants_waiting": None,
    }


def test_empty_queue_overview(redis: redis_py.Redis) -> None:
    assert queue_overview(redis) == []


def test_queue_overview_round_trips_do_not_grow_with_queues(
    redis: redis_py.Redis, round_trips: Callable[[], int]
) -> None:
    for i in range(30):
        redis.sadd(keys.of(redis).QUEUES, f"q{i}")
        redis.lpush(keys.of(redis).queue(f"q{i}"), payload(f"{i:024d}", T0))
        redis.hset(keys.of(redis).LIMITS, f"q{i}", i)
    before = round_trips()
    rows = queue_overview(redis)
    assert round_trips() - before == 3
    assert [(row.name, row.size, row.limit) for row in rows[:2]] == [("q0", 1, 0), ("q1", 1, 1)]
    assert len(rows) == 30


def test_a_heartbeat_rewrites_configured_limits_only_when_redis_lost_them(
    redis: redis_py.Redis,
) -> None:
    """With 10,000 configured limits a heartbeat checks a few keys, not 10,000 fields;
    what Redis loses (everything, or one of the hashes) is written again."""
    names = [f"q{i:05d}" for i in range(10_000)]
    settings = LimitSettings(limits=dict.fromkeys(names, 3), rate_limits={"q00001": "5/second"})
    settings.apply_defaults(redis)
    before = redis.info("commandstats")
    settings.apply_defaults(redis)
    after = redis.info("commandstats")
    commands = sum(
        after[name]["calls"] - before.get(name, {"calls": 0})["calls"]
        for name in after
        if name != "cmdstat_info"
    )
    assert commands <= 3
    k = keys.of(redis)
    redis.delete(k.LIMITS)
    settings.apply_defaults(redis)
    assert queue_limits.get_limit(redis, "q09999") == 3
    redis.flushdb()
    settings.apply_defaults(redis)
    assert queue_limits.get_limit(redis, "q00000") == 3
    assert redis.hget(k.RATE_LIMITS, "q00001") == b"5/1"
