"""A capsule's threads, measured by the jobs themselves: concurrency, graceful and hard
stop, quiet, replacement of a dead processor, and a Redis restart under load."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.middleware import ServerChain
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for

gate = threading.Event()
running = {"now": 0, "max": 0, "done": 0}
lock = threading.Lock()
barrier: list[threading.Barrier] = []
attempts: list[str] = []


@limitd.job(name="capsule_test.Together")
def together() -> None:
    """Returns only when ``concurrency`` copies run at the same moment."""
    barrier[0].wait(timeout=10)
    with lock:
        running["done"] += 1


@limitd.job(name="capsule_test.Counted")
def counted() -> None:
    with lock:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
    gate.wait(10)
    with lock:
        running["now"] -= 1
        running["done"] += 1


@limitd.job(name="capsule_test.Slow", retry=5)
def slow(tag: str) -> None:
    attempts.append(tag)
    while not gate.wait(0.01):  # pure-Python loop: interruptible by a hard shutdown
        pass


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()
    running.update(now=0, max=0, done=0)
    attempts.clear()


@pytest.fixture
def started(redis: redis_py.Redis) -> Iterator[Capsule]:
    capsule = Capsule(CapsuleConfig(concurrency=5, timeout=2), redis=redis)
    capsule.start()
    yield capsule
    gate.set()
    capsule.stop(timeout=2)


def test_concurrency_threads_run_jobs_at_once(started: Capsule) -> None:
    barrier[:] = [threading.Barrier(5)]
    for _ in range(10):
        together.perform_async()
    wait_for(lambda: running["done"] == 10, message="10 jobs, five at a time")


def test_never_more_than_concurrency(started: Capsule) -> None:
    for _ in range(12):
        counted.perform_async()
    wait_for(lambda: running["now"] == 5, message="five jobs running")
    assert started.busy() == 5
    gate.set()
    wait_for(lambda: running["done"] == 12, message="all jobs")
    assert running["max"] == 5


def test_graceful_stop_waits_for_running_jobs(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(concurrency=2), redis=redis)
    capsule.start()
    counted.perform_async()
    wait_for(lambda: running["now"] == 1, message="job started")
    threading.Timer(0.2, gate.set).start()
    assert capsule.stop(timeout=10) == 0
    assert running["done"] == 1
    assert redis.llen(keys.of(redis).queue("default")) == 0


def test_hard_stop_requeues_unfinished_jobs(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(concurrency=2), redis=redis)
    capsule.start()
    slow.perform_async("a")
    wait_for(lambda: attempts == ["a"], message="slow job started")
    assert capsule.stop(timeout=0.2) == 1
    [job] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    assert json.loads(job)["args"] == ["a"]
    assert redis.zcard(keys.of(redis).RETRY) == 0, "an abandoned job must not also be retried"
    assert capsule.busy() == 0


def test_quiet_takes_no_new_jobs(started: Capsule, redis: redis_py.Redis) -> None:
    counted.perform_async()
    wait_for(lambda: running["now"] == 1, message="job started")
    started.quiet()
    gate.set()
    wait_for(lambda: started.processor_count() == 0, message="processors to finish")
    counted.perform_async()
    assert redis.llen(keys.of(redis).queue("default")) == 1
    assert running["done"] == 1
    assert started.record.quiet


class Crash(BaseException):
    """Not an Exception: escapes every handler, as an interpreter-level fault would."""


class CrashOnce:
    def __init__(self) -> None:
        self.crashed = False

    def __call__(self, spec, payload, queue, call_next):  # type: ignore[no-untyped-def]
        if not self.crashed:
            self.crashed = True
            raise Crash
        return call_next()


def test_dead_processor_is_replaced_and_its_job_kept(redis: redis_py.Redis) -> None:
    capsule = Capsule(
        CapsuleConfig(concurrency=1), redis=redis, middleware=ServerChain([CrashOnce()])
    )
    capsule.start()
    try:
        gate.set()
        counted.perform_async()
        wait_for(lambda: running["done"] == 1, message="job to run after the crash")
        assert capsule.processor_count() == 1
    finally:
        capsule.stop(timeout=2)


def test_redis_restart_under_a_running_capsule(own_redis_server: RedisServer) -> None:
    conn = own_redis_server.client()
    limitd.set_default_client(limitd.Client(conn))
    capsule = Capsule(CapsuleConfig(concurrency=3), redis=own_redis_server.client())
    capsule.start()
    try:
        gate.set()
        counted.perform_async()
        wait_for(lambda: running["done"] == 1, message="first job")
        own_redis_server.restart()
        counted.perform_async()
        wait_for(lambda: running["done"] == 2, timeout=20, message="job after restart")
    finally:
        capsule.stop(timeout=2)
        limitd.set_default_client(None)
        capsule.redis.close()
        conn.close()
