"""The limit fetch's ready index (limitd/fetch/ready_index.py): a fetch looks only at the
queues that may have work, so its cost follows the work and not the queue count, and
everything the fetch guaranteed still holds. Real Redis; wake-ups through a real
subscription where the behaviour depends on them."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator

import pytest
import redis as redis_py
from freezegun import freeze_time

from limitd import keys
from limitd.api.queues import Queue
from limitd.fetch import liveness
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.fetch.ready_index import MAX_KNOWN, SLACK, ReadyIndex
from limitd.fetch.wakeup import WakeupListener
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder
from tests.helpers import lua_folded, wait_for

SECOND = 1_000_000


def push(redis: redis_py.Redis, queue: str, count: int = 1, *, publish: bool = True) -> None:
    """Jobs as limitd's client writes them (LPUSH then PUBLISH), or as a client that does
    not publish (Ruby Sidekiq, a bare LPUSH)."""
    jobs = [json.dumps({"class": "X", "args": [queue, i], "queue": queue}) for i in range(count)]
    redis.sadd(keys.of(redis).QUEUES, queue)
    redis.lpush(keys.of(redis).queue(queue), *jobs)
    if publish:
        redis.publish(keys.WAKE_CHANNEL, queue)


def names(count: int) -> list[str]:
    return [f"q{i:05d}" for i in range(count)]


def served(redis: redis_py.Redis) -> Counter[str]:
    """Commands served so far, the fetch's Lua calls as "lua" (FCALL or EVALSHA)."""
    return lua_folded(
        Counter(
            {
                name.removeprefix("cmdstat_"): int(stats["calls"])
                for name, stats in redis.info("commandstats").items()
                if name != "cmdstat_info"
            }
        )
    )


def hinted(fetch: LimitFetch) -> set[str]:
    assert fetch.index is not None
    return fetch.index.hinted()


def subscribers(redis: redis_py.Redis) -> int:
    counts = dict(redis.pubsub_numsub(keys.WAKE_CHANNEL))
    return int(counts.get(keys.WAKE_CHANNEL.encode(), 0))


def take_within(fetch: LimitFetch, want: int = 1, seconds: float = 10.0) -> list[str]:
    """Jobs' args taken (and settled) by polling ``fetch`` until one comes."""
    taken: list[str] = []

    def took() -> bool:
        units = fetch.take(want, [])
        fetch.settle(units)
        taken.extend(json.loads(unit.job)["args"][0] for unit in units)
        return bool(units)

    wait_for(took, timeout=seconds, message="a job")
    return taken


@pytest.fixture
def listening(redis: redis_py.Redis) -> Iterator[dict[str, LimitFetch]]:
    """Fetches built by ``make(name, queues, **options)``, each with its wake-ups."""
    built: dict[str, LimitFetch] = {}
    listeners: list[WakeupListener] = []

    def make(name: str, queues: list, **options: object) -> LimitFetch:
        fetch = limit_fetch(redis, QueueOrder(queues), name, **options)  # type: ignore[arg-type]
        listener = WakeupListener(redis, fetch.wake_handlers())
        listener.start()
        listeners.append(listener)
        wait_for(lambda: subscribers(redis) >= len(listeners), message="the subscriptions")
        built[name] = fetch
        return fetch

    built["make"] = make  # type: ignore[assignment]
    yield built
    for listener in listeners:
        listener.stop()


def test_a_call_costs_the_same_with_10000_queues_as_with_one(redis: redis_py.Redis) -> None:
    """Commands Redis runs (Lua-internal included) for the same five jobs, taken one per
    call, when the capsule lists one queue and when it lists 10,000 with the jobs in one
    of them, past the first re-check."""

    def commands_for_five(listed: list[str], queue: str) -> Counter[str]:
        redis.flushdb()
        push(redis, queue, 5)
        fetch = limit_fetch(redis, QueueOrder(listed), f"capsule-{len(listed)}")
        fetch.wake_handlers()  # as in a capsule: one re-check of every queue, first
        assert fetch.take(1, [])
        before = served(redis)
        done = []
        for _ in range(4):
            done = fetch.take(1, done)
            assert len(done) == 1
        fetch.settle(done)
        assert fetch.take(1, []) == []  # the idle poll that follows
        return served(redis) - before

    one = commands_for_five(["q09999"], "q09999")
    many = commands_for_five(names(10_000), "q09999")
    assert many == one
    assert sum(many.values()) < 100, many


def test_a_call_over_many_queues_writes_what_they_share_once(redis: redis_py.Redis) -> None:
    """A call that settles jobs of eight limited queues and takes one job from each of
    eight others: one HSET of every busy count it changed (no HINCRBY per queue), one
    ZREM for the queues it emptied, one EXISTS for the keys no deployment here has, each
    queue's limit and count read once (an HGET each, only for the queues it settles or
    takes from: none for the queues it is given but never reaches), and the index not
    read again while the capsule knows enough of it. The counts stay exact."""
    listed = names(40)
    for name in listed:
        push(redis, name, 1)
        queue_limits.set_limit(redis, name, 100)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1")
    fetch.wake_handlers()
    first = fetch.take(8, [])
    assert len(first) == 8
    before = served(redis)
    second = fetch.take(8, first)
    ran = served(redis) - before
    assert len(second) == 8
    assert ran["hset"] == 1 and ran["hincrby"] == 0, ran
    assert ran["zrem"] == 1 and ran["zrange"] == 0 and ran["exists"] == 1, ran
    assert ran["hmget"] == 0 and ran["hget"] == 2 * 16, ran
    busy = {k.decode(): int(v) for k, v in redis.hgetall(keys.of(redis).BUSY).items()}
    assert busy == {name: int(name in {unit.queue for unit in second}) for name in listed[:16]}


def test_the_index_is_read_afresh_only_when_the_known_part_runs_low(
    redis: redis_py.Redis,
) -> None:
    """One job per queue, one job per call: each call takes a queue out of the index,
    and the capsule follows by dropping it rather than reading the index again, which it
    does once every several calls; the order stays strict."""
    listed = names(1_000)
    for name in listed:
        push(redis, name, 1, publish=False)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1")
    fetch.wake_handlers()
    fetch.settle(fetch.take(1, []))
    before = served(redis)
    taken = []
    for _ in range(100):
        units = fetch.take(1, [])
        fetch.settle(units)
        taken += [unit.queue for unit in units]
    ran = served(redis) - before
    assert taken == listed[1:101]
    assert ran["zrange"] <= 15, ran


def test_an_idle_poll_costs_the_same_whatever_the_queue_count(redis: redis_py.Redis) -> None:
    def idle_poll(listed: list[str]) -> Counter[str]:
        fetch = limit_fetch(redis, QueueOrder(listed), f"idle-{len(listed)}")
        fetch.wake_handlers()
        assert fetch.take(1, []) == []  # the first call re-checks every queue
        before = served(redis)
        assert fetch.take(1, []) == []
        return served(redis) - before

    assert idle_poll(names(10_000)) == idle_poll(["only"]) == Counter({"lua": 1})


def test_strict_order_takes_the_first_queue_with_work(
    redis: redis_py.Redis, listening: dict
) -> None:
    fetch = listening["make"]("c1", ["high", "mid", "low"])
    push(redis, "low", 3)
    assert take_within(fetch) == ["low"]
    push(redis, "mid")
    push(redis, "high")
    wait_for(lambda: hinted(fetch) >= {"mid", "high"}, message="the wake-ups")
    taken = take_within(fetch, want=3)
    while len(taken) < 3:
        taken += take_within(fetch, want=3 - len(taken))
    assert taken == ["high", "mid", "low"]


def test_strict_order_holds_when_thousands_of_queues_have_work(redis: redis_py.Redis) -> None:
    """Far more queues with work than a call is given: each job still comes from the
    first of them, in order, as they empty."""
    listed = names(3_000)
    for name in reversed(listed):  # the last queues are pushed first
        push(redis, name, 1, publish=False)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1")
    fetch.wake_handlers()
    taken: list[str] = []
    while units := fetch.take(7, []):
        fetch.settle(units)
        taken += [json.loads(unit.job)["args"][0] for unit in units]
        assert fetch.index is not None and len(fetch.index._known) <= MAX_KNOWN
    assert taken == listed


def test_random_order_draws_from_every_queue_with_work(redis: redis_py.Redis) -> None:
    listed = [[name, 1] for name in names(200)]
    for name, _ in listed:
        push(redis, name, 5, publish=False)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1")
    fetch.wake_handlers()
    first: list[str] = []
    while len(first) < 100:
        units = fetch.take(5, [])
        fetch.settle(units)
        first += [json.loads(unit.job)["args"][0] for unit in units]
    # A sample of the index, drawn again as it changes: not the first queues only.
    assert len(set(first)) > 60
    assert max(first) > "q00150"
    rest = 0
    while units := fetch.take(10, []):
        fetch.settle(units)
        rest += len(units)
    assert len(first) + rest == 1_000


def test_a_full_queue_leaves_the_index_and_comes_back_when_a_slot_frees(
    redis: redis_py.Redis, listening: dict
) -> None:
    queue_limits.set_limit(redis, "limited", 2)
    a = listening["make"]("a", ["limited"])
    b = listening["make"]("b", ["limited"])
    push(redis, "limited", 5)
    held = a.take(2, [])
    assert len(held) == 2
    wait_for(lambda: "limited" in hinted(b), message="b's wake-up")
    assert b.take(2, []) == []
    assert redis.zcard(keys.of(redis).ready_index("b")) == 0, "full: out of b's index"
    a.settle(held[:1])  # frees a slot: published, and b is told
    assert take_within(b, want=2) == ["limited"]
    assert queue_limits.busy(redis, "limited") == 1  # a's other job (b settled its own)


def test_a_paused_queue_leaves_the_index_and_a_resume_brings_it_back(
    redis: redis_py.Redis, listening: dict
) -> None:
    fetch = listening["make"]("c1", ["jobs"])
    queue = Queue("jobs", redis)
    queue.pause()
    push(redis, "jobs", 2)
    wait_for(lambda: "jobs" in hinted(fetch), message="the wake-up")
    assert fetch.take(1, []) == []
    assert redis.zcard(keys.of(redis).ready_index("c1")) == 0
    queue.resume()
    assert take_within(fetch) == ["jobs"]


def test_a_queue_out_of_rate_waits_aside_until_its_rate_allows(redis: redis_py.Redis) -> None:
    now = [1_000 * SECOND]
    Queue("rated", redis).rate_limit = "2/10s"  # one every 5 s
    push(redis, "rated", 3, publish=False)
    fetch = limit_fetch(redis, QueueOrder(["rated"]), "c1", rate_clock=lambda: now[0])
    fetch.wake_handlers()
    assert len(fetch.take(3, [])) == 1
    k = keys.of(redis)
    assert redis.zcard(k.ready_index("c1")) == 0
    assert redis.zrange(k.rate_wait("c1"), 0, -1) == [b"1:rated"]
    assert fetch.room_in == 5.0
    now[0] += 5 * SECOND
    assert len(fetch.take(3, [])) == 1, "back from rate_wait and taken in the same take"
    now[0] += 5 * SECOND
    assert len(fetch.take(3, [])) == 1


def test_a_push_that_does_not_publish_is_found_by_the_sweep(redis: redis_py.Redis) -> None:
    """The sweep re-checks ``sweep_per_second`` listed queues per second before calls
    (at most every SWEEP_EVERY seconds): a job pushed without a wake-up into an empty
    queue is found within one pass over the listed queues, at that pace."""
    listed = names(400)
    with freeze_time("2026-11-28 12:00:00") as frozen:
        fetch = limit_fetch(redis, QueueOrder(listed), "c1", sweep_per_second=100)
        fetch.wake_handlers()
        assert fetch.take(1, []) == []  # the first re-check: nothing anywhere
        push(redis, "q00321", publish=False)
        assert fetch.take(1, []) == [], "no wake-up, not in the index: not seen yet"
        seconds = 0
        while not (units := fetch.take(1, [])):
            frozen.tick(1.0)  # 100 more queues re-checked at the next call
            seconds += 1
            assert seconds <= 4, "400 queues at 100 a second: one pass takes 4 s"
    assert [json.loads(unit.job)["args"][0] for unit in units] == ["q00321"]
    assert seconds == 4, "q00321 is in the fourth hundred"


def test_an_idle_sweep_is_one_command_whatever_it_covers(redis: redis_py.Redis) -> None:
    """With every queue empty, a sweep asks all the queues it covers in one EXISTS, so
    an idle capsule's commands per second do not grow with its queue count; a part
    where something exists is then asked queue by queue (the tests above)."""

    def idle_sweep(count: int, per_second: float) -> Counter[str]:
        with freeze_time("2026-11-28 12:00:00") as frozen:
            fetch = limit_fetch(
                redis, QueueOrder(names(count)), f"idle-{count}", sweep_per_second=per_second
            )
            fetch.wake_handlers()
            assert fetch.take(1, []) == []  # the first call re-checks every queue
            frozen.tick(1.0)  # a second's worth of sweep is due before the next call
            before = served(redis)
            assert fetch.take(1, []) == []
            return served(redis) - before

    expected = Counter({"lua": 1, "exists": 1})
    assert idle_sweep(20, 50) == idle_sweep(10_000, 50) == idle_sweep(400, 300) == expected


def test_a_few_queues_are_all_swept_at_every_idle_poll(redis: redis_py.Redis) -> None:
    """20 queues at 50 a second: every poll (0.4 s or more apart) re-checks them all,
    so a client that does not publish waits no longer than before the index."""
    with freeze_time("2026-11-28 12:00:00") as frozen:
        fetch = limit_fetch(redis, QueueOrder(names(20)), "c1")
        fetch.wake_handlers()
        assert fetch.take(1, []) == []
        push(redis, "q00019", publish=False)
        frozen.tick(0.4)
        units = fetch.take(1, [])
    assert [json.loads(unit.job)["args"][0] for unit in units] == ["q00019"]


def test_a_resubscription_rechecks_every_queue(redis: redis_py.Redis) -> None:
    fetch = limit_fetch(redis, QueueOrder(names(50)), "c1")
    fetch.wake_handlers()
    assert fetch.take(1, []) == []
    push(redis, "q00042", publish=False)  # published while the subscription was down
    fetch.on_wake([""])  # what the listener says after every (re)subscription
    units = fetch.take(1, [])
    assert [json.loads(unit.job)["args"][0] for unit in units] == ["q00042"]


def test_a_dynamic_capsule_finds_a_new_queue_among_10000(
    redis: redis_py.Redis, listening: dict
) -> None:
    for name in names(10_000):
        redis.sadd(keys.of(redis).QUEUES, name)
    fetch = listening["make"]("c1", ["listed"], dynamic=True)
    assert fetch.take(1, []) == []
    push(redis, "q07777")
    push(redis, "listed")
    wait_for(lambda: hinted(fetch) == {"q07777", "listed"}, message="both wake-ups")
    taken = take_within(fetch, want=2)
    while len(taken) < 2:
        taken += take_within(fetch)
    assert taken == ["listed", "q07777"], "listed queues first, then the ones found"


def test_a_reaped_capsule_leaves_no_index_behind(redis: redis_py.Redis) -> None:
    Queue("rated", redis).rate_limit = "1/60s"
    push(redis, "rated", 2, publish=False)
    push(redis, "other", 1, publish=False)
    fetch = limit_fetch(redis, QueueOrder(["rated", "other", "empty"]), "gone")
    fetch.wake_handlers()
    assert len(fetch.take(1, [])) == 1
    fetch.take(1, [])
    k = keys.of(redis)
    assert redis.exists(k.rate_wait("gone"))
    liveness.reap(redis, "gone")
    assert not redis.exists(k.ready_index("gone"), k.rate_wait("gone"))


def test_a_failed_call_forgets_nothing(redis: redis_py.Redis) -> None:
    """A call that fails (Redis gone mid-call) gives its hints back and reads the index
    afresh next time: the job pushed meanwhile is still found."""
    fetch = limit_fetch(redis, QueueOrder(["a", "b"]), "c1")
    fetch.wake_handlers()
    assert fetch.take(1, []) == []
    push(redis, "b", publish=False)
    fetch.on_wake(["b"])
    broken = redis_py.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    with pytest.raises(redis_py.ConnectionError):
        fetch.take(1, [], conn=broken)
    units = fetch.take(1, [])
    assert [json.loads(unit.job)["args"][0] for unit in units] == ["b"]


def test_turning_the_index_off_scans_every_queue(redis: redis_py.Redis) -> None:
    push(redis, "b", publish=False)
    fetch = limit_fetch(redis, QueueOrder(["a", "b"]), "c1", ready_index=False)
    assert fetch.index is None
    assert len(fetch.take(1, [])) == 1
    assert not redis.exists(keys.of(redis).ready_index("c1"))


def test_a_scan_over_more_queues_than_lua_can_unpack_at_once(redis: redis_py.Redis) -> None:
    """Without the index a call is given every listed queue: 9,000 of them read their
    limits in chunks (Lua's unpack stops at a few thousand values)."""
    listed = names(9_000)
    queue_limits.set_limit(redis, listed[-1], 5)
    push(redis, listed[-1], 1, publish=False)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1", ready_index=False)
    assert [json.loads(unit.job)["args"][0] for unit in fetch.take(1, [])] == [listed[-1]]


@pytest.mark.parametrize("weighted", [False, True])
def test_what_the_index_knows_stays_in_rank_order_as_calls_take_queues_out(
    redis: redis_py.Redis, weighted: bool
) -> None:
    """Over many shallow queues each call takes some out: the capsule drops them from
    the ranked list it keeps (a strict call's from the queues it was given only, checked
    by their count) and the list stays what sorting what it knows would give."""
    listed = names(600)
    order = QueueOrder([[name, 1] for name in listed] if weighted else listed)
    fetch = limit_fetch(redis, order, "c1")
    index = fetch.index
    assert index is not None
    index.after_call(
        [0, 1, b"", *(name.encode() for name in listed[:MAX_KNOWN])], index.plan(1, {})
    )
    rng = random.Random(7)
    for step in range(60):
        plan = index.plan(5, {})
        given = list(dict.fromkeys(name for order in plan.orders for name in order))
        out = rng.sample(given, min(len(given), rng.randint(1, 4)))
        if step % 10 == 9:  # a queue the call was not given (a hint it found empty)
            out.append(rng.choice([name for name in index._known if name not in given]))
        index.after_call([0, 0, b"", *(name.encode() for name in out)], plan)
        assert index._sorted is None or index._sorted == sorted(index._known, key=index._key)
        assert not set(out) & set(index._known)


def test_the_ranked_queues_a_capsule_keeps_match_its_index_call_after_call(
    redis: redis_py.Redis,
) -> None:
    """Refilled from Redis (the index's first queues, in its order) or followed by what
    each call took out, the ranked list a capsule keeps is what sorting what it knows
    would give, with names that sort differently as bytes and as text if they could."""
    listed = [f"q{i:03d}" for i in range(150)] + [f"é{i:03d}" for i in range(150)]
    for name in listed:
        push(redis, name, 1 + len(name) % 2)
    fetches = [limit_fetch(redis, QueueOrder(listed), f"c{n}") for n in range(2)]
    held: list[list] = [[], []]
    for _ in range(400):
        for n, fetch in enumerate(fetches):
            held[n] = fetch.take(3, held[n])
            index = fetch.index
            assert index is not None
            if index._sorted is not None:
                assert index._sorted == sorted(index._known, key=index._key)
    assert not any(held) and all(redis.llen(keys.of(redis).queue(q)) == 0 for q in listed)


def filled(
    redis: redis_py.Redis, queues: int, jobs: int
) -> tuple[list[str], LimitFetch, ReadyIndex]:
    """``queues`` listed queues of ``jobs`` jobs each, and a capsule's fetch over them."""
    listed = names(queues)
    for name in listed:
        push(redis, name, jobs)
    fetch = limit_fetch(redis, QueueOrder(listed), "c1")
    assert fetch.index is not None
    return listed, fetch, fetch.index


def test_a_call_over_deep_queues_is_given_the_few_it_needs(redis: redis_py.Redis) -> None:
    """Every queue a call is given costs the script its keys and name, looked at or not:
    where one deep queue gives a whole call, the capsule learns that and gives a call
    its slack beyond one queue, not one queue per job wanted; the jobs still come from
    the first queue in order, then from the next once the first runs dry."""
    listed, fetch, index = filled(redis, 50, 30)
    held: list = []
    taken: list[str] = []
    for _ in range(17):
        held = fetch.take(5, held)
        taken += [unit.queue for unit in held]
    assert len(index.plan(5, {}).orders[0]) == 1 + SLACK
    assert taken == [name for name in listed[:3] for _ in range(30)][: len(taken)]
    assert len(taken) == 85


def test_a_call_over_queues_of_a_job_each_is_still_given_one_per_job(
    redis: redis_py.Redis,
) -> None:
    """Shallow queues that each give one job: a call needs a queue per job wanted, and
    is given that many and its slack, so it does not stop short and call again."""
    _, fetch, index = filled(redis, 300, 1)
    held: list = []
    for _ in range(20):
        held = fetch.take(5, held)
        assert len(held) == 5
    assert len(index.plan(5, {}).orders[0]) == 5 + SLACK
