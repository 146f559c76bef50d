"""The shared per-queue hashes (limits, busy counts) stay hash tables whatever their
size, and no reader shows the field that keeps them so (``limitd/queues/per_queue``)."""

from __future__ import annotations

import json

import redis as redis_py

from limitd import keys
from limitd.api.stats import queue_overview
from limitd.fetch.factory import limit_fetch
from limitd.queues import limits
from limitd.queues.order import QueueOrder
from limitd.queues.per_queue import HASHTABLE_FIELD, keep_hashtables

QUEUES = ["a", "b", "c"]


def encodings(redis: redis_py.Redis) -> tuple[bytes, bytes]:
    k = keys.of(redis)
    return redis.object("encoding", k.LIMITS), redis.object("encoding", k.BUSY)


def push(redis: redis_py.Redis, queue: str, count: int) -> None:
    k = keys.of(redis)
    redis.sadd(k.QUEUES, queue)
    for n in range(count):
        redis.lpush(k.queue(queue), json.dumps({"class": "Noop", "args": [n], "jid": f"{n}"}))


def test_a_heartbeat_turns_the_shared_hashes_into_hash_tables(redis: redis_py.Redis) -> None:
    fetch = limit_fetch(redis, QueueOrder(QUEUES), "c1")
    for queue in QUEUES:
        limits.set_limit(redis, queue, 5)
    push(redis, "a", 2)
    fetch.settle(fetch.take(2))  # a busy count written
    assert encodings(redis) == (b"listpack", b"listpack")  # three short fields each
    fetch.maintain(list, reap=False)
    assert encodings(redis) == (b"hashtable", b"hashtable")


def test_a_flushed_redis_gets_the_marker_back_at_the_next_heartbeat(
    redis: redis_py.Redis,
) -> None:
    fetch = limit_fetch(redis, QueueOrder(QUEUES), "c1")
    fetch.maintain(list, reap=False)
    redis.flushall()
    limits.set_limit(redis, "a", 1)
    assert redis.object("encoding", keys.of(redis).LIMITS) == b"listpack"
    fetch.maintain(list, reap=False)
    assert encodings(redis) == (b"hashtable", b"hashtable")


def test_limits_hold_with_the_marker_in_place(redis: redis_py.Redis) -> None:
    keep_hashtables(redis)
    limits.set_limit(redis, "a", 2)
    push(redis, "a", 5)
    fetch = limit_fetch(redis, QueueOrder(["a"]), "c1")
    taken = fetch.take(5)
    assert len(taken) == 2
    assert limits.busy(redis, "a") == 2
    fetch.settle(taken)
    assert limits.busy(redis, "a") == 0


def test_no_reader_shows_the_marker(redis: redis_py.Redis) -> None:
    limits.set_limit(redis, "a", 2)
    push(redis, "a", 1)
    fetch = limit_fetch(redis, QueueOrder(["a"]), "c1")
    fetch.take(1)
    keep_hashtables(redis)
    assert redis.hexists(keys.of(redis).BUSY, HASHTABLE_FIELD)
    assert set(limits.all_limits(redis)) == {"a"}
    overview = queue_overview(redis)
    assert [status.name for status in overview] == ["a"]
    assert overview[0].busy == 1 and overview[0].limit == 2


def test_the_marker_reads_as_zero_to_a_script_that_sums_the_busy_counts(
    redis: redis_py.Redis,
) -> None:
    keep_hashtables(redis)
    assert sum(int(count) for count in redis.hvals(keys.of(redis).BUSY)) == 0
