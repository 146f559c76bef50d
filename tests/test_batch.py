"""Batches through real Redis, in one process: events and their order, failures and
retries, death, half-built and empty batches, repeated runs, nesting, reopening,
uniqueness inside a batch and the status. Lifetimes are in test_batch_expiry.py, the
two-process run in test_batch_processes.py."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.batch import store
from limitd.supervisor import Capsule, CapsuleConfig

T0 = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.timezone.utc)
fail_first_run: set[int] = set()


@limitd.job(name="batch_test.Work", retry_in=lambda count, exc, payload: 1)
def work(n: int) -> None:
    payload = limitd.current_payload() or {}
    if n in fail_first_run and "retry_count" not in payload:
        raise ValueError(f"first run of {n}")


@limitd.job(name="batch_test.Doomed", retry=0)
def doomed(n: int) -> None:
    raise RuntimeError("never works")


@limitd.job(name="batch_test.Spawner")
def spawner(extra: int, inside: bool) -> None:
    if inside:
        batch = limitd.Batch.current()
        assert batch is not None
        with batch.jobs():
            work.perform_bulk([[100 + i] for i in range(extra)])
    else:
        for i in range(extra):
            work.perform_async(200 + i)  # outside any block: not in the batch


@limitd.job(name="batch_test.Unique", unique_for=60)
def unique_work(n: int) -> None: ...


@limitd.job(name="batch_test.Callback", queue="callbacks")
def callback(status: dict, options: dict) -> None: ...


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Iterator[Capsule]:
    fail_first_run.clear()
    yield Capsule(CapsuleConfig(queues=["default"]), redis=redis)


def fired(redis: redis_py.Redis) -> list[tuple[str, dict, dict]]:
    """Callback jobs enqueued so far, oldest first: (event, status, options)."""
    bodies = [
        json.loads(raw) for raw in reversed(redis.lrange(keys.of(redis).queue("callbacks"), 0, -1))
    ]
    return [(body["args"][0]["event"], body["args"][0], body["args"][1]) for body in bodies]


def events(redis: redis_py.Redis) -> list[str]:
    return [event for event, _, _ in fired(redis)]


def new_batch(**kwargs) -> limitd.Batch:
    batch = limitd.Batch("test batch", **kwargs)
    for event in ("complete", "success", "death"):
        batch.on(event, callback, {"event_was": event})
    return batch


def test_success_and_complete_fire_once_after_the_last_job(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        for n in range(5):
            work.perform_async(n)
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending, status.complete) == (5, 5, False)
    assert capsule.drain() == {"done": 5}
    assert events(redis) == ["complete", "success"]
    [(_, complete, options), (_, success, _)] = fired(redis)
    assert complete == {
        "bid": batch.bid,
        "event": "complete",
        "total": 5,
        "pending": 0,
        "failures": 0,
        "description": "test batch",
    }
    assert options == {"event_was": "complete"}
    assert success["event"] == "success"
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.complete, status.success) == (0, True, True)


def test_jobs_carry_the_batch_id(redis) -> None:
    batch = limitd.Batch()
    with batch.jobs():
        work.perform_async(1)
        work.perform_in(30, 2)
    [raw] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    [scheduled] = redis.zrange(keys.of(redis).SCHEDULE, 0, -1)
    assert json.loads(raw)["bid"] == json.loads(scheduled)["bid"] == batch.bid
    work.perform_async(3)
    assert "bid" not in json.loads(redis.lindex(keys.of(redis).queue("default"), 0))


def test_a_job_that_fails_then_succeeds_counts_as_success(capsule: Capsule, redis) -> None:
    fail_first_run.update({1, 3})
    batch = new_batch()
    with freeze_time(T0) as frozen:
        with batch.jobs():
            work.perform_bulk([[n] for n in range(4)])
        assert capsule.drain() == {"done": 2, "retry": 2}
        # Every job has run once: complete fires, success waits for the retries.
        assert events(redis) == ["complete"]
        status = limitd.Batch.status(batch.bid)
        assert (status.pending, len(status.failures)) == (2, 2)
        assert set(status.failures.values()) == {
            "ValueError: first run of 1",
            "ValueError: first run of 3",
        }
        frozen.tick(dt.timedelta(seconds=2))
        assert capsule.drain(scheduled=True) == {"done": 2}
    assert events(redis) == ["complete", "success"]
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.failures, status.success) == (0, {}, True)


def test_death_fires_once_and_success_never(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        doomed.perform_async(1)
        doomed.perform_async(2)
        work.perform_async(3)
    assert capsule.drain() == {"dead": 2, "done": 1}
    assert events(redis) == ["death", "complete"]
    status = limitd.Batch.status(batch.bid)
    assert status.death_at is not None and not status.success
    assert status.pending == 2


def test_nothing_fires_while_jobs_are_still_being_added(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        work.perform_async(1)
        assert capsule.drain() == {"done": 1}  # the only job so far finished at once
        assert events(redis) == []
        work.perform_async(2)
    assert events(redis) == []
    capsule.drain()
    assert events(redis) == ["complete", "success"]


def test_an_empty_batch_completes_and_succeeds_when_its_block_closes(redis) -> None:
    batch = new_batch()
    with batch.jobs():
        pass
    assert events(redis) == ["complete", "success"]
    assert limitd.Batch.status(batch.bid).total == 0


def test_a_block_that_raises_still_closes_the_batch(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with pytest.raises(KeyError), batch.jobs():
        work.perform_async(1)
        raise KeyError("app bug")
    assert limitd.Batch.status(batch.bid).building == 0
    capsule.drain()
    assert events(redis) == ["complete", "success"]


def test_a_job_run_twice_is_counted_once(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        work.perform_async(1)
        work.perform_async(2)
    raw = redis.lindex(keys.of(redis).queue("default"), -1)
    redis.rpush(
        keys.of(redis).queue("default"), raw
    )  # the first job will run twice (crash recovery)
    assert capsule.drain() == {"done": 3}
    assert limitd.Batch.status(batch.bid).pending == 0
    assert events(redis) == ["complete", "success"]
    # Yet another run, a failing one this time, changes nothing either.
    payload = json.loads(raw)
    assert store.job_settled(redis, batch.bid, payload["jid"], "failure", "late") == 0
    assert store.job_settled(redis, batch.bid, payload["jid"], "success") == 0
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.failures) == (0, {})
    assert events(redis) == ["complete", "success"]


@pytest.mark.standalone_only("threads share one connection pool")
def test_concurrent_last_jobs_fire_exactly_once(redis) -> None:
    batch = new_batch()
    with batch.jobs():
        jids = [work.perform_async(n) for n in range(8)]
    start = threading.Barrier(8)

    def finish(jid: str) -> None:
        conn = redis_py.Redis(connection_pool=redis.connection_pool)
        start.wait()
        store.job_settled(conn, batch.bid, jid, "success")

    threads = [threading.Thread(target=finish, args=(jid,)) for jid in jids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert events(redis) == ["complete", "success"]


def test_a_child_batch_holds_back_its_parents_success(redis, capsule: Capsule) -> None:
    parent = new_batch()
    child = limitd.Batch("child")
    child.on("success", callback, {"who": "child"})
    with parent.jobs():
        work.set(queue="parent").perform_async(1)
        with child.jobs():
            work.set(queue="child").perform_async(2)
    status = limitd.Batch.status(parent.bid)
    assert (status.total, status.children) == (1, 1)
    assert limitd.Batch.status(child.bid).parent == parent.bid
    Capsule(CapsuleConfig(queues=["parent"]), redis=redis).drain()
    assert events(redis) == []  # the parent's own job is done; its child is not
    Capsule(CapsuleConfig(queues=["child"]), redis=redis).drain()
    assert [(e, opts) for e, _, opts in fired(redis)] == [
        ("success", {"who": "child"}),
        ("complete", {"event_was": "complete"}),
        ("success", {"event_was": "success"}),
    ]


def test_a_parent_whose_child_finished_first_waits_for_its_own_jobs(redis) -> None:
    parent = new_batch()
    with parent.jobs():
        work.set(queue="parent").perform_async(1)
        with limitd.Batch("child").jobs():
            work.set(queue="child").perform_async(2)
    Capsule(CapsuleConfig(queues=["child"]), redis=redis).drain()
    assert limitd.Batch.status(parent.bid).complete is False
    Capsule(CapsuleConfig(queues=["parent"]), redis=redis).drain()
    assert events(redis) == ["complete", "success"]


def test_a_job_may_add_jobs_to_its_own_batch(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        spawner.perform_async(3, True)
    assert capsule.drain() == {"done": 4}
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending) == (4, 0)
    assert events(redis) == ["complete", "success"]


def test_jobs_a_batch_job_pushes_outside_a_block_are_not_in_the_batch(
    capsule: Capsule, redis
) -> None:
    batch = new_batch()
    with batch.jobs():
        spawner.perform_async(3, False)
    assert capsule.drain() == {"done": 4}
    assert limitd.Batch.status(batch.bid).total == 1
    assert events(redis) == ["complete", "success"]


def test_a_completed_batch_cannot_be_reopened(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        work.perform_async(1)
    capsule.drain()
    reopened = limitd.Batch.open(batch.bid)
    with pytest.raises(limitd.BatchNotOpen, match="already completed"), reopened.jobs():
        pass
    unknown = limitd.Batch.open("no-such-batch")
    with pytest.raises(limitd.BatchNotOpen, match="does not exist"), unknown.jobs():
        pass


def test_a_unique_duplicate_does_not_join_the_batch(capsule: Capsule, redis) -> None:
    batch = new_batch()
    with batch.jobs():
        assert unique_work.perform_async(1) is not None
        assert unique_work.perform_async(1) is None
        assert unique_work.perform_bulk([[2], [2]])[1] is None
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending) == (2, 2)
    capsule.drain()
    assert events(redis) == ["complete", "success"]


def test_pending_never_goes_below_zero(redis) -> None:
    batch = new_batch()
    with batch.jobs():
        jid = work.perform_async(1)
    for _ in range(3):
        store.job_settled(redis, batch.bid, jid, "success")
    store.job_settled(redis, batch.bid, "not-in-the-batch", "success")
    assert limitd.Batch.status(batch.bid).pending == 0
    assert int(redis.hget(keys.of(redis).batch(batch.bid), "pending")) == 0


def test_callbacks_must_be_registered_before_jobs_are_added(redis) -> None:
    batch = limitd.Batch()
    with batch.jobs():
        pass
    with pytest.raises(RuntimeError, match="before its first jobs"):
        batch.on("success", callback)
    with pytest.raises(ValueError, match="unknown batch event"):
        limitd.Batch().on("finished", callback)


def test_a_callback_queue_overrides_the_callbacks_own(capsule: Capsule, redis) -> None:
    batch = limitd.Batch(callback_queue="default").on("success", "batch_test.Callback")
    with batch.jobs():
        pass
    [raw] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    body = json.loads(raw)
    assert body["class"] == "batch_test.Callback"
    assert body["queue"] == "default"
    assert "enqueued_at" in body and "bid" not in body
