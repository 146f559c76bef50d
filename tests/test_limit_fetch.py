"""The limit fetch's Lua scripts, hit directly through real Redis: limits, pause,
blocking, order, release and its fencing, and reaping (including racing reapers)."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter

import pytest
import redis as redis_py
from freezegun import freeze_time

from limitd import keys
from limitd.fetch import liveness
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import FORGET_DRAINED, ORPHAN_SECONDS, LimitFetch
from limitd.queues import limits as queue_limits
from limitd.queues.limits import LimitSettings
from limitd.queues.order import QueueOrder

START = "2026-11-28 09:00:00"


def take_one(fetch, done=None, **options):  # type: ignore[no-untyped-def]
    """One job (settling ``done`` in the same call), or None."""
    units = fetch.take(1, [done] if done is not None else [], **options)
    return units[0] if units else None


def push(redis: redis_py.Redis, queue: str, count: int, tag: str = "") -> list[bytes]:
    jobs = [
        json.dumps({"class": "X", "args": [f"{tag}{i}"], "queue": queue}).encode()
        for i in range(count)
    ]
    redis.lpush(keys.of(redis).queue(queue), *jobs)
    return jobs


def fetcher(redis: redis_py.Redis, queues: list, capsule: str = "c1", **options) -> LimitFetch:
    return limit_fetch(redis, QueueOrder(queues), capsule, **options)


def take_all(fetch: LimitFetch) -> list:
    taken = []
    while (unit := take_one(fetch)) is not None:
        taken.append(unit)
    return taken


def take_settling(fetch: LimitFetch) -> list:
    """Take jobs one by one, each acknowledged with the fetch of the next."""
    taken, done = [], None
    while (unit := take_one(fetch, done)) is not None:
        taken.append(unit)
        done = unit
    return taken


def test_unlimited_queue_behaves_like_a_normal_queue(redis: redis_py.Redis) -> None:
    jobs = push(redis, "q", 3)
    units = take_all(fetcher(redis, ["q"]))
    assert [u.job for u in units] == jobs  # FIFO
    assert queue_limits.busy(redis, "q") == 3
    assert redis.lrange(keys.of(redis).in_progress("c1", "q"), 0, -1) == jobs[::-1]


@pytest.mark.standalone_only("reads the shared capsules set")
def test_global_limit_counts_every_capsule(redis: redis_py.Redis) -> None:
    push(redis, "q", 10)
    queue_limits.set_limit(redis, "q", 3)
    first = take_all(fetcher(redis, ["q"], "c1"))
    second = take_all(fetcher(redis, ["q"], "c2"))
    assert (len(first), len(second)) == (3, 0)
    first[0].fetch.settle([first[0]])
    assert len(take_all(fetcher(redis, ["q"], "c2"))) == 1
    assert queue_limits.busy(redis, "q") == 3
    assert queue_limits.busy_by_capsule(redis, "q") == {"c1": 2, "c2": 1}
    assert redis.smembers(keys.of(redis).CAPSULES) == {b"c1", b"c2"}, (
        "a fetch registers its capsule"
    )


def test_limit_zero_takes_nothing(redis: redis_py.Redis) -> None:
    push(redis, "q", 2)
    queue_limits.set_limit(redis, "q", 0)
    assert take_all(fetcher(redis, ["q"])) == []
    assert redis.llen(keys.of(redis).queue("q")) == 2


def test_process_limit_is_per_capsule(redis: redis_py.Redis) -> None:
    push(redis, "q", 10)
    queue_limits.set_limit(redis, "q", 2, process=True)
    assert len(take_all(fetcher(redis, ["q"], "c1"))) == 2
    assert len(take_all(fetcher(redis, ["q"], "c2"))) == 2
    assert queue_limits.busy(redis, "q") == 4


def test_both_limits_hold(redis: redis_py.Redis) -> None:
    push(redis, "q", 10)
    queue_limits.set_limit(redis, "q", 3)
    queue_limits.set_limit(redis, "q", 2, process=True)
    counts = [len(take_all(fetcher(redis, ["q"], c))) for c in ("c1", "c2", "c3")]
    assert counts == [2, 1, 0]


@pytest.mark.parametrize("ready_index", [False, True])
def test_one_call_takes_no_more_than_either_limit_allows(
    redis: redis_py.Redis, ready_index: bool
) -> None:
    """A call that wants more jobs than a queue has room for takes up to its room and
    goes on to the next queue: the global limit (3, one job already running elsewhere)
    and the per-process limit (2) each hold within one call, not only across calls."""
    push(redis, "q", 10)
    push(redis, "next", 10)
    queue_limits.set_limit(redis, "q", 3)
    other = fetcher(redis, ["q"], "c0", ready_index=ready_index)
    assert len(other.take(1)) == 1
    fetch = fetcher(redis, ["q", "next"], ready_index=ready_index)
    assert Counter(u.queue for u in fetch.take(10)) == {"q": 2, "next": 8}
    queue_limits.set_limit(redis, "next", 1, process=True)
    queue_limits.set_limit(redis, "q", 10)
    again = fetcher(redis, ["q", "next"], "c2", ready_index=ready_index)
    assert Counter(u.queue for u in again.take(10)) == {"q": 7, "next": 1}
    k = keys.of(redis)
    assert [int(redis.hget(k.busy_of(name), name) or 0) for name in ("q", "next")] == [10, 9]


def test_pause_skips_the_queue_and_keeps_its_limit(redis: redis_py.Redis) -> None:
    push(redis, "q", 5)
    queue_limits.set_limit(redis, "q", 2)
    queue_limits.pause(redis, "q")
    assert take_all(fetcher(redis, ["q"])) == []
    queue_limits.resume(redis, "q")
    assert queue_limits.get_limit(redis, "q") == 2
    assert len(take_all(fetcher(redis, ["q"]))) == 2


def test_strict_order_skips_a_queue_at_its_limit(redis: redis_py.Redis) -> None:
    push(redis, "high", 5)
    push(redis, "low", 5)
    queue_limits.set_limit(redis, "high", 2)
    taken = [u.queue for u in take_all(fetcher(redis, ["high", "low"]))]
    assert taken == ["high", "high", "low", "low", "low", "low", "low"]


def test_blocking_queue_holds_back_lower_queues(redis: redis_py.Redis) -> None:
    push(redis, "high", 5)
    push(redis, "low", 5)
    queue_limits.set_limit(redis, "high", 2)
    fetch = fetcher(redis, ["high", "low"], blocking=["high"])
    assert [u.queue for u in take_all(fetch)] == ["high", "high"]
    redis.delete(keys.of(redis).queue("high"))  # no job waiting: it no longer blocks
    assert {u.queue for u in take_all(fetch)} == {"low"}


@pytest.mark.parametrize("ready_index", [False, True])
def test_only_the_blocking_queues_block_wherever_they_are_listed(
    redis: redis_py.Redis, ready_index: bool
) -> None:
    """The call names its blocking queues by their number among the queues it gives:
    a full queue before the blocking one and one after it do not block, the third and
    fourth queues (the blocking one first) hold back the fifth."""
    names = ["full", "second", "blocks", "also", "last"]
    for name in names:
        push(redis, name, 3)
    for name in ("full", "blocks", "also"):
        queue_limits.set_limit(redis, name, 1)
    redis.delete(keys.of(redis).queue("second"))
    fetch = fetcher(redis, names, blocking=["blocks", "also"], ready_index=ready_index)
    assert sorted(u.queue for u in take_all(fetch)) == ["blocks", "full"]
    redis.delete(keys.of(redis).queue("blocks"))  # nothing waits there: "also" blocks now
    assert [u.queue for u in take_all(fetch)] == ["also"]
    redis.delete(keys.of(redis).queue("also"))
    assert {u.queue for u in take_all(fetch)} == {"last"}


def test_weighted_order_still_holds_with_a_limited_queue(redis: redis_py.Redis) -> None:
    """With 'limited' always at its limit, the other two keep their 4:1 ratio."""
    push(redis, "limited", 50)
    push(redis, "a", 1500)
    push(redis, "b", 1500)
    queue_limits.set_limit(redis, "limited", 0)
    order = QueueOrder([["limited", 10], ["a", 4], ["b", 1]], rng=random.Random(5))
    fetch = limit_fetch(redis, order, "c1")
    seen = Counter(take_one(fetch).queue for _ in range(1000))  # type: ignore[union-attr]
    assert seen["limited"] == 0
    share = seen["a"] / 1000
    assert abs(share - 0.8) < 4 * (0.8 * 0.2 / 1000) ** 0.5, seen


def test_dynamic_fetch_takes_queues_it_was_not_configured_for(redis: redis_py.Redis) -> None:
    push(redis, "configured", 1)
    push(redis, "discovered", 2)
    redis.sadd(keys.of(redis).QUEUES, "configured", "discovered")
    queue_limits.set_limit(redis, "discovered", 1)
    assert [u.queue for u in take_all(fetcher(redis, ["configured"]))] == ["configured"]
    taken = take_all(fetcher(redis, ["configured"], "c2", dynamic=True))
    assert [u.queue for u in taken] == ["discovered"]


def test_requeue_frees_the_slot_and_puts_the_job_first(redis: redis_py.Redis) -> None:
    jobs = push(redis, "q", 3)
    queue_limits.set_limit(redis, "q", 1)
    fetch = fetcher(redis, ["q"])
    unit = take_one(fetch)
    assert unit is not None
    assert take_one(fetch) is None
    fetch.requeue(unit)
    assert queue_limits.busy(redis, "q") == 0
    assert redis.lindex(keys.of(redis).queue("q"), -1) == jobs[0]
    again = take_one(fetch)
    assert again is not None
    assert again.job == jobs[0]


def test_one_call_settles_jobs_of_several_queues_given_interleaved(
    redis: redis_py.Redis,
) -> None:
    """The call passes each queue's jobs together: jobs of two queues requeued in one
    call, interleaved, come back first in line in the order given, each queue's in its
    own list; acknowledged the same way, each queue's slots are all freed."""
    a_jobs, b_jobs = push(redis, "a", 3), push(redis, "b", 3)
    for name in ("a", "b"):
        queue_limits.set_limit(redis, name, 10)
    fetch = fetcher(redis, [["a", 1], ["b", 1]])
    held = fetch.take(6)
    assert Counter(u.queue for u in held) == {"a": 3, "b": 3}
    a_held, b_held = [u for u in held if u.queue == "a"], [u for u in held if u.queue == "b"]
    mixed = [a_held[2], b_held[1], a_held[0], b_held[2], a_held[1], b_held[0]]
    assert fetch.requeue(mixed) == 6
    k = keys.of(redis)
    # The first given is first in line again (the right end), each queue apart.
    assert redis.lrange(k.queue("a"), 0, -1) == [a_held[1].job, a_held[0].job, a_held[2].job]
    assert redis.lrange(k.queue("b"), 0, -1) == [b_held[0].job, b_held[2].job, b_held[1].job]
    assert sorted(a_jobs) == sorted(u.job for u in a_held)
    assert sorted(b_jobs) == sorted(u.job for u in b_held)
    again = fetch.take(6)
    assert [queue_limits.busy(redis, name) for name in ("a", "b")] == [3, 3]
    interleaved = sorted(again, key=lambda u: (again.index(u) % 2, u.queue))
    assert fetch.settle(interleaved) == 6
    assert [queue_limits.busy(redis, name) for name in ("a", "b")] == [0, 0]
    assert not redis.exists(k.in_progress("c1", "a"), k.in_progress("c1", "b"))


def test_release_is_fenced_by_ownership(redis: redis_py.Redis) -> None:
    """A capsule reaped while stalled acks late: its ack frees nothing it no longer
    holds, and its requeue pushes no duplicate."""
    push(redis, "q", 2)
    queue_limits.set_limit(redis, "q", 1)
    stalled = fetcher(redis, ["q"], "stalled")
    held = take_one(stalled)
    assert held is not None
    liveness.vouch(redis, ["stalled"], 15)
    redis.delete(keys.of(redis).capsule_heartbeat("stalled"))  # its heartbeat expired
    assert liveness.reap_dead(redis) == {"stalled": 1}
    other = fetcher(redis, ["q"], "other")
    taken = take_one(other)
    assert taken is not None
    assert taken.job == held.job  # the reaped job runs next
    assert queue_limits.busy(redis, "q") == 1
    assert stalled.settle([held]) == 0
    assert stalled.requeue(held) == 0
    assert queue_limits.busy(redis, "q") == 1
    assert redis.llen(keys.of(redis).queue("q")) == 1
    assert other.settle([taken]) == 1
    assert queue_limits.busy(redis, "q") == 0


@pytest.mark.standalone_only("writes the shared busy hash")
def test_busy_never_goes_negative(redis: redis_py.Redis) -> None:
    push(redis, "q", 1)
    fetch = fetcher(redis, ["q"])
    unit = take_one(fetch)
    assert unit is not None
    redis.hset(keys.of(redis).BUSY, "q", 0)  # e.g. counts lost while the job ran
    assert fetch.settle([unit]) == 1
    assert queue_limits.busy(redis, "q") == 0


def test_reaping_returns_jobs_in_their_original_order(redis: redis_py.Redis) -> None:
    jobs = push(redis, "q", 5)
    fetch = fetcher(redis, ["q"], "dead")
    assert len(take_all(fetch)) == 5
    liveness.vouch(redis, ["dead"], 15)
    assert liveness.reap(redis, "dead") == liveness.STILL_ALIVE
    redis.delete(keys.of(redis).capsule_heartbeat("dead"))
    assert liveness.reap_dead(redis) == {"dead": 5}
    # Reaped jobs are suspects: a capsule holds one at a time, finishing each first.
    assert [u.job for u in take_settling(fetcher(redis, ["q"], "new"))] == jobs
    assert redis.sismember(keys.of(redis).CAPSULES, "dead") == 0
    assert not redis.exists(keys.of(redis).capsule_queues("dead", "q"))


@pytest.mark.standalone_only("threads share one connection pool")
def test_racing_reapers_requeue_each_job_once(redis: redis_py.Redis) -> None:
    for capsule in ("d1", "d2", "d3"):
        push(redis, "q", 40, tag=capsule)
        assert len(take_all(fetcher(redis, ["q"], capsule))) == 40
    redis.sadd(keys.of(redis).CAPSULES, "d1", "d2", "d3")
    results: list[dict[str, int]] = []
    clients = [redis_py.Redis(connection_pool=redis.connection_pool) for _ in range(6)]
    threads = [
        threading.Thread(target=lambda c=c: results.append(liveness.reap_dead(c))) for c in clients
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(sum(r.values()) for r in results) == 120
    requeued = redis.lrange(keys.of(redis).queue("q"), 0, -1)
    assert len(requeued) == len(set(requeued)) == 120
    assert queue_limits.busy(redis, "q") == 0


@pytest.mark.standalone_only("the capsule's queue set spans queues standalone only")
def test_reap_retries_when_the_capsule_took_a_new_queue(redis: redis_py.Redis) -> None:
    push(redis, "a", 1)
    push(redis, "b", 1)
    assert len(take_all(fetcher(redis, ["a", "b"], "gone"))) == 2
    script_keys = [
        keys.of(redis).capsule_heartbeat("gone"),
        keys.of(redis).CAPSULES,
        keys.of(redis).BUSY,
        keys.of(redis).capsule_queues("gone"),
        keys.of(redis).queue("a"),
        keys.of(redis).in_progress("gone", "a"),
    ]
    stale = liveness.REAP_CAPSULE(redis, script_keys, ["gone", "a", keys.WAKE_CHANNEL])
    assert stale == liveness.QUEUES_CHANGED
    assert liveness.reap(redis, "gone") == 2


def test_configured_limits_never_overwrite_runtime_changes(redis: redis_py.Redis) -> None:
    settings = LimitSettings(limits={"q": 5, "r": 2}, process_limits={"q": 1})
    settings.apply_defaults(redis)
    assert queue_limits.get_limit(redis, "q") == 5
    queue_limits.set_limit(redis, "q", 9)
    queue_limits.clear_limit(redis, "r")
    settings.apply_defaults(redis)
    assert queue_limits.get_limit(redis, "q") == 9
    assert queue_limits.get_limit(redis, "r") is None
    queue_limits.reset_limit(redis, "r")
    settings.apply_defaults(redis)
    assert queue_limits.get_limit(redis, "r") == 2
    assert queue_limits.get_limit(redis, "q", process=True) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_bad_limits_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"limits\.q"):
        LimitSettings(limits={"q": bad})  # type: ignore[dict-item]


def test_fetch_cost_does_not_depend_on_jobs_in_progress(redis: redis_py.Redis) -> None:
    """The fetch script reads counters, never a list: with 2,000 jobs in progress it runs
    the same commands as with none (counted by INFO commandstats)."""

    def commands_for_one_fetch() -> Counter[str]:
        before = redis.info("commandstats")
        assert take_one(fetch) is not None
        after = redis.info("commandstats")
        calls = {k: after[k]["calls"] - before.get(k, {"calls": 0})["calls"] for k in after}
        return Counter({k: n for k, n in calls.items() if n > 0 and k != "cmdstat_info"})

    push(redis, "q", 2500)
    queue_limits.set_limit(redis, "q", 10_000)
    queue_limits.set_limit(redis, "q", 10_000, process=True)
    fetch = fetcher(redis, ["q"])
    take_one(fetch)  # the first call also adds the queue to the fetch's ready index
    empty = commands_for_one_fetch()
    for _ in range(2000):
        take_one(fetch)
    assert commands_for_one_fetch() == empty
    assert "cmdstat_lrange" not in empty
    assert "cmdstat_lpos" not in empty


def test_jobs_fetched_but_never_received_are_recovered(redis: redis_py.Redis) -> None:
    """A fetch whose reply was lost leaves a job in progress that no thread runs: it is
    requeued once it has been unclaimed on two heartbeats, and a held job never is."""
    jobs = push(redis, "q", 2)
    with freeze_time(START) as frozen:
        fetch = fetcher(redis, ["q"])
        held = take_one(fetch)
        lost = take_one(fetch)  # pretend this reply never arrived
        assert held is not None
        assert lost is not None
        frozen.tick(ORPHAN_SECONDS)
        assert fetch.recover_orphans([held]) == 0, "first sighting: maybe a fetch in flight"
        frozen.tick(ORPHAN_SECONDS)
        assert fetch.recover_orphans([held]) == 1
        assert redis.lrange(keys.of(redis).queue("q"), 0, -1) == [jobs[1]]
        assert queue_limits.busy(redis, "q") == 1
        for _ in range(2):
            frozen.tick(ORPHAN_SECONDS)
            assert fetch.recover_orphans([held]) == 0
    assert redis.lrange(keys.of(redis).in_progress("c1", "q"), 0, -1) == [jobs[0]]


def test_an_early_beat_requeues_nothing_a_settlement_in_flight_holds(
    redis: redis_py.Redis,
) -> None:
    """A capsule told to quiet beats at once, milliseconds after its last beat: a job
    whose settlement was in flight at both (finished, no thread holds it, still in the
    in-progress list) is not taken for an orphan; only the same sighting seconds apart
    would be."""
    push(redis, "q", 1)
    with freeze_time(START) as frozen:
        fetch = fetcher(redis, ["q"])
        assert take_one(fetch) is not None  # finished; its settlement not yet run
        frozen.tick(ORPHAN_SECONDS)
        assert fetch.recover_orphans([]) == 0  # the regular beat: a first sighting
        frozen.tick(0.005)
        assert fetch.recover_orphans([]) == 0  # the early beat: too soon to tell
        frozen.tick(ORPHAN_SECONDS)
        assert fetch.recover_orphans([]) == 1  # still there seconds later: an orphan


def test_the_orphan_scan_forgets_the_queues_a_capsule_drained(redis: redis_py.Redis) -> None:
    """The set of queues a capsule holds jobs from keeps those it runs jobs of: a beat
    takes out the queues whose in-progress list is empty, so that over thousands of
    queues the next scan reads a few lists, not every queue the capsule ever took from.
    A queue taken from again is back in the set, and the reaper still finds its job."""
    k = keys.of(redis)
    if k.cluster:
        pytest.skip("in a cluster each queue has its own set, holding that queue at most")
    names = [f"q{i:02d}" for i in range(50)]
    for name in names:
        push(redis, name, 2)
    fetch = fetcher(redis, names)
    assert len(take_settling(fetch)) == 100  # each settled with the next call
    held = k.capsule_queues("c1")
    assert redis.scard(held) == 50
    push(redis, "q49", 1, tag="running")
    running = take_one(fetch)
    assert running is not None
    assert fetch.recover_orphans([running]) == 0
    assert redis.smembers(held) == {b"q49"}, "only the queue whose job still runs"
    push(redis, "q07", 1, tag="again")
    again = take_one(fetch)
    assert again is not None and again.queue == "q07"
    assert {name.decode() for name in redis.smembers(held)} == {"q07", "q49"}
    assert liveness.reap(redis, "c1") == 2
    assert redis.llen(k.queue("q07")) == 1 and redis.llen(k.queue("q49")) == 1


def test_a_queue_pushed_to_after_the_scan_stays_held(redis: redis_py.Redis) -> None:
    """The scan saw the list empty, a fetch then took a job into it: the forget, one
    script, sees the entry and keeps the queue, so the job is not lost to a reaper."""
    k = keys.of(redis)
    if k.cluster:
        pytest.skip("in a cluster each queue has its own set, holding that queue at most")
    held, listed = k.capsule_queues("c1"), k.in_progress("c1", "q")
    redis.sadd(held, "q", "gone")
    redis.lpush(listed, b"a job taken since")
    forget = [held, listed, k.in_progress("c1", "gone")]
    assert FORGET_DRAINED(redis, forget, ["q", "gone"]) == 1
    assert redis.smembers(held) == {b"q"}


def test_two_hundred_queues_in_one_fetch(redis: redis_py.Redis) -> None:
    """Only the last of 200 queues has work, and the first 100 have limits: one call
    still finds it, and in strict order an earlier queue wins as soon as it has a job."""
    names = [f"q{i:03d}" for i in range(200)]
    for name in names[:100]:
        queue_limits.set_limit(redis, name, 5)
    push(redis, "q199", 1)
    fetch = fetcher(redis, names)
    unit = take_one(fetch)
    assert unit is not None
    assert unit.queue == "q199"
    push(redis, "q150", 1)
    push(redis, "q199", 1)
    assert [u.queue for u in take_all(fetch)] == ["q150", "q199"]
