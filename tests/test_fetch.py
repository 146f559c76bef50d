"""Queue ordering (strict / random / weighted) as observed through real fetches."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import redis as redis_py

from limitd.fetch.basic import BasicFetch
from limitd.queues.order import QueueOrder


def take_one(fetch, done=None, **options):  # type: ignore[no-untyped-def]
    """One job (settling ``done`` in the same call), or None."""
    units = fetch.take(1, [done] if done is not None else [], **options)
    return units[0] if units else None


def fill(redis: redis_py.Redis, queues: list[str], per_queue: int) -> None:
    pipe = redis.pipeline()
    for name in queues:
        pipe.lpush(f"queue:{name}", *[f'{{"n":{i}}}' for i in range(per_queue)])
    pipe.execute()


def fetched_queues(fetch: BasicFetch, count: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    for _ in range(count):
        unit = take_one(fetch, wait=True)
        assert unit is not None
        seen[unit.queue] += 1
    return seen


def test_modes_follow_sidekiq_rules() -> None:
    assert QueueOrder(["a", "b"]).mode == "strict"
    assert QueueOrder(["a,1", ["b", 1]]).mode == "random"
    assert QueueOrder([["a", 3], "b"]).mode == "weighted"
    assert QueueOrder([["a", 3], ["b", 1]]).weights == {"a": 3, "b": 1}


@pytest.mark.parametrize("bad", [[], [""], [["a", -1]], [["a", "x"]], [["a", 1, 2]]])
def test_bad_queue_entries_are_rejected(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="queue"):
        QueueOrder(bad)  # type: ignore[arg-type]


def test_strict_order_drains_the_first_queue_first(redis: redis_py.Redis) -> None:
    fill(redis, ["high", "low"], 5)
    fetch = BasicFetch(redis, QueueOrder(["high", "low"]), block_seconds=0.05)
    order = [take_one(fetch, wait=True).queue for _ in range(10)]  # type: ignore[union-attr]
    assert order == ["high"] * 5 + ["low"] * 5
    assert take_one(fetch, wait=True) is None


def test_fifo_within_a_queue(redis: redis_py.Redis) -> None:
    fill(redis, ["q"], 3)
    fetch = BasicFetch(redis, QueueOrder(["q"]))
    jobs = [take_one(fetch, wait=True).job for _ in range(3)]  # type: ignore[union-attr]
    assert jobs == [b'{"n":0}', b'{"n":1}', b'{"n":2}']


def test_weighted_fetches_follow_the_weights(redis: redis_py.Redis) -> None:
    """With every queue non-empty, a queue comes first in a shuffled, de-duplicated
    order with probability weight / total weight: 4/7, 2/7, 1/7."""
    fetches = 2100
    fill(redis, ["default", "throttled_2x", "throttled_4x"], fetches)
    order = QueueOrder(
        [["default", 4], ["throttled_2x", 2], ["throttled_4x", 1]], rng=random.Random(7)
    )
    seen = fetched_queues(BasicFetch(redis, order), fetches)
    for name, weight in (("default", 4), ("throttled_2x", 2), ("throttled_4x", 1)):
        p = weight / 7
        sigma = (fetches * p * (1 - p)) ** 0.5
        assert abs(seen[name] - fetches * p) < 4 * sigma, seen


def test_random_mode_spreads_evenly(redis: redis_py.Redis) -> None:
    fetches = 1500
    fill(redis, ["a", "b", "c"], fetches)
    order = QueueOrder(["a,1", "b,1", "c,1"], rng=random.Random(3))
    seen = fetched_queues(BasicFetch(redis, order), fetches)
    sigma = (fetches * (1 / 3) * (2 / 3)) ** 0.5
    assert all(abs(seen[q] - fetches / 3) < 4 * sigma for q in "abc"), seen


def test_weighted_order_never_drops_a_queue() -> None:
    order = QueueOrder([["a", 50], ["b", 1]], rng=random.Random(1))
    for _ in range(200):
        assert sorted(order.next_order()) == ["a", "b"]


def test_requeue_puts_the_job_back_to_run_next(redis: redis_py.Redis) -> None:
    fill(redis, ["q"], 2)
    fetch = BasicFetch(redis, QueueOrder(["q"]))
    first = take_one(fetch, wait=True)
    assert first is not None
    fetch.requeue(first)
    again = take_one(fetch, wait=True)
    assert again is not None
    assert again.job == first.job
