"""The scheduled poller: due jobs move atomically, exactly once, to their queues."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import cast

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import clock, keys
from limitd.batch.plug import BATCH
from limitd.batch.store import prune_index_hourly
from limitd.config import CapsuleConfig, ConfigError, load_config
from limitd.fetch.wakeup import WakeupListener
from limitd.retry import RetryHandler
from limitd.retry.moves import move_due_page
from limitd.supervisor.capsule import Capsule
from limitd.supervisor.poller import PEEK, ScheduledPoller
from tests.helpers import wait_for

NOW = 1_795_262_400.0


@limitd.job(name="poller_test.Later", queue="later")
def later(n: int) -> None: ...


def schedule(redis: redis_py.Redis, at: float, **fields: object) -> str:
    payload = {"class": "poller_test.Later", "args": [at], "queue": "later", **fields}
    member = json.dumps(payload)
    redis.zadd(keys.of(redis).SCHEDULE, {member: at})
    return member


@freeze_time("2026-11-21 12:00:00")
def test_due_jobs_move_and_future_ones_stay(redis: redis_py.Redis) -> None:
    for at in (NOW - 10, NOW - 1, NOW):
        schedule(redis, at)
    later.perform_in(60, 99)
    poller = ScheduledPoller(redis)
    assert poller.enqueue_due() == 3
    assert redis.zcard(keys.of(redis).SCHEDULE) == 1
    queued = [json.loads(j) for j in redis.lrange(keys.of(redis).queue("later"), 0, -1)]
    assert len(queued) == 3
    assert all(job["enqueued_at"] == NOW for job in queued)
    assert redis.smembers(keys.of(redis).QUEUES) == {b"later"}


def test_retry_set_is_polled_too(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).RETRY, {json.dumps({"class": "X", "args": [], "queue": "q"}): NOW})
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == 1
    assert redis.llen(keys.of(redis).queue("q")) == 1


def drain_together(redis: redis_py.Redis, count: int) -> list[int]:
    """``count`` pollers, standing for as many processes', move what is due at NOW at the same
    time, each on its own thread and connection: how many each moved."""
    pollers = [
        ScheduledPoller(redis_py.Redis(connection_pool=redis.connection_pool)) for _ in range(count)
    ]
    moved: list[int] = []
    threads = [
        threading.Thread(target=lambda p=p: moved.append(p.enqueue_due(now=NOW))) for p in pollers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return moved


def queued_args(redis: redis_py.Redis) -> list[int]:
    """The first argument of every job in queue ``q``, sorted."""
    return sorted(json.loads(j)["args"][0] for j in redis.lrange(keys.of(redis).queue("q"), 0, -1))


@pytest.mark.standalone_only("threads share one connection pool")
def test_racing_pollers_move_each_job_exactly_once(redis: redis_py.Redis) -> None:
    total = 2000
    redis.zadd(
        "schedule",
        {json.dumps({"class": "X", "args": [i], "queue": "q"}): NOW - i for i in range(total)},
    )
    assert sum(drain_together(redis, 4)) == total
    assert queued_args(redis) == list(range(total))
    assert redis.zcard(keys.of(redis).SCHEDULE) == 0


@pytest.mark.standalone_only("counts the calls of the standalone move")
def test_a_burst_due_at_once_moves_a_page_per_call_in_due_order(
    redis: redis_py.Redis,
) -> None:
    """100,000 reminders at 9:00 must not move one Lua call at a time."""
    total, queues = 1200, ("mail", "sms")
    redis.zadd(
        keys.of(redis).SCHEDULE,
        {
            json.dumps({"class": "X", "args": [i], "queue": queues[i % 2]}): NOW - total + i
            for i in range(total)
        },
    )

    def script_calls() -> int:
        stats = redis.info("commandstats")
        return sum(int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha",))

    before = script_calls()
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == total
    # three pages of schedule (500, 500, 200), one empty read of retry
    assert script_calls() - before == 4, "a page of 500 due jobs per call"
    for offset, queue in enumerate(queues):
        raw = redis.lrange(keys.of(redis).queue(queue), 0, -1)
        fetched_first = [json.loads(job)["args"][0] for job in reversed(raw)]
        assert fetched_first == list(range(offset, total, 2)), "due first, fetched first"
    assert redis.smembers(keys.of(redis).QUEUES) == {b"mail", b"sms"}


@pytest.mark.standalone_only("threads share one connection pool; counts standalone reads")
def test_pollers_draining_one_burst_together_read_each_job_once(redis: redis_py.Redis) -> None:
    """Two processes' pollers that wake for a burst together used to read the same first
    page, decode and send its jobs, and only one of them moved each (167,000 members
    read for 100,000 moved). Each page is now read and moved by one script: between
    them the pollers read every job once, and move each exactly once."""
    total = 12 * PEEK
    redis.zadd(
        keys.of(redis).SCHEDULE,
        {
            json.dumps({"class": "X", "args": [i], "queue": "q"}): NOW - total + i
            for i in range(total)
        },
    )
    before = redis.info("commandstats").get("cmdstat_zrangebyscore", {}).get("calls", 0)
    assert sum(drain_together(redis, 2)) == total
    assert queued_args(redis) == list(range(total))
    assert redis.zcard(keys.of(redis).SCHEDULE) == 0
    reads = redis.info("commandstats")["cmdstat_zrangebyscore"]["calls"] - before
    # 12 full pages between them, then each poller's one short read of each set
    assert reads == 12 + 2 * 2


def test_members_the_script_cannot_read_for_certain_move_one_by_one(
    redis: redis_py.Redis,
) -> None:
    """The page script moves what it reads with certainty and leaves the rest for the
    poller to parse: every job reaches its queue stamped with the time it moved, its
    other fields as they were, and an unreadable one goes to the dead set."""
    members = {
        "plain": '{"class":"X","args":[1],"queue":"q"}',
        "no queue: default": '{"class":"X","args":[2]}',
        "stamped before (a retry)": '{"class":"X","args":[3],"queue":"q","enqueued_at":5.5}',
        "space after the object": '{"class":"X","args":[4],"queue":"q"} ',
        "nested enqueued_at too": '{"class":"X","args":[{"enqueued_at":1}],"queue":"q",'
        '"enqueued_at":7}',
        "escaped key": '{"class":"X","args":[6],"queue":"q","enqueued\\u005fat":8}',
        "nested queue only": '{"class":"X","args":[{"queue":"elsewhere"}]}',
    }
    for n, member in enumerate(members.values()):
        redis.zadd(keys.of(redis).SCHEDULE, {member: NOW - 10 + n})
    redis.zadd(keys.of(redis).SCHEDULE, {'{"class":"X","args":"no list"}': NOW - 1})
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == len(members) + 1
    assert redis.zcard(keys.of(redis).SCHEDULE) == 0
    [dead] = [json.loads(m) for m in redis.zrange(keys.of(redis).DEAD, 0, -1)]
    assert dead["args"] == "no list" and dead["error_class"] == "limitd.MalformedPayload"
    queued = [
        json.loads(job)
        for queue in ("q", "default")
        for job in redis.lrange(keys.of(redis).queue(queue), 0, -1)
    ]
    assert all(job["enqueued_at"] == NOW for job in queued)
    by_args = {json.dumps(job["args"]): job for job in queued}
    for member in members.values():
        original = json.loads(member)
        job = by_args[json.dumps(original["args"])]
        assert {k: v for k, v in job.items() if k != "enqueued_at"} == {
            k: v for k, v in original.items() if k != "enqueued_at"
        }
    assert len(redis.lrange(keys.of(redis).queue("default"), 0, -1)) == 2


@pytest.mark.standalone_only("the page script runs on a standalone server only")
def test_the_page_script_leaves_exactly_the_members_it_is_unsure_of(
    redis: redis_py.Redis,
) -> None:
    sure = [
        '{"class":"X","args":[],"queue":"q"}',
        '{"class":"X","args":[1],"queue":"q"}',
        '{"class":"X","args":[2]}',
        '{"class":"X","args":[3],"queue":"q","enqueued_at":5.5}',
    ]
    unsure = [
        '{"class":"X","args":[4],"queue":"q"} ',
        '{"class":"X","args":[{"enqueued_at":1}],"queue":"q","enqueued_at":7}',
        '{"class":"X","args":[6],"queue":"q","enqueued\\u005fat":8}',
        '{"class":"X","args":"no list"}',
        '{"class":"","args":[]}',
        '{"class":"X","args":[],"queue":7}',
        '{"class":"X","args":{},"queue":"q"}',
        '{"class":"X","args":{"1":2},"queue":"q"}',
        "not json}",
        '{"class":"X","args":["%s"],"queue":"q"}' % ("x" * 65536),
    ]
    for n, member in enumerate(sure + unsure):
        redis.zadd(keys.of(redis).SCHEDULE, {member: NOW - 20 + n})
    read, moved, left = move_due_page(redis, keys.of(redis).SCHEDULE, NOW, PEEK)
    assert (read, moved) == (len(sure) + len(unsure), len(sure))
    assert [m.decode() for m in left] == unsure  # in due order, still in the set
    assert redis.zcard(keys.of(redis).SCHEDULE) == len(unsure)
    stamped = redis.lrange(keys.of(redis).queue("q"), 0, -1)
    assert stamped[-1] == b'{"class":"X","args":[],"queue":"q","enqueued_at":%r}' % NOW
    assert stamped[-2] == b'{"class":"X","args":[1],"queue":"q","enqueued_at":%r}' % NOW
    assert stamped[0] == b'{"class":"X","args":[3],"queue":"q","enqueued_at":%r}' % NOW


@pytest.mark.standalone_only("counts the reads of the standalone move")
def test_a_lone_due_job_costs_one_read(redis: redis_py.Redis) -> None:
    """The spread reads start only after a lost page: a lone due job is found and moved
    in one read of its set (and one of the empty retry set), so a scheduled job is as
    punctual as before."""
    schedule(redis, NOW - 1)

    def reads() -> int:
        return int(redis.info("commandstats").get("cmdstat_zrangebyscore", {}).get("calls", 0))

    before = reads()
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == 1
    assert reads() - before == 2


def test_unreadable_scheduled_member_goes_to_dead(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).SCHEDULE, {b"not json at all": NOW - 1})
    assert ScheduledPoller(redis).enqueue_due(now=NOW) == 1
    [entry] = [json.loads(m) for m in redis.zrange(keys.of(redis).DEAD, 0, -1)]
    assert entry["raw"] == "not json at all"
    assert redis.zcard(keys.of(redis).SCHEDULE) == 0


@pytest.mark.standalone_only("Sidekiq's process record names")
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


@pytest.mark.standalone_only("Sidekiq's process record names")
def test_cleanup_prunes_dead_processes_once_a_minute(redis: redis_py.Redis) -> None:
    redis.sadd("processes", "alive", "dead1", "dead2")
    redis.hset("alive", "info", "{}")
    poller = ScheduledPoller(redis)
    assert poller.cleanup_processes() == 2
    assert redis.smembers("processes") == {b"alive"}
    redis.sadd("processes", "dead3")
    assert poller.cleanup_processes() == 0, "the cleanup lock holds for 60 s"
    assert 0 < redis.ttl("process_cleanup") <= 60


@pytest.mark.standalone_only("batches are standalone only")
def test_expired_batches_leave_the_index_once_an_hour(redis: redis_py.Redis) -> None:
    # 1,200 batches whose data expired, around 3 live ones, across pages of 500.
    redis.zadd(keys.of(redis).BATCHES, {f"expired-{n}": n for n in range(1_200)})
    live = []
    for score in (250.5, 600.5, 1_100.5):
        with limitd.Batch("live").jobs() as batch:
            pass
        redis.zadd(keys.of(redis).BATCHES, {batch.bid: score})
        live.append(batch.bid)
    assert BATCH.housekeeping is prune_index_hourly, "the pollers' upkeep runs it"
    assert prune_index_hourly(redis) == 1_200
    assert [bid.decode() for bid in redis.zrange(keys.of(redis).BATCHES, 0, -1)] == live
    redis.zadd(keys.of(redis).BATCHES, {"expired-later": 1})
    assert prune_index_hourly(redis) == 0, "one pruning an hour across the cluster"
    assert 3_590 < redis.ttl(keys.of(redis).BATCH_INDEX_PRUNE_LOCK) <= 3_600


@pytest.mark.standalone_only("batches are standalone only")
def test_running_poller_enqueues_due_jobs_and_prunes_the_batch_index(
    redis: redis_py.Redis,
) -> None:
    schedule(redis, 0.0)
    redis.zadd(keys.of(redis).BATCHES, {"expired": 1})
    poller = ScheduledPoller(redis, poll_interval_average=0.05)
    poller.start()
    try:
        wait_for(
            lambda: redis.llen(keys.of(redis).queue("later")) == 1,
            message="the poller to move the job",
        )
        wait_for(lambda: redis.zcard(keys.of(redis).BATCHES) == 0, message="the index to be pruned")
    finally:
        poller.terminate()
        poller.join(2)


# Waking when jobs are due (scheduled_poll: due).

ran = threading.Event()


@limitd.job(name="poller_test.OnTime", queue="on_time")
def on_time(n: int) -> None:
    ran.set()


class ProbePoller(ScheduledPoller):
    """Records each look (the earliest due time it returned), so a test knows the
    poller has looked and gone to sleep."""

    def __init__(self, redis: redis_py.Redis) -> None:
        super().__init__(redis)
        self.looks: list[float | None] = []

    def move_due(self) -> float | None:
        earliest = super().move_due()
        self.looks.append(earliest)
        return earliest


def listening(poller: ScheduledPoller, redis: redis_py.Redis) -> WakeupListener:
    """What a capsule does: its wake-up subscription carries the poller's channel."""
    before = redis.pubsub_numsub(keys.DUE_CHANNEL)[0][1]
    listener = WakeupListener(redis, poller.channels())
    listener.start()
    wait_for(
        lambda: redis.pubsub_numsub(keys.DUE_CHANNEL)[0][1] > before, message="the subscription"
    )
    return listener


def stop(poller: ScheduledPoller, listener: WakeupListener | None = None) -> None:
    poller.terminate()
    poller.join(2)
    if listener is not None:
        listener.stop()


def test_a_job_due_soon_moves_when_due_not_at_the_next_poll(redis: redis_py.Redis) -> None:
    # The first upkeep, which caps the sleep, is 10-15 s away; the job is due in 0.3 s.
    poller = ScheduledPoller(redis)
    later.perform_in(0.3, 1)
    poller.start()
    try:
        wait_for(
            lambda: redis.llen(keys.of(redis).queue("later")) == 1, timeout=8, message="the due job"
        )
    finally:
        stop(poller)


@pytest.mark.standalone_only("counts the subscriptions of one server")
def test_a_job_sooner_than_the_planned_wake_up_wakes_the_poller(redis: redis_py.Redis) -> None:
    later.perform_in(600, "far")
    poller = ProbePoller(redis)
    listener = listening(poller, redis)
    poller.start()
    try:
        wait_for(lambda: poller.looks, message="the first look")
        assert poller.looks[0] is not None and poller.looks[0] > clock.now() + 500
        later.perform_in(0.3, "soon")
        wait_for(
            lambda: redis.llen(keys.of(redis).queue("later")) == 1,
            timeout=8,
            message="the sooner job",
        )
        assert json.loads(redis.lindex(keys.of(redis).queue("later"), 0) or b"")["args"] == ["soon"]
        assert redis.zcard(keys.of(redis).SCHEDULE) == 1, "the far job still waits"
    finally:
        stop(poller, listener)


def test_an_announcement_wakes_the_poller_without_reading_redis(redis: redis_py.Redis) -> None:
    poller = ScheduledPoller(redis)
    with freeze_time("2026-11-21 12:00:00"):
        upkeep_at = clock.monotonic() + 1000
        assert poller.seconds_to_sleep(None, upkeep_at) == 1000, "nothing due: the cap"
        assert poller.seconds_to_sleep(NOW + 30, upkeep_at) == 30
        poller.announce([repr(NOW + 60)])
        assert poller.seconds_to_sleep(NOW + 30, upkeep_at) == 30, "a later job changes nothing"
        poller.announce([repr(NOW + 5)])
        assert poller.seconds_to_sleep(NOW + 30, upkeep_at) == 5
        poller.announce([""])  # (re)subscribed: something may have been missed
        assert poller.seconds_to_sleep(NOW + 30, upkeep_at) <= 0


def test_announcements_heard_together_wake_the_poller_at_the_soonest(
    redis: redis_py.Redis,
) -> None:
    poller = ScheduledPoller(redis)
    with freeze_time("2026-11-21 12:00:00"):
        upkeep_at = clock.monotonic() + 1000
        poller.announce([repr(NOW + 20), repr(NOW + 7), repr(NOW + 12)])
        assert poller.seconds_to_sleep(NOW + 30, upkeep_at) == 7


@pytest.mark.standalone_only("counts one server's commands")
def test_the_poller_reads_the_earliest_score_instead_of_polling(redis: redis_py.Redis) -> None:
    poller = ScheduledPoller(redis)
    with freeze_time("2026-11-21 12:00:00"):
        assert poller.move_due() is None, "both sets empty"
        schedule(redis, NOW + 30)
        redis.zadd(
            keys.of(redis).RETRY, {json.dumps({"class": "X", "args": [], "queue": "q"}): NOW + 45}
        )
        redis.config_resetstat()
        assert poller.move_due() == NOW + 30
        assert poller.seconds_to_sleep(NOW + 30, clock.monotonic() + 1000) == 30
    calls = {
        name.removeprefix("cmdstat_"): v["calls"] for name, v in redis.info("commandstats").items()
    }
    assert calls.get("zrange") == 2, calls
    assert "zrangebyscore" not in calls and "evalsha" not in calls, "nothing due: no drain"


@pytest.mark.standalone_only("counts one server's commands")
def test_only_the_sets_with_due_jobs_are_drained(redis: redis_py.Redis) -> None:
    schedule(redis, NOW - 1)
    schedule(redis, NOW + 30)
    redis.zadd(
        keys.of(redis).RETRY, {json.dumps({"class": "X", "args": [], "queue": "q"}): NOW + 45}
    )
    redis.config_resetstat()
    with freeze_time("2026-11-21 12:00:00"):
        assert ScheduledPoller(redis).move_due() == NOW + 30
    calls = {
        name.removeprefix("cmdstat_"): v["calls"] for name, v in redis.info("commandstats").items()
    }
    assert calls.get("zrangebyscore") == 1, "only schedule had a due job"
    assert redis.llen(keys.of(redis).queue("later")) == 1


@pytest.mark.standalone_only("threads share one connection pool")
def test_many_pollers_waking_together_move_each_job_once(redis: redis_py.Redis) -> None:
    pollers = [
        ScheduledPoller(redis_py.Redis(connection_pool=redis.connection_pool)) for _ in range(3)
    ]
    listeners = [listening(poller, redis) for poller in pollers]
    for poller in pollers:
        poller.start()
    try:
        rng = random.Random(7)
        for n in range(150):  # several due at the same instant
            later.perform_at(clock.now() + 0.2 + rng.randrange(10) / 20, n)
        wait_for(
            lambda: redis.llen(keys.of(redis).queue("later")) == 150, timeout=15, message="150 jobs"
        )
        assert redis.zcard(keys.of(redis).SCHEDULE) == 0
        queued = sorted(
            json.loads(job)["args"][0] for job in redis.lrange(keys.of(redis).queue("later"), 0, -1)
        )
        assert queued == list(range(150))
    finally:
        for poller, listener in zip(pollers, listeners, strict=True):
            stop(poller, listener)


def test_scheduled_pushes_and_retries_announce_their_due_time(redis: redis_py.Redis) -> None:
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.DUE_CHANNEL)
    try:
        later.perform_in(30, 1)
        [(_, at)] = cast(
            "list[tuple[bytes, float]]",
            redis.zrange(keys.of(redis).SCHEDULE, 0, 0, withscores=True),
        )
        assert next_message(pubsub) == at
        payload = {"class": "X", "args": [], "queue": "q", "jid": "j1", "retry": True}
        RetryHandler(redis).job_failed(None, payload, "q", ValueError("x"))  # a retry
        [(_, retry_at)] = cast(
            "list[tuple[bytes, float]]", redis.zrange(keys.of(redis).RETRY, 0, 0, withscores=True)
        )
        assert next_message(pubsub) == retry_at
    finally:
        pubsub.close()


def next_message(pubsub: redis_py.client.PubSub) -> float:
    deadline = clock.monotonic() + 5
    while clock.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message:
            return float(message["data"])
    raise AssertionError("no announcement")


@pytest.mark.standalone_only("counts the subscriptions of one server")
def test_a_capsule_shares_one_subscription_with_its_poller(redis: redis_py.Redis) -> None:
    ran.clear()
    capsule = Capsule(CapsuleConfig(queues=["on_time"], concurrency=2), redis=redis)
    capsule.start()
    try:
        wait_for(
            lambda: (
                redis.pubsub_numsub(keys.DUE_CHANNEL, keys.WAKE_CHANNEL)
                == [(keys.DUE_CHANNEL.encode(), 1), (keys.WAKE_CHANNEL.encode(), 1)]
            ),
            message="both channels subscribed",
        )
        subscriptions = [int(c["sub"]) for c in redis.client_list()]
        assert 2 in subscriptions, "one connection holds both channels"
        on_time.perform_in(0.3, 1)
        assert ran.wait(8), "the capsule's poller woke for the job and a processor ran it"
    finally:
        capsule.stop(timeout=5)


def test_interval_mode_polls_blindly_and_subscribes_to_nothing(redis: redis_py.Redis) -> None:
    assert ScheduledPoller(redis, mode="interval").channels() == {}
    config = CapsuleConfig(queues=["on_time"], fetch="basic", scheduled_poll="interval")
    assert Capsule(config, redis=redis).wakeup.handlers == {}
    poller = ScheduledPoller(redis, mode="interval", poll_interval_average=0.05)
    schedule(redis, 0.0)
    poller.start()
    try:
        wait_for(
            lambda: redis.llen(keys.of(redis).queue("later")) == 1, message="the interval poll"
        )
    finally:
        stop(poller)


def test_scheduled_poll_is_a_checked_setting(tmp_path: Path) -> None:
    conf = tmp_path / "limitd.yml"
    conf.write_text("queues: [a]\nscheduled_poll: interval\n")
    [spec] = load_config([conf]).capsules
    assert spec.config.scheduled_poll == "interval"
    conf.write_text("queues: [a]\nscheduled_poll: sometimes\n")
    with pytest.raises(ConfigError, match="scheduled_poll: expected one of"):
        load_config([conf])
    with pytest.raises(ValueError, match="scheduled_poll must be one of"):
        CapsuleConfig(scheduled_poll="never")
