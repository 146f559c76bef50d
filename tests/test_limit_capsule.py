"""Limits as the jobs themselves experience them, with capsules running threads: each job
counts itself in on start and out on finish, and the highest count is asserted."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.queues import limits as queue_limits
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for


class Meter:
    """Concurrency as measured by the jobs, overall and per capsule (thread name)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.running = 0
            self.peak = 0
            self.per_capsule: dict[str, int] = {}
            self.peak_per_capsule: dict[str, int] = {}
            self.done: list[int] = []
            self.started_at_level: list[int] = []

    def enter(self) -> None:
        capsule = threading.current_thread().name.split("-")[1]
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started_at_level.append(self.running)
            count = self.per_capsule.get(capsule, 0) + 1
            self.per_capsule[capsule] = count
            self.peak_per_capsule[capsule] = max(self.peak_per_capsule.get(capsule, 0), count)

    def leave(self, n: int) -> None:
        capsule = threading.current_thread().name.split("-")[1]
        with self.lock:
            self.running -= 1
            self.per_capsule[capsule] -= 1
            self.done.append(n)


meter = Meter()


@limitd.job(name="limit_capsule.Short", queue="limited")
def short(n: int) -> None:
    meter.enter()
    threading.Event().wait(0.002)  # the job's own work: long enough to overlap others
    meter.leave(n)


@limitd.job(name="limit_capsule.Held", queue="limited")
def held(n: int) -> None:
    meter.enter()
    meter.gate.wait(10)
    meter.leave(n)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    meter.reset()
    meter.gate.clear()
    yield
    meter.gate.set()


def run_capsules(redis: redis_py.Redis, *configs: CapsuleConfig) -> list[Capsule]:
    capsules = [Capsule(config, redis=redis) for config in configs]
    for capsule in capsules:
        capsule.start()
    return capsules


def stop_all(capsules: list[Capsule]) -> None:
    meter.gate.set()
    for capsule in capsules:
        capsule.stop(timeout=5)


def run_short_jobs(redis: redis_py.Redis, count: int, *configs: CapsuleConfig) -> None:
    """Run ``count`` short jobs to the end on capsules with these configs."""
    capsules = run_capsules(redis, *configs)
    try:
        short.perform_bulk([[i] for i in range(count)])
        wait_for(lambda: len(meter.done) == count, timeout=60, message=f"{count} jobs")
    finally:
        stop_all(capsules)


def config(name: str, **options: object) -> CapsuleConfig:
    return CapsuleConfig(name=name, queues=["limited", "other"], concurrency=10, **options)  # type: ignore[arg-type]


def test_global_limit_is_reached_and_never_exceeded(redis: redis_py.Redis) -> None:
    run_short_jobs(
        redis, 400, config("a", limits={"limited": 3}), config("b", limits={"limited": 3})
    )
    assert meter.peak == 3
    assert queue_limits.busy(redis, "limited") == 0


def test_process_limit_holds_in_each_capsule(redis: redis_py.Redis) -> None:
    run_short_jobs(
        redis,
        400,
        config("a", process_limits={"limited": 2}),
        config("b", process_limits={"limited": 2}),
    )
    assert meter.peak_per_capsule == {"a": 2, "b": 2}
    assert meter.peak == 4


def test_both_limits_hold_together(redis: redis_py.Redis) -> None:
    both = {"limits": {"limited": 3}, "process_limits": {"limited": 2}}
    run_short_jobs(redis, 400, config("a", **both), config("b", **both))
    assert meter.peak == 3
    assert max(meter.peak_per_capsule.values()) == 2


def test_runtime_limit_change_applies_without_restart(redis: redis_py.Redis) -> None:
    capsules = run_capsules(redis, config("a", limits={"limited": 3}))
    try:
        held.perform_bulk([[i] for i in range(8)])
        wait_for(lambda: meter.running == 3, message="three jobs at the limit")
        queue_limits.set_limit(redis, "limited", 1)
        already = len(meter.started_at_level)
        meter.gate.set()
        wait_for(lambda: len(meter.done) == 8, message="all jobs")
    finally:
        stop_all(capsules)
    assert meter.started_at_level[already:] == [1] * 5


def test_runtime_limit_survives_a_restart(redis: redis_py.Redis) -> None:
    stop_all(run_capsules(redis, config("a", limits={"limited": 3})))
    queue_limits.set_limit(redis, "limited", 1)
    capsules = run_capsules(redis, config("a", limits={"limited": 3}))
    try:
        assert queue_limits.get_limit(redis, "limited") == 1
        short.perform_bulk([[i] for i in range(50)])
        wait_for(lambda: len(meter.done) == 50, message="50 jobs")
    finally:
        stop_all(capsules)
    assert meter.peak == 1


def test_pause_and_resume(redis: redis_py.Redis) -> None:
    queue_limits.pause(redis, "limited")
    capsules = run_capsules(redis, config("a", poll_range=(0.01, 0.02)))
    try:
        short.perform_bulk([[i] for i in range(5)])
        limitd.Client(redis).push({"class": "limit_capsule.Short", "args": [99], "queue": "other"})
        wait_for(lambda: meter.done == [99], message="the unpaused queue's job")
        assert redis.llen(keys.of(redis).queue("limited")) == 5
        queue_limits.resume(redis, "limited")
        wait_for(lambda: len(meter.done) == 6, message="jobs after resume")
    finally:
        stop_all(capsules)


def test_an_idle_capsule_starts_a_pushed_job_without_polling(redis: redis_py.Redis) -> None:
    """The fallback poll is 30 s: only the wake-up signal can start these in time."""
    capsules = run_capsules(redis, config("a", poll_range=(30.0, 30.0)))
    try:
        idle = capsules[0]
        wait_for(
            lambda: idle.dispatcher.waiting == 10 and idle.gate._waiting == 1,
            message="idle capsule: every processor waiting, the dispatcher on the gate",
        )
        short.perform_async(1)
        wait_for(lambda: meter.done == [1], timeout=15, message="job started by wake-up")
        short.perform_bulk([[i] for i in range(2, 30)])
        wait_for(lambda: len(meter.done) == 29, timeout=15, message="a burst")
    finally:
        stop_all(capsules)
    assert meter.peak > 1, "a burst wakes more than one thread"


def test_a_freed_slot_wakes_waiting_capsules(redis: redis_py.Redis) -> None:
    capsules = run_capsules(
        redis,
        config("a", limits={"limited": 1}, poll_range=(30.0, 30.0)),
        config("b", limits={"limited": 1}, poll_range=(30.0, 30.0)),
    )
    try:
        held.perform_bulk([[1], [2]])
        wait_for(lambda: meter.running == 1, message="first job holding the only slot")
        meter.gate.set()
        wait_for(lambda: len(meter.done) == 2, timeout=15, message="second job after the ack")
    finally:
        stop_all(capsules)


def test_dynamic_capsule_picks_up_new_queues(redis: redis_py.Redis) -> None:
    capsules = run_capsules(
        redis, CapsuleConfig(name="dyn", queues=["other"], dynamic=True, poll_range=(0.05, 0.1))
    )
    try:
        short.perform_bulk([[i] for i in range(5)])  # queue "limited", not configured
        wait_for(lambda: len(meter.done) == 5, message="jobs of a discovered queue")
    finally:
        stop_all(capsules)


def test_flushed_redis_under_running_capsules(redis: redis_py.Redis) -> None:
    capsules = run_capsules(redis, config("a", limits={"limited": 2}))
    try:
        held.perform_bulk([[i] for i in range(2)])
        wait_for(lambda: meter.running == 2, message="two jobs running")
        redis.flushall()
        meter.gate.set()
        wait_for(lambda: len(meter.done) == 2, message="running jobs finish")
        assert queue_limits.busy(redis, "limited") == 0
        capsules[0].beat()  # re-registers, re-applies configured limits
        assert queue_limits.get_limit(redis, "limited") == 2
        assert redis.sismember(keys.of(redis).CAPSULES, capsules[0].id)
        meter.reset()
        short.perform_bulk([[i] for i in range(50)])
        wait_for(lambda: len(meter.done) == 50, message="work after the flush")
    finally:
        stop_all(capsules)
    assert meter.peak == 2
    assert int(redis.hget(keys.of(redis).BUSY, "limited") or 0) == 0


def test_redis_restart_mid_run_loses_and_leaks_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = RedisServer(data_dir=str(tmp_path), appendonly=True)
    server.start()
    conn = server.client()
    limitd.set_default_client(limitd.Client(conn))
    capsules = run_capsules(
        conn, config("a", limits={"limited": 3}, poll_range=(0.05, 0.1), heartbeat_period=0.5)
    )
    try:
        short.perform_bulk([[i] for i in range(300)])
        wait_for(lambda: len(meter.done) >= 50, message="some progress")
        server.restart()
        wait_for(
            lambda: set(meter.done) == set(range(300)),
            timeout=60,
            message="every job done at least once",
        )
        wait_for(lambda: queue_limits.busy(conn, "limited") == 0, message="no busy slot")
    finally:
        stop_all(capsules)
        limitd.set_default_client(None)
        conn.close()
        server.stop()
    assert meter.peak <= 3
