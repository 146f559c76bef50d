"""The limit fetch's call packed from cached parts (a dispatcher's own connection) is the
call redis-py's arguments describe, byte for byte, in every shape a call takes; and a
fetch through an own connection behaves as through the pool, NOSCRIPT included."""

from __future__ import annotations

import json

import pytest
import redis as redis_py

from limitd import keys
from limitd.connection import OwnConnection, own_connection
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import ACK, LIMIT_FETCH, REQUEUE, YIELD, LimitFetch
from limitd.fetch.limit_unit import LimitUnitOfWork
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder


def fetcher(redis: redis_py.Redis, queues: list, **options: object) -> LimitFetch:
    return limit_fetch(redis, QueueOrder(queues), "c1", **options)  # type: ignore[arg-type]


def unit(fetch: LimitFetch, queue: str, n: int) -> LimitUnitOfWork:
    job = json.dumps({"class": "X", "args": [n, "é"], "queue": queue}).encode()
    return LimitUnitOfWork(queue, job, fetch, 0, 0)


def both(  # type: ignore[no-untyped-def]
    fetch: LimitFetch, settle: list, mode: bytes, orders: list, want: int, *, plan
) -> None:
    script_keys, args = fetch._script_input(settle, mode, orders, want, "", plan=plan)
    assert fetch._packed_input(settle, mode, orders, want, plan) == LIMIT_FETCH.packed(
        script_keys, args
    )


@pytest.mark.parametrize("mode", [ACK, REQUEUE, YIELD])
@pytest.mark.parametrize("settled", [0, 1, 3, 5])
def test_packed_call_matches_without_the_index(
    redis: redis_py.Redis, mode: bytes, settled: int
) -> None:
    names = ["a", "b", "héllo"]
    fetch = fetcher(redis, names, ready_index=False, blocking=["b"])
    settle = [unit(fetch, names[i % 3], i) for i in range(settled)]
    for want in (0, 1, 5):
        both(fetch, settle, mode, fetch._orders(want), want, plan=None)


def test_packed_call_matches_with_weighted_orders_and_a_test_clock(redis: redis_py.Redis) -> None:
    fetch = fetcher(redis, [["a", 3], ["b", 1], ["c", 1]], ready_index=False, rate_clock=lambda: 12)
    orders = fetch._orders(4)
    assert len(orders) == 4  # one order per job: the ARGV that follows the index's
    both(fetch, [unit(fetch, "c", 1)], ACK, orders, 4, plan=None)


@pytest.mark.parametrize("weighted", [False, True])
def test_packed_call_matches_with_the_index_and_hints(
    redis: redis_py.Redis, weighted: bool
) -> None:
    queues = [[f"q{i}", 1] for i in range(40)] if weighted else [f"q{i}" for i in range(40)]
    fetch = fetcher(redis, queues)
    index = fetch.index
    assert index is not None
    settle = [unit(fetch, "q1", 1), unit(fetch, "q7", 2)]
    for want, hints in ((3, {"q2": 3, "q30": 31}), (1, {})):
        plan = index.plan(want, hints)
        both(fetch, settle, ACK, plan.orders, want, plan=plan)
    # Settling only, with the index: no plan, and neither its keys nor its arguments.
    both(fetch, settle, ACK, [], 0, plan=None)


def test_a_fetch_through_an_own_connection_keeps_the_limits(redis: redis_py.Redis) -> None:
    k = keys.of(redis)
    redis.lpush(k.queue("a"), *[json.dumps({"class": "X", "args": [i]}) for i in range(6)])
    queue_limits.set_limit(redis, "a", 2)
    fetch = fetcher(redis, ["a"])
    conn = own_connection(redis)
    assert isinstance(conn, OwnConnection)
    try:
        first = fetch.take(5, conn=conn)
        assert len(first) == 2  # the limit, whatever the call asked for
        assert int(redis.hget(k.BUSY, "a")) == 2
        redis.script_flush()  # Redis lost the script: loaded again, the call made once
        second = fetch.take(5, first, conn=conn)
        assert len(second) == 2
        assert int(redis.hget(k.BUSY, "a")) == 2
        assert redis.llen(k.queue("a")) == 2
        third = fetch.take(5, second, conn=conn)
        assert [json.loads(u.job)["args"] for u in first + second + third] == [
            [i] for i in range(6)
        ]
        fetch.take(5, third, conn=conn)
        assert int(redis.hget(k.BUSY, "a") or 0) == 0
        assert redis.llen(k.in_progress("c1", "a")) == 0
    finally:
        conn.close()
