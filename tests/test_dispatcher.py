"""The limit fetch taking several jobs per call, and the capsule's dispatcher that uses
it: never more jobs than processors are waiting, limits and order kept within one call,
finished jobs settled and untaken jobs requeued at stop."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.fetch.dispatcher import Dispatcher
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.fetch.wakeup import IdleGate
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import lua_calls, wait_for

release = threading.Event()
started: list[int] = []


@limitd.job(name="dispatch_test.Held", queue="a")
def held(n: int) -> None:
    started.append(n)
    release.wait(10)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    release.clear()
    started.clear()
    yield
    release.set()


def push(redis: redis_py.Redis, queue: str, count: int) -> None:
    limitd.Client(redis).push_bulk({"class": "dispatch_test.Held", "queue": queue},
                                   [[i] for i in range(count)])  # fmt: skip


def fetch_for(redis: redis_py.Redis, *queues: str, blocking: tuple[str, ...] = ()) -> LimitFetch:
    return limit_fetch(redis, QueueOrder(list(queues)), "cap-1", blocking=blocking)


def busy(redis: redis_py.Redis, queue: str) -> int:
    return int(redis.hget(keys.of(redis).BUSY, queue) or 0)


def test_one_call_takes_up_to_want_within_the_limit(redis) -> None:
    push(redis, "a", 10)
    queue_limits.set_limit(redis, "a", 3)
    units = fetch_for(redis, "a").take(5, [])
    assert len(units) == 3
    assert busy(redis, "a") == 3
    assert redis.llen(keys.of(redis).in_progress("cap-1", "a")) == 3


def test_one_call_keeps_the_strict_order_across_queues(redis) -> None:
    push(redis, "a", 2)
    push(redis, "b", 5)
    units = fetch_for(redis, "a", "b").take(5, [])
    assert [u.queue for u in units] == ["a", "a", "b", "b", "b"]
    assert [json.loads(u.job)["args"] for u in units][:2] == [[0], [1]]  # oldest first


def test_a_blocking_queue_at_its_limit_stops_the_whole_call(redis) -> None:
    push(redis, "a", 5)
    push(redis, "b", 5)
    queue_limits.set_limit(redis, "a", 2)
    units = fetch_for(redis, "a", "b", blocking=("a",)).take(5, [])
    assert [u.queue for u in units] == ["a", "a"]


def test_one_call_settles_many_and_requeues_to_the_front(redis) -> None:
    push(redis, "a", 6)
    fetch = fetch_for(redis, "a")
    units = fetch.take(6, [])
    again = fetch.take(0, units[:4])
    assert again == [] and busy(redis, "a") == 2
    fetch.requeue(units[4:])
    assert busy(redis, "a") == 0
    assert redis.llen(keys.of(redis).in_progress("cap-1", "a")) == 0
    assert [json.loads(u.job)["args"] for u in fetch.take(2, [])] == [[4], [5]]


def test_the_dispatcher_fetches_no_more_than_processors_wait_for(redis) -> None:
    push(redis, "a", 10)
    capsule = Capsule(CapsuleConfig(queues=["a"], concurrency=3), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: len(started) == 3, message="three jobs running")
        assert redis.llen(keys.of(redis).in_progress(capsule.id, "a")) == 3  # none fetched ahead
        assert redis.llen(keys.of(redis).queue("a")) == 7
        release.set()
        wait_for(lambda: len(started) == 10, message="every job")
        wait_for(lambda: busy(redis, "a") == 0, message="every job settled")
    finally:
        capsule.stop(timeout=5)
    assert redis.llen(keys.of(redis).in_progress(capsule.id, "a")) == 0


def test_stop_settles_finished_jobs_and_requeues_untaken_ones(redis) -> None:
    push(redis, "a", 3)
    fetch = fetch_for(redis, "a")
    dispatcher = Dispatcher(fetch, IdleGate())  # never started: driven by hand
    finished, untaken, _ = fetch.take(3, [])
    dispatcher._finished.append(finished)
    dispatcher._ready.append(untaken)
    assert {u.job for u in dispatcher.held()} == {finished.job, untaken.job}
    dispatcher.stop()
    assert busy(redis, "a") == 1  # only the third, which nobody handed back
    assert redis.llen(keys.of(redis).queue("a")) == 1
    assert redis.lindex(keys.of(redis).queue("a"), -1) == untaken.job  # next to be fetched


def test_an_idle_capsule_polls_once_per_interval_not_once_per_thread(redis) -> None:
    """Processors waiting in vain re-wait every poll interval; that must not make the
    dispatcher fetch for each of them (ten threads would make ten calls a poll)."""
    config = CapsuleConfig(queues=["a"], concurrency=10, poll_range=(0.1, 0.1))
    capsule = Capsule(config, redis=redis)
    capsule.start()
    try:
        wait_for(lambda: capsule.dispatcher.waiting == 10, message="idle processors")
        before = lua_calls(redis)
        started = time.monotonic()
        threading.Event().wait(1.0)  # ten poll intervals, each thread timing out ten times
        calls = lua_calls(redis) - before
        intervals = (time.monotonic() - started) / 0.1  # more than ten on a loaded machine
    finally:
        capsule.stop(timeout=5)
    assert calls <= 1.5 * intervals, (
        f"{calls} fetch calls in {intervals:.0f} poll intervals from an idle capsule "
        "(expected about one per interval; one per thread would be ten)"
    )


def test_weighted_orders_are_drawn_per_job_within_one_call(redis) -> None:
    """Taking 40 jobs in one call must look like 40 fetches: with weights 3:1, both
    queues give jobs, the heavier about three times as many."""
    push(redis, "a", 100)
    push(redis, "b", 100)
    order = QueueOrder([["a", 3], ["b", 1]], rng=random.Random(7))
    units = limit_fetch(redis, order, "cap-1").take(40, [])
    taken = Counter(unit.queue for unit in units)
    assert sum(taken.values()) == 40
    assert 20 <= taken["a"] <= 38 and taken["b"] >= 2, taken


def test_a_processor_that_needs_a_job_makes_the_call_itself(redis) -> None:
    """Under load no thread hop: with the dispatcher's own thread never started, a
    processor coming back with a finished job settles it and takes the next one in its
    own call, and a fresh one takes its first job the same way."""
    push(redis, "a", 3)
    fetch = fetch_for(redis, "a")
    dispatcher = Dispatcher(fetch, IdleGate(poll_range=(0.05, 0.05)))  # never started
    first = dispatcher.take()
    assert first is not None and busy(redis, "a") == 1
    dispatcher.finish(first)
    second = dispatcher.take()
    assert second is not None and second.job != first.job
    assert busy(redis, "a") == 1, "the first was settled in the same call"
    assert redis.llen(keys.of(redis).in_progress("cap-1", "a")) == 1
    dispatcher.stop()
    assert busy(redis, "a") == 1  # the second is still held: nobody handed it back


def test_processors_arriving_during_a_call_are_served_by_the_next_one(redis) -> None:
    """While one processor's call is in flight, others wait; when it returns, one of
    them makes the next call for all of them: every processor gets a job, none twice."""
    push(redis, "a", 12)
    fetch = fetch_for(redis, "a")
    dispatcher = Dispatcher(fetch, IdleGate(poll_range=(0.05, 0.05)))  # never started
    in_call, go_on = threading.Event(), threading.Event()
    take = fetch.take

    def slow_first_call(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not in_call.is_set():
            in_call.set()
            go_on.wait(10)
        return take(*args, **kwargs)

    fetch.take = slow_first_call  # type: ignore[method-assign]
    got: list[bytes] = []
    lock = threading.Lock()

    def processor() -> None:
        unit = dispatcher.take()
        with lock:
            got.append(unit.job if unit is not None else b"")

    leader = threading.Thread(target=processor)
    leader.start()
    assert in_call.wait(10)
    others = [threading.Thread(target=processor) for _ in range(4)]
    for thread in others:
        thread.start()
    wait_for(lambda: dispatcher.waiting == 4, message="four processors waiting")
    go_on.set()
    for thread in [leader, *others]:
        thread.join(10)
    assert len(got) == 5 and b"" not in got
    assert len(set(got)) == 5
    assert busy(redis, "a") == 5 and redis.llen(keys.of(redis).queue("a")) == 7
    dispatcher.stop()
