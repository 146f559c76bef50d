"""Whom a crash is charged to (``limitd/fetch/recoveries.py``): the scripts and the
executor on real Redis, one rule per test. The same rules under ``limitd start`` with
real SIGKILLs are in ``test_poison_processes.py``."""

from __future__ import annotations

import json
import time

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.fetch import liveness, recoveries
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.fetch.limit_unit import LimitUnitOfWork
from limitd.payload import new_jid
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for

ran: list[str] = []


@limitd.job(name="suspects_test.Note")
def note(tag: str) -> None:
    ran.append(tag)


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


def job(tag: str) -> bytes:
    return json.dumps({"class": "suspects_test.Note", "args": [tag], "jid": new_jid()}).encode()


def enqueue(redis: redis_py.Redis, *jobs: bytes) -> None:
    """Oldest first: the first job given is the first fetched."""
    redis.sadd(keys.of(redis).QUEUES, "default")
    redis.lpush(keys.of(redis).queue("default"), *jobs)


def charges(redis: redis_py.Redis, payload: bytes) -> tuple[int, int]:
    """(crashes, crashes alone) charged to a job."""
    field = recoveries.job_id(payload)
    found = redis.hmget(keys.of(redis).recoveries_of("default"), field, field + ":alone")
    return int(found[0] or 0), int(found[1] or 0)


def suspect(redis: redis_py.Redis, payload: bytes, crashes: int = 1, alone: int = 0) -> None:
    field = recoveries.job_id(payload)
    redis.hset(
        keys.of(redis).recoveries_of("default"), mapping={field: crashes, field + ":alone": alone}
    )


def held_by(redis: redis_py.Redis, capsule: str) -> bytes | None:
    return redis.hget(keys.of(redis).recoveries_of("default"), "held:" + capsule)


def fetch_for(redis: redis_py.Redis, capsule: str) -> LimitFetch:
    return limit_fetch(redis, QueueOrder(["default"]), capsule)


def take(fetch: LimitFetch, want: int, done: list[LimitUnitOfWork] | None = None) -> list[bytes]:
    return [unit.job for unit in fetch.take(want, done or [])]


def crash(redis: redis_py.Redis, capsule: str, *, blame: bool = True) -> int:
    redis.delete(keys.of(redis).capsule_heartbeat(capsule))
    return liveness.reap(redis, capsule, f"{capsule} crashed", blame=blame)


def queued(redis: redis_py.Redis) -> list[bytes]:
    """The queue, next job first."""
    return redis.lrange(keys.of(redis).queue("default"), 0, -1)[::-1]


def test_a_crash_makes_every_job_the_process_held_a_suspect_with_one_shared_crash(
    redis: redis_py.Redis,
) -> None:
    jobs = [job(tag) for tag in "abc"]
    enqueue(redis, *jobs)
    assert take(fetch_for(redis, "dead"), 3) == jobs
    assert crash(redis, "dead") == 3
    assert [charges(redis, payload) for payload in jobs] == [(1, 0)] * 3
    assert queued(redis) == jobs, "back at the front, in their order"


def test_a_capsule_holds_one_suspect_and_passes_the_others_to_the_back(
    redis: redis_py.Redis,
) -> None:
    first, second, plain_a, plain_b = job("s1"), job("s2"), job("a"), job("b")
    enqueue(redis, first, second, plain_a, plain_b)
    suspect(redis, first)
    suspect(redis, second)
    fetch = fetch_for(redis, "c1")
    assert take(fetch, 3) == [first, plain_a, plain_b], "the second suspect is passed over"
    assert held_by(redis, "c1") == recoveries.job_id(first).encode()
    assert queued(redis) == [second], "at the back of the queue, not lost"
    assert take(fetch_for(redis, "c2"), 1) == [second], "another capsule may take it"


def test_settling_the_held_suspect_lets_the_capsule_take_another(redis: redis_py.Redis) -> None:
    first, second = job("s1"), job("s2")
    enqueue(redis, first, second)
    suspect(redis, first)
    suspect(redis, second)
    fetch = fetch_for(redis, "c1")
    [unit] = fetch.take(2, [])
    assert unit.job == first and unit.recoveries == 1
    assert [u.job for u in fetch.take(1, [unit])] == [second]
    assert held_by(redis, "c1") == recoveries.job_id(second).encode()


def test_passing_over_suspects_never_takes_one_twice_in_a_call(redis: redis_py.Redis) -> None:
    """A queue of nothing but suspects, and a capsule that holds one: each is looked at
    once, the call ends, and the queue keeps them all."""
    held, *others = [job(str(n)) for n in range(5)]
    enqueue(redis, held, *others)
    for payload in (held, *others):
        suspect(redis, payload)
    fetch = fetch_for(redis, "c1")
    assert take(fetch, 1) == [held]
    assert take(fetch, 10) == []
    assert sorted(queued(redis)) == sorted(others)
    assert int(redis.hget(keys.of(redis).busy_of("default"), "default") or 0) == 1


def test_a_crash_while_a_suspect_runs_is_charged_to_it_alone(redis: redis_py.Redis) -> None:
    guilty, bystander = job("guilty"), job("bystander")
    enqueue(redis, guilty, bystander)
    suspect(redis, guilty)
    units = fetch_for(redis, "c1").take(2, [])
    assert [u.job for u in units] == [guilty, bystander]
    units[0].suspect_started()
    enqueue(redis, later := job("later"))
    crash(redis, "c1")
    assert charges(redis, guilty) == (2, 1)
    assert charges(redis, bystander) == (1, 0)
    assert held_by(redis, "c1") is None, "the dead capsule's hold is gone"
    assert queued(redis) == [bystander, later, guilty], "the culprit waits at the back"


def test_a_suspect_held_but_not_started_is_not_charged(redis: redis_py.Redis) -> None:
    waiting, other = job("waiting"), job("other")
    enqueue(redis, waiting, other)
    suspect(redis, waiting)
    assert take(fetch_for(redis, "c1"), 2) == [waiting, other]
    crash(redis, "c1")
    assert charges(redis, waiting) == (1, 0), "it never ran: the crash is not its doing"
    assert charges(redis, other) == (1, 0)


def test_a_process_stopped_on_purpose_charges_nothing(redis: redis_py.Redis) -> None:
    plain, held = job("plain"), job("held")
    enqueue(redis, held, plain)
    suspect(redis, held)
    units = fetch_for(redis, "c1").take(2, [])
    units[0].suspect_started()
    assert crash(redis, "c1", blame=False) == 2
    assert charges(redis, plain) == (0, 0)
    assert charges(redis, held) == (1, 0), "what it had before stays, nothing is added"


def test_a_suspect_that_completes_is_cleared_and_frees_the_hold(redis: redis_py.Redis) -> None:
    payload = job("again")
    enqueue(redis, payload)
    suspect(redis, payload, crashes=2, alone=1)
    capsule = Capsule(CapsuleConfig(capsule_id="c1"), redis=redis)
    assert capsule.drain() == {"done": 1}
    assert ran == ["again"]
    assert charges(redis, payload) == (0, 0)
    assert not redis.exists(keys.of(redis).recoveries_of("default")), "nothing left behind"


@pytest.mark.parametrize(
    ("max_recoveries", "crashes", "alone", "outcome"),
    [
        (3, 3, 2, "dead"),
        (3, 2, 1, "done"),
        (1, 1, 0, "done"),  # one shared crash never buries, whatever the setting
        (1, 2, 1, "dead"),
    ],
)
def test_a_job_is_buried_at_max_recoveries_with_a_crash_charged_to_it_alone(
    redis: redis_py.Redis, max_recoveries: int, crashes: int, alone: int, outcome: str
) -> None:
    payload = job("x")
    enqueue(redis, payload)
    suspect(redis, payload, crashes, alone)
    capsule = Capsule(CapsuleConfig(max_recoveries=max_recoveries), redis=redis)
    assert capsule.drain() == {outcome: 1}
    if outcome == "dead":
        [entry] = [json.loads(raw) for raw in redis.zrange(keys.of(redis).DEAD, 0, -1)]
        assert entry["error_class"] == "limitd.RecoveredTooOften"
        assert entry["error_message"].startswith(f"recovered {crashes} times")
    assert not redis.exists(keys.of(redis).recoveries_of("default"))


def test_a_job_given_back_is_charged_alone(redis: redis_py.Redis) -> None:
    """Its own run could not be recorded: nobody else is involved."""
    payload = job("unrecordable")
    enqueue(redis, payload)
    [unit] = fetch_for(redis, "c1").take(1, [])
    unit.fetch.requeue(unit, reason="RuntimeError: bookkeeping is broken")
    assert charges(redis, payload) == (1, 1)


seen_running: list[bytes | None] = []


def _record_the_mark(capsule_id: str) -> None:
    field = "running:" + capsule_id
    redis = limitd.default_client().redis
    seen_running.append(redis.hget(keys.of(redis).recoveries_of("default"), field))


@limitd.job(name="suspects_test.SeesItsMark")
def sees_its_mark(capsule_id: str) -> None:
    _record_the_mark(capsule_id)


@limitd.job(name="suspects_test.SeesItsMarkAsync")
async def sees_its_mark_async(capsule_id: str) -> None:
    _record_the_mark(capsule_id)


@pytest.mark.parametrize("klass", ["suspects_test.SeesItsMark", "suspects_test.SeesItsMarkAsync"])
def test_a_suspect_is_marked_running_before_its_code_runs(
    redis: redis_py.Redis, klass: str
) -> None:
    """On a processor thread and on the event loop alike: a crash from the job's first
    line on is charged to it."""
    seen_running.clear()
    payload = json.dumps({"class": klass, "args": ["marks"], "jid": new_jid()}).encode()
    suspect(redis, payload)
    enqueue(redis, payload)
    capsule = Capsule(CapsuleConfig(capsule_id="marks", concurrency=1), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: seen_running, message="the suspect to run")
        wait_for(
            lambda: not redis.exists(keys.of(redis).recoveries_of("default")), message="cleared"
        )
    finally:
        capsule.stop(timeout=2)
    assert seen_running == [recoveries.job_id(payload).encode()]


def test_a_malformed_suspect_is_buried_and_its_charges_forgotten(redis: redis_py.Redis) -> None:
    """A suspect whose payload cannot be decoded is buried as malformed: nothing of it
    stays behind, and the capsule is free to take the next suspect."""
    broken, nxt = b'{"class": "suspects_test.Note", "args": [', job("next")
    enqueue(redis, broken, nxt)
    suspect(redis, broken)
    suspect(redis, nxt)
    capsule = Capsule(CapsuleConfig(capsule_id="c1"), redis=redis)
    assert capsule.drain() == {"dead": 1, "done": 1}
    assert ran == ["next"]
    assert not redis.exists(keys.of(redis).recoveries_of("default"))


def test_releasing_the_hold_wakes_the_capsules_up(redis: redis_py.Redis) -> None:
    """The suspects a capsule passed over may be taken once its own suspect is over: a
    wake-up says so, or threads parked by the fetch that passed over them would sleep
    until their next poll."""
    first, second = job("s1"), job("s2")
    enqueue(redis, first, second)
    suspect(redis, first)
    suspect(redis, second)
    [unit] = fetch_for(redis, "c1").take(2, [])
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.WAKE_CHANNEL)
    wait_for(lambda: redis.pubsub_numsub(keys.WAKE_CHANNEL)[0][1] >= 1, message="subscribed")
    unit.forget_recoveries()
    message = None
    deadline = time.monotonic() + 5
    while message is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
    pubsub.close()
    assert message is not None and message["data"] == b"default"
    assert held_by(redis, "c1") is None
