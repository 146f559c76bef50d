"""Fair queues (limitd/fair_queues, limitd/fetch/fair_lib.lua) through real Redis:
tenants served in turn inside one queue, weights, per-tenant limits exact across
capsules and after a crash, bad tenants refused at enqueue, and a fair queue that can
be inspected, cleared and made plain without losing a job. What ran is what the jobs
recorded."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import Queue, fair_queue_status, make_fair, make_plain, set_tenant_weight
from limitd.fetch import liveness
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.options import InvalidJobOption
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import command_runner, wait_for

QUEUE = "reports"


class Report(limitd.Job, name="fair_queues_test.Report", queue=QUEUE):
    def fair_tenant(self, account: str, n: int) -> str:
        return account

    def perform(self, account: str, n: int) -> None:
        meter.run(account)


class NumberedReport(limitd.Job, name="fair_queues_test.NumberedReport", queue=QUEUE):
    def fair_tenant(self, account: int) -> int:
        return account

    def perform(self, account: int) -> None:
        meter.run(str(account))


@limitd.job(name="fair_queues_test.Tagged", queue=QUEUE)
def tagged(n: int) -> None:
    meter.run("")


class Meter:
    """What ran, in order, and the most jobs of one tenant running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.order: list[str] = []
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.gate = threading.Event()
        self.gate.set()

    def run(self, tenant: str) -> None:
        with self.lock:
            self.order.append(tenant)
            self.running[tenant] += 1
            self.peak[tenant] = max(self.peak[tenant], self.running[tenant])
        self.gate.wait(10)
        with self.lock:
            self.running[tenant] -= 1

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


meter = Meter()


@pytest.fixture(autouse=True)
def fresh_meter() -> Iterator[None]:
    meter.reset()
    yield
    meter.gate.set()


def push(redis: redis_py.Redis, tenant: str | None, count: int, tag: str = "") -> None:
    """Raw pushes (as a Ruby client or limitd's client writes them)."""
    jobs = []
    for i in range(count):
        job = {"class": "X", "args": [tenant, i], "jid": f"{tag}{tenant}-{i}", "queue": QUEUE}
        if tenant is not None:
            job["fair_tenant"] = tenant
        jobs.append(json.dumps(job))
    redis.lpush(keys.of(redis).queue(QUEUE), *jobs)


def tenants_of(units: list) -> list[str]:
    return [json.loads(unit.job)["args"][0] for unit in units]


def fetcher(redis: redis_py.Redis, name: str = "c1") -> LimitFetch:
    fetch = limit_fetch(redis, QueueOrder([QUEUE]), name)
    return fetch


def take_all(fetch: LimitFetch, want: int = 5) -> list[str]:
    taken = []
    while units := fetch.take(want, []):
        fetch.settle(units)
        taken += tenants_of(units)
    return taken


@pytest.mark.parametrize("redis", ["standalone", "cluster"], indirect=True)
def test_small_tenants_go_before_a_flooding_tenants_backlog(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, "flood", 300)
    fetch = fetcher(redis)
    first = take_all_n(fetch, 10)
    assert set(first) == {"flood"}, "alone, the flooding tenant takes every turn"
    for small in ("s1", "s2", "s3"):
        push(redis, small, 2)
    after = take_all_n(fetch, 12)
    # Each round gives one job per tenant with work: the small ones are done within
    # two rounds, the flood's 290 jobs waiting notwithstanding.
    assert Counter(after[:8]) == Counter({"flood": 2, "s1": 2, "s2": 2, "s3": 2})
    assert take_all(fetch) == ["flood"] * (300 - 10 - after.count("flood"))


def take_all_n(fetch: LimitFetch, count: int) -> list[str]:
    taken: list[str] = []
    while len(taken) < count:
        units = fetch.take(min(5, count - len(taken)), [])
        assert units, "a job was waiting"
        fetch.settle(units)
        taken += tenants_of(units)
    return taken


def test_weights_give_a_tenant_more_turns(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, weights={"gold": 3}, redis=redis)
    push(redis, "gold", 100)
    push(redis, "basic", 100)
    fetch = fetcher(redis)
    head_starts = take_all_n(fetch, 40)  # 10 turns each, taken at once, in arrival order
    assert head_starts == ["gold"] * 30 + ["basic"] * 10
    assert Counter(take_all_n(fetch, 40)) == Counter({"gold": 30, "basic": 10})


def test_weight_set_at_run_time_applies_from_the_next_turn(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, "a", 50)
    push(redis, "b", 50)
    fetch = fetcher(redis)
    assert take_all_n(fetch, 20) == ["a"] * 10 + ["b"] * 10, "their head starts"
    assert Counter(take_all_n(fetch, 10)) == Counter({"a": 5, "b": 5})
    set_tenant_weight(QUEUE, "b", 4, redis=redis)
    assert Counter(take_all_n(fetch, 20)) == Counter({"a": 4, "b": 16})


def test_tenant_limit_holds_across_fetches_and_frees_on_ack(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, tenant_limit=2, redis=redis)
    push(redis, "big", 10)
    push(redis, "small", 1)
    a, b = fetcher(redis, "a"), fetcher(redis, "b")
    held = a.take(5, [])
    assert sorted(tenants_of(held)) == ["big", "big", "small"]
    assert b.take(5, []) == [], "big runs 2, its limit; small has nothing left"
    a.settle([unit for unit in held if tenants_of([unit]) == ["big"]][:1])
    assert tenants_of(b.take(5, [])) == ["big"], "one slot freed, one more job"
    assert b.take(5, []) == []
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None
    assert [(load.tenant, load.waiting, load.running) for load in status.largest] == [("big", 7, 2)]


def test_tenant_limit_is_exact_with_capsules_running_jobs(redis: redis_py.Redis) -> None:
    """Two capsules of 8 threads, tenant limit 2, jobs held until 8 run (2 per tenant):
    16 threads with 112 jobs waiting never ran a third job of one tenant, and after the
    release every job ran."""
    make_fair(QUEUE, tenant_limit=2, redis=redis)
    capsules = [
        Capsule(CapsuleConfig(name=name, queues=[QUEUE], concurrency=8), redis=redis)
        for name in ("a", "b")
    ]
    for capsule in capsules:
        capsule.start()
    meter.gate.clear()  # jobs hold their slots until the limit is reached everywhere
    try:
        Report.perform_bulk([[f"t{n % 4}", n] for n in range(120)])
        wait_for(
            lambda: sum(meter.running.values()) == 8, timeout=30, message="2 running per tenant"
        )
        meter.gate.set()
        wait_for(lambda: len(meter.order) == 120, timeout=60, message="120 jobs")
    finally:
        for capsule in capsules:
            capsule.stop(timeout=5)
    assert Counter(meter.order) == Counter({f"t{i}": 30 for i in range(4)})
    assert max(meter.peak.values()) == 2, meter.peak


def test_a_dead_capsules_jobs_go_back_to_the_front_of_their_tenant(
    redis: redis_py.Redis,
) -> None:
    make_fair(QUEUE, tenant_limit=1, redis=redis)
    push(redis, "a", 3)
    push(redis, "b", 3)
    dead = fetcher(redis, "dead")
    held = dead.take(2, [])
    assert sorted(json.loads(u.job)["jid"] for u in held) == ["a-0", "b-0"]
    alive = fetcher(redis, "alive")
    assert alive.take(5, []) == [], "both tenants at their limit, held by the dead one"
    # As for a process its supervisor stopped: a SIGKILLed one's jobs come back the
    # same way, but as suspects of its crash (fetch/recoveries.py), so a capsule takes
    # them one at a time, the others going behind their tenant's line meanwhile.
    assert liveness.reap(redis, "dead", blame=False) == 2
    taken = []
    while units := alive.take(5, []):
        taken += [json.loads(u.job)["jid"] for u in units]
        alive.settle(units)
    assert taken[:2] == ["a-0", "b-0"], "first again, their tenants' slots freed"
    assert sorted(taken) == sorted(f"{t}-{i}" for t in "ab" for i in range(3))


def test_jobs_without_a_tenant_share_one_line(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, None, 2)
    tagged.perform_async(1)
    push(redis, "t", 2)
    # The tenant "" came first: its head start gives its whole (short) line, one tenant.
    assert take_all_n(fetcher(redis), 5) == [None, None, 1, "t", "t"]


@pytest.mark.parametrize(
    ("tenant", "problem"),
    [("", "non-empty string"), ("x" * 1025, "at most 1024 bytes, got 1025"), (42, "string")],
)
def test_a_bad_tenant_is_refused_at_enqueue_and_nothing_is_written(
    redis: redis_py.Redis, tenant: object, problem: str
) -> None:
    with pytest.raises(InvalidJobOption, match=problem):
        tagged.set(fair_tenant=tenant).perform_async(1)
    raw = {"class": "fair_queues_test.Tagged", "queue": QUEUE, "args": [1], "fair_tenant": tenant}
    with pytest.raises(InvalidJobOption, match=problem):  # a raw push, checked alike
        limitd.Client(redis).push(raw)
    assert redis.llen(keys.of(redis).queue(QUEUE)) == 0


def test_a_tenant_method_returning_a_non_string_is_refused(redis: redis_py.Redis) -> None:
    with pytest.raises(InvalidJobOption, match="fair_tenant=7: expected a non-empty string"):
        NumberedReport.perform_async(7)
    assert redis.llen(keys.of(redis).queue(QUEUE)) == 0


def test_the_tenant_comes_from_the_jobs_fair_tenant_method(redis: redis_py.Redis) -> None:
    Report.perform_async("acme", 1)
    [raw] = redis.lrange(keys.of(redis).queue(QUEUE), 0, -1)
    assert json.loads(raw)["fair_tenant"] == "acme"


def test_making_a_queue_plain_moves_every_job_back_in_turn_order(
    redis: redis_py.Redis,
) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, "a", 3)
    push(redis, "b", 1)
    fetch = fetcher(redis)
    fetch.take(1, [])  # sorts the arrivals into their lines (and takes a-0)
    push(redis, "c", 1, tag="late-")  # an arrival not sorted yet
    assert Queue(QUEUE, redis).size() == 4
    assert make_plain(QUEUE, redis=redis) == 3
    assert fair_queue_status(QUEUE, redis=redis) is None
    waiting = redis.lrange(keys.of(redis).queue(QUEUE), 0, -1)
    order = [json.loads(raw)["jid"] for raw in reversed(waiting)]
    assert order == ["a-1", "b-0", "a-2", "late-c-0"]  # a came first: its turn first
    assert not redis.keys("limitd:fair:reports:t:*")
    make_fair(QUEUE, redis=redis)  # and fair again: nothing stranded either way
    assert sorted(take_all(fetch)) == ["a", "a", "b", "c"]


def test_size_clear_and_pause_of_a_fair_queue(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, "a", 5)
    fetch = fetcher(redis)
    queue = Queue(QUEUE, redis)
    queue.pause()
    assert fetch.take(5, []) == []
    assert queue.size() == 5
    queue.resume()
    fetch.on_wake([QUEUE])
    assert len(fetch.take(2, [])) == 2
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None and status.jobs_waiting == 3 and status.tenants_waiting == 1
    assert queue.clear() == 3
    assert queue.size() == 0
    assert fetch.take(5, []) == []


def test_a_queue_ruby_sidekiq_fetches_cannot_be_made_fair(redis: redis_py.Redis) -> None:
    identity = "rubyhost:4242:abc"
    redis.sadd(keys.of(redis).PROCESSES, identity)
    redis.hset(identity, "info", json.dumps({"hostname": "rubyhost", "queues": [QUEUE]}))
    with pytest.raises(ValueError, match="Sidekiq processes that are not limitd"):
        make_fair(QUEUE, redis=redis)
    assert fair_queue_status(QUEUE, redis=redis) is None


def test_a_take_costs_the_same_with_10000_tenants_as_with_ten(redis: redis_py.Redis) -> None:
    """Commands Redis runs for two jobs taken and settled one by one, once the
    arrivals are sorted, with ten tenants waiting and with 10,000 (each job taken
    leaves its tenant more to do, and some tenant is in its head start, in both). A
    tenant alone has dropped its head start, and its takes read none."""

    def commands_for_three(tenants: int, each: int) -> int:
        redis.flushdb()
        make_fair(QUEUE, redis=redis)
        for first in range(0, tenants, 1000):
            pipe = redis.pipeline()
            for t in range(first, min(first + 1000, tenants)):
                push(pipe, f"t{t}", each)  # type: ignore[arg-type]
            pipe.execute()
        fetch = fetcher(redis, f"c{tenants}")
        done = fetch.take(1, [])
        while redis.llen(keys.of(redis).queue(QUEUE)):  # every arrival sorted
            done = fetch.take(1, done)
        before = sum(int(v["calls"]) for v in redis.info("commandstats").values())
        for _ in range(2):  # neither empties a line (a tenant of 10,000 has 3 jobs)
            done = fetch.take(1, done)
            assert len(done) == 1
        after = sum(int(v["calls"]) for v in redis.info("commandstats").values())
        return after - before - 1  # the INFO itself

    many = commands_for_three(10_000, 3)
    assert many == commands_for_three(10, 3_000)
    # Alone, each take reads no head start, and asks for weights and head starts in
    # one EXISTS (neither is there): two commands fewer.
    assert commands_for_three(1, 30_000) == many - 4


def test_the_fair_command_steers_and_shows_a_queue(
    redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from limitd.fair_queues.commands import add_fair_command

    run = command_runner(add_fair_command, redis, capsys)

    assert run("fair", "on", QUEUE, "--tenant-limit", "3")[0] == 0
    assert run("fair", "weight", QUEUE, "acme", "2")[0] == 0
    push(redis, "acme", 4)
    push(redis, "beta", 1)
    fetcher(redis).take(1, [])
    code, out = run("fair", "status", QUEUE)
    assert code == 0
    assert "4 jobs waiting in 2 tenants' lines, 0 not sorted yet; tenant limit 3" in out
    assert out.splitlines()[2].split() == ["acme", "3", "1"]
    code, out = run("fair", "status", QUEUE, "--json")
    document = json.loads(out)
    assert document["tenants_waiting"] == 2
    assert document["largest"][0] == {"tenant": "acme", "waiting": 3, "running": 1}
    assert run("fair", "off", QUEUE)[1].startswith(f"{QUEUE}: plain; 4 jobs moved back")
    assert redis.hget(keys.of(redis).FAIR_QUEUES, QUEUE) == b"off"
    assert run("fair", "reset", QUEUE)[0] == 0
    assert redis.hget(keys.of(redis).FAIR_QUEUES, QUEUE) is None


def test_a_job_in_a_tenants_line_is_found_and_deleted_by_jid(redis: redis_py.Redis) -> None:
    make_fair(QUEUE, redis=redis)
    push(redis, "a", 3)
    fetcher(redis).take(1, [])  # a-0 taken, a-1 and a-2 in a's line
    queue = Queue(QUEUE, redis)
    entry = queue.find_job("a-2")
    assert entry is not None
    assert entry.delete()
    assert queue.size() == 1
    assert [e.jid for e in queue.page(0, 10)] == ["a-1"]
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None and status.jobs_waiting == 1


def test_metrics_give_each_fair_queue_without_a_tenant_label(redis: redis_py.Redis) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from limitd.metrics.exporter import ClusterCollector
    from limitd.plugins import registered

    make_fair(QUEUE, redis=redis)
    push(redis, "big", 5)
    push(redis, "small", 1)
    fetcher(redis).take(1, [])
    registry = CollectorRegistry()
    registry.register(ClusterCollector(redis, registered))
    text = generate_latest(registry).decode()
    assert 'limitd_fair_queue_jobs_waiting{queue="reports"} 5.0' in text
    assert 'limitd_fair_queue_tenants_waiting{queue="reports"} 2.0' in text
    assert 'limitd_fair_queue_largest_tenant_jobs{queue="reports"} 4.0' in text
    assert "tenant=" not in text


def test_the_config_section_is_checked_and_applied_where_redis_has_no_setting(
    redis: redis_py.Redis, tmp_path: Path
) -> None:
    from limitd.config import load_config
    from limitd.config.settings import ConfigError
    from limitd.fair_queues.checks import check_fair_queue_fetch
    from limitd.fair_queues.process import ConfiguredFairQueues

    bad = tmp_path / "bad.yml"
    bad.write_text("queues: [reports]\nfair_queues: {reports: {tenant_limit: 0}}\n")
    with pytest.raises(ConfigError, match=r"bad\.yml.*fair_queues\.reports\.tenant_limit"):
        load_config([bad])
    good = tmp_path / "good.yml"
    good.write_text(
        "queues: [reports, other]\n"
        "fair_queues: {reports: {tenant_limit: 2, weights: {acme: 3}}, other: null}\n"
    )
    settings = load_config([good]).section("fair_queues")
    assert settings["reports"].tenant_limit == 2 and settings["reports"].weights == {"acme": 3}
    make_plain("other", redis=redis)  # a run-time change wins over the config
    ConfiguredFairQueues(redis, settings).start()
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None and status.tenant_limit == 2
    assert fair_queue_status("other", redis=redis) is None
    basic = tmp_path / "basic.yml"
    basic.write_text("queues: [reports]\nfetch: basic\nfair_queues: [reports]\n")
    with pytest.raises(ConfigError, match="basic cannot fetch the fair queues"):
        check_fair_queue_fetch(load_config([basic]), [])


def test_the_tenant_is_read_from_the_top_level_field_only(redis: redis_py.Redis) -> None:
    """limitd's client writes fair_tenant first (read without decoding); any other
    layout is decoded, so a nested object's fair_tenant is not taken for the job's."""
    make_fair(QUEUE, redis=redis)
    Report.perform_async("acme", 1)
    [raw] = redis.lrange(keys.of(redis).queue(QUEUE), 0, -1)
    assert raw.startswith(b'{"fair_tenant":"acme",')
    nested = {"class": "X", "args": [{"fair_tenant": "evil"}], "jid": "n-0", "queue": QUEUE}
    later = {"class": "X", "args": [], "jid": "l-0", "queue": QUEUE, "fair_tenant": 'q"uote'}
    again = {**nested, "jid": "n-1"}
    redis.lpush(keys.of(redis).queue(QUEUE), *map(json.dumps, (nested, again, later)))
    assert tenants_of(fetcher(redis).take(1, [])) == ["acme"]  # first to come, first turn
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None
    lines = {load.tenant for load in status.largest}
    assert lines | {"acme"} == {"acme", "", 'q"uote'}
    assert "evil" not in lines


def test_a_full_fair_queue_comes_back_when_a_slot_frees(redis: redis_py.Redis) -> None:
    """A queue limit on a fair queue: a capsule that found it full takes it out of its
    index, and the ack that frees a slot must say so, though the queue's own list is
    empty (its jobs wait in lines)."""
    from limitd.fetch.wakeup import WakeupListener
    from limitd.queues import limits as queue_limits

    make_fair(QUEUE, redis=redis)
    queue_limits.set_limit(redis, QUEUE, 1)
    push(redis, "a", 3)
    holder, waiter = fetcher(redis, "holder"), fetcher(redis, "waiter")
    listener = WakeupListener(redis, waiter.wake_handlers())
    listener.start()
    try:
        wait_for(
            lambda: (
                dict(redis.pubsub_numsub(keys.WAKE_CHANNEL)).get(keys.WAKE_CHANNEL.encode(), 0) >= 1
            ),
            message="the subscription",
        )
        held = holder.take(1, [])
        assert len(held) == 1
        waiter.on_wake([QUEUE])
        assert waiter.take(1, []) == [], "full"
        assert waiter.index is not None and not waiter.index.hinted()
        holder.settle(held)  # frees the slot: published, and the waiter hears it
        wait_for(lambda: QUEUE in waiter.index.hinted(), message="the freed slot's wake-up")
        assert len(waiter.take(1, [])) == 1
    finally:
        listener.stop()


def jids_of(units: list) -> list[str]:
    return [json.loads(unit.job)["jid"] for unit in units]


def test_a_tenant_alone_gives_a_whole_take_in_one_pop(redis: redis_py.Redis) -> None:
    """Its next turns precede anyone else's, so ten jobs cost what one does, in order."""
    make_fair(QUEUE, redis=redis)
    push(redis, "solo", 40)
    fetch = fetcher(redis)
    fetch.settle(fetch.take(1, []))  # the arrivals sorted into the line

    def commands_to_take(want: int) -> tuple[int, list[str]]:
        before = redis.info("commandstats")
        units = fetch.take(want, [])
        after = redis.info("commandstats")
        fetch.settle(units)
        pops = int(after.get("cmdstat_rpop", {}).get("calls", 0)) - int(
            before.get("cmdstat_rpop", {}).get("calls", 0)
        )
        return pops, jids_of(units)

    one_pops, one = commands_to_take(1)
    ten_pops, ten = commands_to_take(10)
    assert one == ["solo-1"]
    assert ten == [f"solo-{i}" for i in range(2, 12)]
    assert ten_pops == one_pops, "one RPOP of the line for ten jobs"


def test_a_fair_call_asks_only_the_rare_keys_it_must_and_writes_its_counters_once(
    redis: redis_py.Redis,
) -> None:
    """With fair queues the only rare feature in use, a call that settles jobs and
    takes more asks the fair settings first, and finding them tells it that nothing is
    paused, limited per process or by rate, and no job is a suspect (the first EXISTS
    counted one key); the jobs count in the lines says the tenant has a turn. It writes
    the queue's jobs count and clock in one HSET (the busy counts take the other), and
    not the tenant's backlog."""
    make_fair(QUEUE, redis=redis)
    push(redis, "solo", 20)
    fetch = limit_fetch(redis, QueueOrder([QUEUE]), "c1", ready_index=False)
    first = fetch.take(1, [])  # the arrivals sorted into the line

    def calls(stats: dict, name: str) -> int:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    before = redis.info("commandstats")
    units = fetch.take(5, first)
    after = redis.info("commandstats")
    assert jids_of(units) == [f"solo-{i}" for i in range(1, 6)]
    names = ("exists", "hincrby", "hset", "zincrby")
    ran = {name: calls(after, name) - calls(before, name) for name in names}
    # The rare keys together, the fair settings, the queue's weights and head starts
    # together (neither is there), and whether the take left jobs in the line: the
    # backlog is not written (its score still bounds the line).
    assert ran == {"exists": 4, "hincrby": 0, "hset": 2, "zincrby": 0}, ran
    assert redis.hget(keys.of(redis).fair_part(QUEUE, "state"), "jobs") == b"14"
    assert redis.llen(keys.of(redis).in_progress("c1", QUEUE)) == 5  # the first one settled


def test_jobs_popped_ahead_but_not_taken_go_back_in_order(redis: redis_py.Redis) -> None:
    """A queue limit of 3 stops a take of 10 after 3: the 7 popped ahead of their turns
    return to the front of the line, and the next take goes on where this one stopped."""
    from limitd.queues import limits as queue_limits

    make_fair(QUEUE, redis=redis)
    queue_limits.set_limit(redis, QUEUE, 3)
    push(redis, "solo", 10)
    push(redis, "other", 1)
    fetch = fetcher(redis)
    first = fetch.take(10, [])
    assert jids_of(first) == ["solo-0", "solo-1", "solo-2"]  # its head start, 10 popped
    status = fair_queue_status(QUEUE, redis=redis)
    assert status is not None and status.jobs_waiting == 8
    assert Queue(QUEUE, redis=redis).size() == 8
    fetch.settle(first)
    second = fetch.take(10, [])
    assert jids_of(second) == ["solo-3", "solo-4", "solo-5"]
    fetch.settle(second)
    rest: list[str] = []
    while units := fetch.take(10, []):
        fetch.settle(units)
        rest += jids_of(units)
    assert rest == [f"solo-{i}" for i in range(6, 10)] + ["other-0"]


def test_a_newly_active_tenant_gets_a_head_start_then_joins_the_rounds(
    redis: redis_py.Redis,
) -> None:
    """Short bursts are done in one go, in the order they came (not by name); a tenant
    that stays busy gets its head start once, then one turn per round."""
    make_fair(QUEUE, redis=redis)
    push(redis, "flood", 300)
    fetch = fetcher(redis)
    assert set(take_all_n(fetch, 20)) == {"flood"}
    for tenant in ("zeta", "alpha", "mid"):
        push(redis, tenant, 3)
    push(redis, "steady", 30)
    taken = take_all_n(fetch, 9 + 10)
    assert taken == ["zeta"] * 3 + ["alpha"] * 3 + ["mid"] * 3 + ["steady"] * 10
    push(redis, "steady", 5)  # its line never emptied: no second head start
    assert Counter(take_all_n(fetch, 20)) == Counter({"flood": 10, "steady": 10})


def test_virtual_times_are_whole_numbers_whatever_the_weights(redis: redis_py.Redis) -> None:
    """Turns, the clock and the last entry are whole units of virtual time, so Redis
    keeps a small queue's turns as integers (a fraction is text it parses at every
    insert among them), weights that do not divide a turn included."""
    make_fair(QUEUE, weights={"gold": 3, "odd": 7}, redis=redis)
    for tenant in ("gold", "odd", "basic"):
        push(redis, tenant, 300)
    fetch = fetcher(redis)
    take_all_n(fetch, 110)  # their head starts: 10 turns each, times the weight
    assert Counter(take_all_n(fetch, 110)) == Counter({"gold": 30, "odd": 70, "basic": 10})
    part = keys.of(redis).fair_part
    scores = [score for _, score in redis.zrange(part(QUEUE, "turns"), 0, -1, withscores=True)]
    state = redis.hgetall(part(QUEUE, "state"))
    assert len(scores) == 3 and all(score == int(score) for score in scores), scores
    assert all(value.isdigit() for value in (state[b"clock"], state[b"entered"])), state


def test_virtual_times_an_earlier_version_wrote_in_fractions_are_rounded_as_read(
    redis: redis_py.Redis,
) -> None:
    """An earlier version counted virtual time in turns, with fractions: such a queue
    keeps serving every tenant in turn, and after a round every time is whole."""
    make_fair(QUEUE, redis=redis)
    for tenant in ("a", "b", "c"):
        push(redis, tenant, 30)
    fetch = fetcher(redis)
    take_all_n(fetch, 30)  # the head starts: every tenant in the rounds now
    part = keys.of(redis).fair_part
    turns = part(QUEUE, "turns")
    old = {b"a": 3.0000009536743164, b"b": 3.0000019073486328, b"c": 3.000002861022949}
    redis.zadd(turns, {name.decode(): score for name, score in old.items()})
    redis.hset(part(QUEUE, "state"), mapping={"clock": "2.0000028610229492", "entered": "0.5"})
    assert Counter(take_all_n(fetch, 30)) == Counter({"a": 10, "b": 10, "c": 10})
    scores = [score for _, score in redis.zrange(turns, 0, -1, withscores=True)]
    assert len(scores) == 3 and all(score == int(score) for score in scores), scores
    assert take_all(fetch) == ["a", "b", "c"] * 10


@pytest.mark.parametrize("count", ["0", "-3"])
def test_a_jobs_count_gone_wrong_does_not_hide_a_tenants_line(
    redis: redis_py.Redis, count: str
) -> None:
    """The count of jobs in the lines says whether a tenant waits; one that says none
    (a key edited by hand, a partial restore) makes the fetch ask the turns instead, so
    the jobs in the lines still come out, all of them."""
    make_fair(QUEUE, redis=redis)
    push(redis, "a", 4)
    push(redis, "b", 4)
    fetch = fetcher(redis)
    first = fetch.take(1, [])  # sorts the arrivals into their lines
    redis.hset(keys.of(redis).fair_part(QUEUE, "state"), "jobs", count)
    fetch.settle(first)
    assert sorted(tenants_of(first) + take_all(fetch)) == ["a"] * 4 + ["b"] * 4


@pytest.mark.parametrize("redis", ["standalone", "cluster"], indirect=True)
def test_the_largest_tenants_are_ranked_by_what_their_lines_hold_after_takes(
    redis: redis_py.Redis,
) -> None:
    """A take does not write the backlog (its score stays the line's length when a job
    last joined it), so the ranking reads the lines: a tenant drained from 10 to 2 ranks
    below one with 5, and the pages of the lines start where the drained line ends."""
    make_fair(QUEUE, redis=redis)
    push(redis, "drained", 10)
    fetch = fetcher(redis)
    taken = take_all_n(fetch, 8)
    assert set(taken) == {"drained"}
    push(redis, "steady", 5)
    fetch.settle(fetch.take(1, []))  # the arrivals sorted into their lines (one taken)
    status = fair_queue_status(QUEUE, redis=redis, top=1)
    assert status is not None and status.largest_exact
    assert [(load.tenant, load.waiting) for load in status.largest] == [("steady", 4)]
    status = fair_queue_status(QUEUE, redis=redis, top=5)
    assert status is not None
    ranked = [(load.tenant, load.waiting) for load in status.largest]
    assert sorted(ranked) == [("drained", 2), ("steady", 4)] and ranked[0] == ("steady", 4)
    page = Queue(QUEUE, redis=redis).page(0, 10)
    assert sorted(entry.jid for entry in page) == sorted(
        ["drained-8", "drained-9"] + [f"steady-{i}" for i in range(1, 5)]
    )


def test_ranking_many_drained_tenants_reads_a_bounded_number_of_lines_per_call(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants drained since any status call hold less than their scores say; one call
    reads at most LARGEST_READ_MAX lines (and says its ranking is not exact then), and
    the calls after it go on from the scores it corrected until the ranking is exact."""
    from limitd.fair_queues import store

    monkeypatch.setattr(store, "LARGEST_READ_MAX", 3)
    make_fair(QUEUE, redis=redis)
    for n, tenant in enumerate(["t1", "t2", "t3", "t4", "t5"]):
        push(redis, tenant, 10 + n)
    push(redis, "last", 5)
    fetch = fetcher(redis)
    fetch.settle(fetch.take(1, []))  # sorted into lines; "t1" gives its first job
    backlog = keys.of(redis).fair_part(QUEUE, "backlog")
    base = keys.of(redis).fair_queue(QUEUE)
    for tenant in ["t1", "t2", "t3", "t4", "t5"]:  # drained to one job, scores untouched
        line = base + ":t:" + tenant
        redis.ltrim(line, -1, -1)
    assert redis.zscore(backlog, "t5") == 14.0
    calls = []
    while True:
        status = fair_queue_status(QUEUE, redis=redis, top=1)
        assert status is not None
        calls.append(status.largest_exact)
        if not status.largest_exact:  # the largest of the lines it read: all drained
            assert [load.waiting for load in status.largest] == [1]
        if status.largest_exact:
            break
        assert len(calls) < 5, calls
    # The first call reads t5, t4 and t3; the second t2, t1 and "last", then it is sure.
    assert calls == [False, True]
    assert [(load.tenant, load.waiting) for load in status.largest] == [("last", 5)]
