"""Script calls that server middleware leave for a job's acknowledgement: made in the
same round trip as the limit fetch's settle, merged per batch, robust to a server that
lost its scripts, and made at once where the fetch has no acknowledgement (BRPOP)."""

from __future__ import annotations

from decimal import Decimal

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.batch import store
from limitd.connection import LuaScript, merge_calls, pack_command, send_packed
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.unique import middleware as unique
from tests.helpers import lua_calls
from tests.test_batch import callback, work

replies: list[object] = []


def batch_of(redis: redis_py.Redis, count: int) -> tuple[limitd.Batch, list[str]]:
    batch = limitd.Batch("merged").on("success", callback)
    with batch.jobs():
        jids = [work.perform_async(n) for n in range(count)]
    return batch, jids


def test_calls_for_one_batch_merge_into_one_run_with_a_reply_each(redis) -> None:
    batch, jids = batch_of(redis, 3)
    other, other_jids = batch_of(redis, 1)
    calls = [store.job_settled_call(keys.of(redis), batch.bid, jid, "success", "",
                                    on_reply=replies.append)
             for jid in [jids[0], jids[1], jids[0]]]  # fmt: skip
    calls.insert(1, store.job_settled_call(keys.of(redis), other.bid, other_jids[0], "success"))
    merged = merge_calls(calls)
    assert [len(group.parts) for group in merged] == [3, 1]
    replies.clear()
    for group in merged:
        group.deliver(redis, group.call.script(redis, group.call.keys, group.call.all_args()))
    assert replies == [1, 1, 0]  # the repeated jid counts once
    assert limitd.Batch.status(batch.bid).pending == 1
    assert limitd.Batch.status(other.bid).success


def test_every_argument_type_reaches_redis(redis) -> None:
    # hiredis packs str, bytes, int and float itself; anything else goes as its str().
    args = ["é", b"\x00raw", 7, 1.25, True, None, Decimal("1.10")]
    reply = send_packed(redis, pack_command("EVAL", "return ARGV", 0, *args))
    assert reply == ["é".encode(), b"\x00raw", b"7", b"1.25", b"True", b"None", b"1.10"]


def merged_run(redis: redis_py.Redis, bid: str, runs: list[tuple[str, str]]) -> list[object]:
    """Record ``runs`` (jid, result) of one batch in one merged script run."""
    replies.clear()
    calls = [store.job_settled_call(keys.of(redis), bid, jid, result,
                                    "boom" if result != "success" else "", on_reply=replies.append)
             for jid, result in runs]  # fmt: skip
    (group,) = merge_calls(calls)
    group.deliver(redis, group.call.script(redis, group.call.keys, group.call.all_args()))
    return list(replies)


def test_runs_in_one_call_take_effect_in_their_order(redis) -> None:
    batch, (a, b, c) = batch_of(redis, 3)
    # a fails then succeeds; b succeeds then a late failure arrives; c dies.
    runs = [(a, "failure"), (b, "success"), (a, "success"), (b, "failure"), (c, "death")]
    assert merged_run(redis, batch.bid, runs) == [1, 1, 1, 0, 1]
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.failures) == (1, {c: "boom"})
    assert status.complete and not status.success and status.death_at is not None


def test_a_call_with_more_successes_than_one_flush_holds(redis) -> None:
    batch = limitd.Batch("big").on("success", callback)
    with batch.jobs():
        jids = work.perform_bulk([[n] for n in range(1_200)])  # the script flushes at 1,000
    assert merged_run(redis, batch.bid, [(jid, "success") for jid in [*jids, jids[0]]]) == [
        *[1] * 1_200,
        0,
    ]
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending, status.success) == (1_200, 0, True)
    assert redis.llen("queue:callbacks") == 1


def run_without_settling(redis: redis_py.Redis, count: int) -> tuple[LimitFetch, list]:
    """Fetch ``count`` jobs and run them, as processors do, without acknowledging them:
    each unit keeps the batch update its middleware left for the acknowledgement."""
    fetch = limit_fetch(redis, QueueOrder(["default"]), "cap-1")
    capsule = Capsule(CapsuleConfig(queues=["default"]), redis=redis)
    units = fetch.take(count, [])
    for unit in units:
        capsule.executor.execute(unit)
    return fetch, units


def test_a_busy_capsule_settles_a_batch_with_its_fetch(redis) -> None:
    batch, _ = batch_of(redis, 6)
    fetch, units = run_without_settling(redis, 6)
    assert limitd.Batch.status(batch.bid).pending == 6  # nothing sent yet
    counts = lua_calls(redis)
    fetch.take(0, units)
    # One write: the six updates merged into one script run, then the settle.
    assert lua_calls(redis) - counts == 2
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.success) == (0, True)
    assert redis.hget(keys.of(redis).BUSY, "default") == b"0"


def test_calls_survive_a_server_that_lost_its_scripts(redis) -> None:
    batch, _ = batch_of(redis, 2)
    fetch, units = run_without_settling(redis, 2)
    redis.script_flush()  # as after a Redis restart
    assert fetch.take(1, units) == []
    assert limitd.Batch.status(batch.bid).success


def test_a_call_that_fails_is_raised_and_the_settle_can_be_made_again(redis) -> None:
    broken = LuaScript("limitd.batch", "batch_remove.lua")  # HINCRBY on "x" fails
    redis.set("not-a-hash", "x")
    fetch = limit_fetch(redis, QueueOrder(["default"]), "cap-1")
    work.perform_async(1)
    [unit] = fetch.take(1, [])
    unit.defer([broken.later(["not-a-hash", "p", "u", "f"], ["jid"])])
    with pytest.raises(redis_py.ResponseError, match="not an integer"):
        fetch.take(0, [unit])
    assert redis.hget(keys.of(redis).BUSY, "default") == b"0"  # the settle itself went through


def test_with_basic_fetch_the_calls_are_made_at_once(redis) -> None:
    capsule = Capsule(CapsuleConfig(queues=["default"], fetch="basic"), redis=redis)
    job = limitd.job(name="calls_test.Unique", unique_for=60)(lambda n: None)
    job.perform_async(1)
    lock = keys.of(redis).unique_lock("calls_test.Unique", "default", unique.args_digest([1]))
    assert redis.exists(lock)
    assert capsule.drain() == {"done": 1}
    assert not redis.exists(lock)
    assert redis.get(keys.of(redis).UNIQUE_SKIPPED) is None
