"""How long a batch's data stays in Redis: ``expires_in`` after the last change to it.

Redis keeps the clock for key lifetimes, so these tests read TTLs: a test shortens a
batch's keys by hand, as if time had passed, then checks that a change (jobs added, a
run recorded, a child finishing) gives every key the batch's full lifetime again."""

from __future__ import annotations

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.batch import store
from limitd.supervisor import Capsule, CapsuleConfig
from tests.test_batch import callback, doomed, fail_first_run, work

DAYS_2 = 2 * 86_400
AGED = 100  # seconds left on a key, as if the batch had sat still for most of its life


def ttls(redis: redis_py.Redis, bid: str) -> list[int]:
    """Seconds left on the batch's meta, pending, unfinished and failures keys (-2: the
    key does not exist, -1: it would live for ever)."""
    return [int(redis.ttl(key)) for key in keys.of(redis).batch_keys(bid)]


def age(redis: redis_py.Redis, bid: str) -> None:
    for key in keys.of(redis).batch_keys(bid):
        redis.expire(key, AGED)


def fresh(ttl: int) -> bool:
    return DAYS_2 - 5 <= ttl <= DAYS_2


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Capsule:
    fail_first_run.clear()
    return Capsule(CapsuleConfig(queues=["default"]), redis=redis)


def test_a_new_batch_lives_expires_in_from_its_creation(redis) -> None:
    batch = limitd.Batch("two days", expires_in=DAYS_2)
    with batch.jobs():
        work.perform_bulk([[1], [2]])
    meta, pending, unfinished, failures = ttls(redis, batch.bid)
    assert all(fresh(ttl) for ttl in (meta, pending, unfinished))
    assert failures == -2  # no failure yet


def test_a_recorded_run_restarts_every_keys_lifetime(capsule: Capsule, redis) -> None:
    fail_first_run.add(2)
    batch = limitd.Batch(expires_in=DAYS_2)
    with batch.jobs():
        work.perform_bulk([[1], [2]])
        work.set(queue="elsewhere").perform_async(3)  # keeps the batch from completing
    age(redis, batch.bid)
    assert capsule.drain() == {"done": 1, "retry": 1}
    assert not limitd.Batch.status(batch.bid).complete
    # The failure created the failures hash: it lives exactly as long as the rest.
    assert all(fresh(ttl) for ttl in ttls(redis, batch.bid)), ttls(redis, batch.bid)


def test_the_first_failure_gives_the_failures_hash_the_batchs_lifetime(
    capsule: Capsule, redis
) -> None:
    fail_first_run.add(1)
    batch = limitd.Batch(expires_in=DAYS_2)
    with batch.jobs():
        work.perform_async(1)
        work.set(queue="elsewhere").perform_async(2)
    assert capsule.drain() == {"retry": 1}
    assert fresh(ttls(redis, batch.bid)[3])


def test_a_lifetime_is_renewed_once_it_has_run_down_by_an_hour(redis) -> None:
    # Recording runs happens with every job, so it renews lazily: one TTL read per call.
    batch = limitd.Batch(expires_in=DAYS_2)
    with batch.jobs():
        jids = work.perform_bulk([[1], [2], [3]])
    for key in keys.of(redis).batch_keys(batch.bid):
        redis.expire(key, DAYS_2 - 600)  # ten minutes old
    store.job_settled(redis, batch.bid, jids[0], "success")
    assert DAYS_2 - 605 <= ttls(redis, batch.bid)[0] <= DAYS_2 - 600
    for key in keys.of(redis).batch_keys(batch.bid):
        redis.expire(key, DAYS_2 - 3_700)  # over an hour old
    store.job_settled(redis, batch.bid, jids[1], "success")
    assert fresh(ttls(redis, batch.bid)[0])


def test_adding_jobs_restarts_its_lifetime(redis) -> None:
    batch = limitd.Batch(expires_in=DAYS_2)
    with batch.jobs():
        work.perform_async(1)
    age(redis, batch.bid)
    with limitd.Batch.open(batch.bid).jobs():
        work.perform_async(2)
    assert all(fresh(ttl) for ttl in ttls(redis, batch.bid)[:3])


def test_a_batch_whose_builder_was_killed_still_expires(redis) -> None:
    # A process killed inside jobs(): the block never closes, so the batch never fires;
    # it must not stay in Redis for ever.
    new = store.NewBatch("abandoned", "killed while adding", expires_in=DAYS_2)
    store.open_batch(redis, new.bid, new)
    store.add_jobs(redis, new.bid, ["jid-1", "jid-2"])
    store.job_settled(redis, new.bid, "jid-1", "success")
    assert limitd.Batch.status(new.bid).building == 1
    assert all(fresh(ttl) for ttl in ttls(redis, new.bid)[:3])


def test_completion_restarts_it_and_a_dead_job_retried_later_still_counts(
    capsule: Capsule, redis
) -> None:
    batch = limitd.Batch(expires_in=DAYS_2).on("success", callback)
    with batch.jobs():
        doomed.perform_async(1)
    age(redis, batch.bid)
    assert capsule.drain() == {"dead": 1}
    assert limitd.Batch.status(batch.bid).complete
    assert all(fresh(ttl) for ttl in ttls(redis, batch.bid)[:2])
    [dead_jid] = limitd.Batch.status(batch.bid).failures
    age(redis, batch.bid)
    # Within its lifetime, an operator fixes the cause and the job succeeds.
    assert store.job_settled(redis, batch.bid, dead_jid, "success") == 1
    assert limitd.Batch.status(batch.bid).success
    assert fresh(ttls(redis, batch.bid)[0])


def test_a_child_finishing_restarts_its_parents_lifetime(redis) -> None:
    parent = limitd.Batch("parent", expires_in=DAYS_2)
    with parent.jobs():
        work.set(queue="parent").perform_async(1)
        with limitd.Batch("child", expires_in=DAYS_2).jobs():
            work.set(queue="child").perform_async(2)
    age(redis, parent.bid)
    Capsule(CapsuleConfig(queues=["child"]), redis=redis).drain()
    parent_ttls = ttls(redis, parent.bid)
    assert fresh(parent_ttls[0]) and fresh(parent_ttls[1]), parent_ttls


def test_a_childs_creation_gives_its_parents_refilled_sets_a_lifetime(
    capsule: Capsule, redis
) -> None:
    parent = limitd.Batch("parent", expires_in=DAYS_2)
    with parent.jobs():
        work.perform_async(1)
        capsule.drain()  # the parent's sets are empty, so Redis has deleted them
        assert ttls(redis, parent.bid)[1:3] == [-2, -2]
        with limitd.Batch("child").jobs():
            # The child's creation put it in those sets again, creating them anew.
            assert all(fresh(ttl) for ttl in ttls(redis, parent.bid)[:3])
            work.perform_async(2)


def test_a_lifetime_under_a_second_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one second"):
        limitd.Batch(expires_in=0.5)
