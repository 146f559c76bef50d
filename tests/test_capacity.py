"""Limited-capacity jobs (``limitd.LimitedCapacityJob``) through a real Redis: how many
copies are queued and run, hand-over on success, no successor on failure, leases of
dead copies, max_running_jobs changed at run time, and the state the gauges read."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.capacity.commands import add_capacity_command
from limitd.capacity.job import capacity_job
from limitd.capacity.leases import LeaseKeeper
from limitd.capacity.metrics import capacity_metrics
from limitd.capacity.store import CapacityStore, Timing, queued_key, read_states, running_key
from limitd.config import CapsuleConfig
from limitd.supervisor.capsule import Capsule

QUEUE = "imports"


class Backlog:
    """Work kept outside limitd, as a table would keep it; records what ran at once."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.done: list[int] = []
        self.running = 0
        self.most_running = 0
        self.lock = threading.Lock()

    def take(self) -> int | None:
        with self.lock:
            return self.rows.pop(0) if self.rows else None


class Import(limitd.LimitedCapacityJob, name="test_capacity.Import", queue=QUEUE):
    backlog: ClassVar[Backlog] = Backlog()
    maximum: ClassVar[int] = 3
    fail_on: ClassVar[set[int]] = set()

    def perform_work(self, *args: Any) -> None:
        row = self.backlog.take()
        if row is None:
            return
        with self.backlog.lock:
            self.backlog.running += 1
            self.backlog.most_running = max(self.backlog.most_running, self.backlog.running)
        try:
            if row in self.fail_on:
                raise RuntimeError(f"row {row} is broken")
            self.backlog.done.append(row)
        finally:
            with self.backlog.lock:
                self.backlog.running -= 1

    def remaining_work_count(self, *args: Any) -> int:
        return len(self.backlog.rows)

    def max_running_jobs(self) -> int:
        return self.maximum


@pytest.fixture
def backlog(redis: redis_py.Redis) -> Iterator[Backlog]:
    Import.backlog = Backlog()
    Import.maximum = 3
    Import.fail_on = set()
    yield Import.backlog


def store(redis: redis_py.Redis, timing: Timing | None = None) -> CapacityStore:
    return CapacityStore(redis, Import.spec.name, timing)


def queued_copies(redis: redis_py.Redis) -> int:
    return int(redis.llen(keys.of(redis).queue(QUEUE)))


def drain(redis: redis_py.Redis) -> None:
    Capsule(CapsuleConfig(queues=[QUEUE]), redis=redis).drain()


def test_refill_pushes_one_copy_per_free_place_and_never_more(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    backlog.rows = list(range(10))
    first = Import.perform_with_capacity()
    assert len(first) == 3 and queued_copies(redis) == 3
    assert Import.perform_with_capacity() == []  # the queued copies hold every place
    assert queued_copies(redis) == 3
    store(redis).claim(first[0], 3)  # one starts: still three places taken
    assert Import.perform_with_capacity() == []


def test_refill_pushes_no_more_copies_than_work_left(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    backlog.rows = [1]
    assert len(Import.perform_with_capacity()) == 1
    backlog.rows = []
    redis.delete(keys.of(redis).queue(QUEUE), queued_key(keys.of(redis), Import.spec.name))
    assert Import.perform_with_capacity() == []
    assert queued_copies(redis) == 0


def test_copies_hand_over_until_the_backlog_is_empty(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    backlog.rows = list(range(20))
    Import.perform_with_capacity()
    drain(redis)
    assert sorted(backlog.done) == list(range(20))
    assert queued_copies(redis) == 0
    assert redis.zcard(running_key(keys.of(redis), Import.spec.name)) == 0
    assert redis.zcard(queued_key(keys.of(redis), Import.spec.name)) == 0


def test_a_copy_without_a_place_does_no_work_and_pushes_no_successor(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    backlog.rows = list(range(5))
    Import.perform_with_capacity()
    places = store(redis)
    for holder in ("a" * 24, "b" * 24, "c" * 24):  # three copies elsewhere run already
        assert places.claim(holder, 3)
    drain(redis)
    assert backlog.done == [] and backlog.rows == list(range(5))
    assert queued_copies(redis) == 0


def test_a_failing_copy_goes_dead_unretried_and_pushes_no_successor(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    backlog.rows = [7]
    Import.fail_on = {7}
    [jid] = Import.perform_with_capacity()
    drain(redis)
    assert redis.zcard(keys.of(redis).RETRY) == 0
    [dead] = limitd.api.DeadSet()
    assert dead.jid == jid and dead.error_class == "RuntimeError"
    assert queued_copies(redis) == 0
    assert (
        redis.zcard(running_key(keys.of(redis), Import.spec.name)) == 0
    )  # its place is free again
    assert Import.spec.options["retry"] == 0


def test_lowering_the_maximum_starts_no_copy_until_below(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    places = store(redis)
    assert places.claim("a" * 24, 3) and places.claim("b" * 24, 3) and places.claim("c" * 24, 3)
    assert not places.claim("d" * 24, 2)  # lowered to 2: 3 run, none starts
    assert not places.finish("a" * 24, 2, remaining=5, successor="e" * 24)  # 2 run: full
    assert not places.claim("d" * 24, 2)
    assert places.finish("b" * 24, 2, remaining=5, successor="f" * 24)  # 1 runs: f's place
    assert places.claim("f" * 24, 2)
    assert not places.claim("g" * 24, 2)


def test_a_copy_killed_without_finishing_frees_its_place_when_its_lease_ends(
    redis: redis_py.Redis,
) -> None:
    places = store(redis, Timing(lease=10, queued_ttl=100))
    with freeze_time("2026-11-23 12:00:00") as frozen:
        assert places.claim("a" * 24, 1)
        assert not places.claim("b" * 24, 1)
        frozen.tick(9)
        assert places.renew(["a" * 24]) == 1  # a live copy's process renews: kept
        frozen.tick(9)
        assert not places.claim("b" * 24, 1)
        frozen.tick(2)  # ... a killed one's does not: its lease ends 10 s after renewal
        assert places.claim("b" * 24, 1)
        assert places.renew(["a" * 24]) == 0  # too late: the place went to b


def test_a_reservation_whose_copy_never_starts_runs_out(redis: redis_py.Redis) -> None:
    places = store(redis, Timing(lease=10, queued_ttl=100))
    with freeze_time("2026-11-23 12:00:00") as frozen:
        assert places.reserve(1, 5, ["a" * 24]) == ["a" * 24]
        assert places.reserve(1, 5, ["b" * 24]) == []
        frozen.tick(101)
        assert places.reserve(1, 5, ["b" * 24]) == ["b" * 24]


def test_a_requeued_copy_keeps_its_place(redis: redis_py.Redis) -> None:
    """The limit fetch requeues a dead process's copy; it runs again under its jid."""
    places = store(redis)
    assert places.claim("a" * 24, 1)
    assert places.claim("a" * 24, 1)
    assert not places.claim("b" * 24, 1)


def test_the_keeper_renews_what_it_holds_until_dropped(redis: redis_py.Redis) -> None:
    places = store(redis, Timing(lease=0.6, queued_ttl=100))
    keeper = LeaseKeeper()
    assert places.claim("a" * 24, 1)
    first = redis.zscore(running_key(keys.of(redis), Import.spec.name), "a" * 24)
    keeper.hold(places, "a" * 24)
    assert keeper.held() == {Import.spec.name: {"a" * 24}}
    deadline = threading.Event()
    for _ in range(100):  # renewed every lease / 3 = 0.2 s
        if redis.zscore(running_key(keys.of(redis), Import.spec.name), "a" * 24) != first:
            break
        deadline.wait(0.05)
    assert redis.zscore(running_key(keys.of(redis), Import.spec.name), "a" * 24) > first
    keeper.drop(places, "a" * 24)
    assert keeper.held() == {}


def test_a_halted_push_gives_its_place_back(redis: redis_py.Redis, backlog: Backlog) -> None:
    class Halt:
        def __call__(self, spec: Any, payload: Any, conn: Any, call_next: Any) -> None:
            return None

    backlog.rows = list(range(5))
    limitd.default_client().middleware.add(Halt())
    assert Import.perform_with_capacity() == []
    assert redis.zcard(queued_key(keys.of(redis), Import.spec.name)) == 0


def test_the_state_the_gauges_read(redis: redis_py.Redis, backlog: Backlog) -> None:
    backlog.rows = list(range(8))
    jids = Import.perform_with_capacity()
    store(redis).claim(jids[0], 3)
    [state] = read_states(redis)
    assert (state.name, state.running, state.queued) == (Import.spec.name, 1, 2)
    assert (state.max_running_jobs, state.remaining_work_count) == (3, 8)


def test_the_class_is_found_by_its_wire_name() -> None:
    assert capacity_job("test_capacity.Import") is Import
    assert capacity_job("nope") is None


def test_class_mistakes_are_caught_at_definition() -> None:
    with pytest.raises(TypeError, match="must define remaining_work_count, max_running_jobs"):

        class Incomplete(limitd.LimitedCapacityJob, name="test_capacity.Incomplete"):
            def perform_work(self) -> None: ...

    with pytest.raises(TypeError, match="retry must not be set"):

        class Retried(Import, name="test_capacity.Retried", retry=5): ...


def test_a_bad_maximum_is_a_clear_error(redis: redis_py.Redis, backlog: Backlog) -> None:
    Import.maximum = "3"  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"test_capacity.Import.max_running_jobs\(\) must return"):
        Import.perform_with_capacity()


def test_the_command_and_the_gauges_show_the_same_state(
    redis: redis_py.Redis, backlog: Backlog, capsys: pytest.CaptureFixture[str]
) -> None:
    backlog.rows = list(range(8))
    jids = Import.perform_with_capacity()
    store(redis).claim(jids[0], 3)
    parser = argparse.ArgumentParser(prog="limitd")
    add_capacity_command(parser.add_subparsers(), lambda args: redis)
    args = parser.parse_args(["capacity", "--json"])
    assert args.command(args) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in ("name", "running", "queued", "max_running_jobs")} == {
        "name": Import.spec.name,
        "running": 1,
        "queued": 2,
        "max_running_jobs": 3,
    }
    args = parser.parse_args(["capacity"])
    assert args.command(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "RUNNING", "QUEUED", "MAX"]
    assert lines[1].split()[:5] == [Import.spec.name, "1", "2", "3", "8"]
    samples = {
        (family.name, *sample.labels.items()): sample.value
        for family in capacity_metrics(redis)
        for sample in family.samples
    }
    assert samples == {
        ("limitd_limited_capacity_running_jobs", ("job_class", Import.spec.name)): 1,
        ("limitd_limited_capacity_max_running_jobs", ("job_class", Import.spec.name)): 3,
        ("limitd_limited_capacity_remaining_work_count", ("job_class", Import.spec.name)): 8,
        # the same figures under the names of GitLab's LimitedCapacity::Worker
        ("limited_capacity_worker_running_jobs", ("worker", Import.spec.name)): 1,
        ("limited_capacity_worker_max_running_jobs", ("worker", Import.spec.name)): 3,
        ("limited_capacity_worker_remaining_work_count", ("worker", Import.spec.name)): 8,
    }
    assert limitd.api.capacity(redis)[0].running == 1


def test_the_exporter_serves_each_gauge_under_gitlab_names_too(
    redis: redis_py.Redis, backlog: Backlog
) -> None:
    """Dashboards built on GitLab's LimitedCapacity::Worker gauges keep working: a real
    scrape shows each figure under both names, with the same value."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from limitd.capacity.plug import CAPACITY
    from limitd.metrics.exporter import ClusterCollector

    backlog.rows = list(range(5))
    jids = Import.perform_with_capacity()
    store(redis).claim(jids[0], 3)
    registry = CollectorRegistry()
    registry.register(ClusterCollector(redis, lambda: [CAPACITY]))
    text = generate_latest(registry).decode()
    found = {
        (sample.name, *sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    for figure, expected in (
        ("running_jobs", 1),
        ("max_running_jobs", 3),
        ("remaining_work_count", 5),
    ):
        ours = found[(f"limitd_limited_capacity_{figure}", ("job_class", Import.spec.name))]
        theirs = found[(f"limited_capacity_worker_{figure}", ("worker", Import.spec.name))]
        assert ours == theirs == expected, figure
