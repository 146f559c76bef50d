"""The scheduled poller: due jobs move atomically, exactly once, to their queues."""

from __future__ import annotations

import json
import random
import threading

import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.supervisor.poller import ScheduledPoller
from tests.helpers import wait_for

NOW = 1_795_262_400.0


@limitd.job(name="poller_test.Later", queue="later")
def later(n: int) -> None: ...


def schedule(redis: redis_py.Redis, at: float, **fields: object) -> str:
    payload = {"class": "poller_test.Later", "args": [at], "queue": "later", **fields}
    member = json.dumps(payload)
    redis.zadd("schedule", {member: at})
    return member


@freeze_time("2026-11-21 12:00:00")
def test_due_jobs_move_and_future_ones_stay(redis: redis_py.Redis) -> None:
    for at in (NOW - 10, NOW - 1, NOW):
        schedule(redis, at)
    later.perform_in(60, 99)
    poller = ScheduledPoller(redis)
    assert poller.enqueue_due() == 3
    assert redis.zcard("schedule") == 1
    queued = [json.loads(j) for j in redis.lrange("queue:later", 0, -1)]
    assert len(queued) == 3
    assert all(job["enqueued_at"] == NOW for job in queued)
    assert redis.smembers("queues") == {b"later"}


def test_retry_set_is_polled_too(redis: redis_py.Redis) -> None:
    redis.zadd("retry", {json.dumps({"class": "X", "args": [], "queue": "q"}): NOW})
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == 1
    assert redis.llen("queue:q") == 1


def test_racing_pollers_move_each_job_exactly_once(redis: redis_py.Redis) -> None:
    total = 2000
    redis.zadd(
        "schedule",
        {json.dumps({"class": "X", "args": [i], "queue": "q"}): NOW - i for i in range(total)},
    )
    pollers = [
        ScheduledPoller(redis_py.Redis(connection_pool=redis.connection_pool)) for _ in range(4)
    ]
    moved: list[int] = []
    threads = [
        threading.Thread(target=lambda p=p: moved.append(p.enqueue_due(now=NOW))) for p in pollers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(moved) == total
    args = sorted(json.loads(j)["args"][0] for j in redis.lrange("queue:q", 0, -1))
    assert args == list(range(total))
    assert redis.zcard("schedule") == 0


def test_unreadable_scheduled_member_goes_to_dead(redis: redis_py.Redis) -> None:
    redis.zadd("schedule", {b"not json at all": NOW - 1})
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == 1
    [entry] = [json.loads(m) for m in redis.zrange("dead", 0, -1)]
    assert entry["raw"] == "not json at all"
    assert redis.zcard("schedule") == 0


def test_poll_interval_scales_with_processes(redis: redis_py.Redis) -> None:
    poller = ScheduledPoller(redis, average_scheduled_poll_interval=5, rng=random.Random(1))
    samples = [poller.random_poll_interval() for _ in range(500)]
    assert 2.5 <= min(samples) < 3.0
    assert 7.0 < max(samples) <= 7.5
    redis.sadd("processes", *[f"p{i}" for i in range(20)])
    samples = [poller.random_poll_interval() for _ in range(500)]
    assert 0 <= min(samples) < 5
    assert 95 < max(samples) <= 100
    fixed = ScheduledPoller(redis, poll_interval_average=2, rng=random.Random(1))
    assert all(0 <= fixed.random_poll_interval() <= 2 for _ in range(100))


def test_cleanup_prunes_dead_processes_once_a_minute(redis: redis_py.Redis) -> None:
    redis.sadd("processes", "alive", "dead1", "dead2")
    redis.hset("alive", "info", "{}")
    poller = ScheduledPoller(redis)
    assert poller.cleanup_processes() == 2
    assert redis.smembers("processes") == {b"alive"}
    redis.sadd("processes", "dead3")
    assert poller.cleanup_processes() == 0, "the cleanup lock holds for 60 s"
    assert 0 < redis.ttl("process_cleanup") <= 60


def test_expired_batches_leave_the_index_once_an_hour(redis: redis_py.Redis) -> None:
    # 1,200 batches whose data expired, around 3 live ones, across pages of 500.
    redis.zadd(keys.BATCHES, {f"expired-{n}": n for n in range(1_200)})
    live = []
    for score in (250.5, 600.5, 1_100.5):
        with limitd.Batch("live").jobs() as batch:
            pass
        redis.zadd(keys.BATCHES, {batch.bid: score})
        live.append(batch.bid)
    poller = ScheduledPoller(redis)
    assert poller.prune_batch_index() == 1_200
    assert [bid.decode() for bid in redis.zrange(keys.BATCHES, 0, -1)] == live
    redis.zadd(keys.BATCHES, {"expired-later": 1})
    assert poller.prune_batch_index() == 0, "one pruning an hour across the cluster"
    assert 3_590 < redis.ttl(keys.BATCH_INDEX_PRUNE_LOCK) <= 3_600


def test_running_poller_enqueues_due_jobs_and_prunes_the_batch_index(
    redis: redis_py.Redis,
) -> None:
    schedule(redis, 0.0)
    redis.zadd(keys.BATCHES, {"expired": 1})
    poller = ScheduledPoller(redis, poll_interval_average=0.05)
    poller.start()
    try:
        wait_for(lambda: redis.llen("queue:later") == 1, message="the poller to move the job")
        wait_for(lambda: redis.zcard(keys.BATCHES) == 0, message="the index to be pruned")
    finally:
        poller.terminate()
        poller.join(2)
