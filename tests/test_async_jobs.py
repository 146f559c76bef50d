"""Async jobs in one in-process capsule, measured by the jobs themselves: the event loop
runs far more jobs than threads (never more than ``async_concurrency``), failures,
class jobs, ``current_payload``, unique, batches and limiters behave as for sync jobs, a
hard stop requeues and cancels, a blocked loop is reported, TTIN stacks name the job,
``drain`` runs async jobs, the process record counts them, and a server middleware
without ``acall`` still wraps them. Waits are on events and counters with deadlines."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.limiters.limiter import OverLimit
from limitd.middleware import ServerChain
from limitd.middleware.defaults import default_server_chain
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.supervisor.async_lane import AsyncLane, blocked_for
from limitd.unique import middleware as unique
from tests.helpers import wait_for

DEADLINE = 10.0  # how long a job waits for the test before it gives up


class Meter:
    """What the jobs saw: how many ran at once, which finished, which were cancelled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.now = 0
            self.peak = 0
            self.entered = 0
            self.done: list[Any] = []
            self.cancelled: list[Any] = []
            self.seen: list[Any] = []
        self.gate.clear()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.entered += 1
            self.peak = max(self.peak, self.now)

    def leave(self, n: Any, *, cancelled: bool = False) -> None:
        with self.lock:
            self.now -= 1
            (self.cancelled if cancelled else self.done).append(n)

    def record(self, item: Any) -> None:
        with self.lock:
            self.seen.append(item)


meter = Meter()


async def until(condition: Callable[[], bool], timeout: float = DEADLINE) -> None:
    """Yield to the loop until ``condition`` holds: other jobs run meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the test did not release the job in time")
        await asyncio.sleep(0.005)


async def held(n: Any) -> None:
    """Count this job in, wait on the test's gate, count it out (or as cancelled)."""
    meter.enter()
    try:
        await until(meter.gate.is_set)
    except asyncio.CancelledError:
        meter.leave(n, cancelled=True)
        raise
    meter.leave(n)


@limitd.job(name="async_test.Gated")
async def gated(n: int) -> None:
    await held(n)


@limitd.job(name="async_test.Forever")
async def forever(n: int) -> None:
    """Waits past any stop timeout: only a cancellation ends it."""
    meter.enter()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        meter.leave(n, cancelled=True)
        raise


@limitd.job(name="async_test.Quick")
async def quick(n: int) -> None:
    await asyncio.sleep(0)
    meter.record(("async", n))


@limitd.job(name="async_test.LoopKind")
async def loop_kind(n: int) -> None:
    await asyncio.sleep(0.001)  # a timer, which uvloop keeps in libuv
    meter.record(("loop", type(asyncio.get_running_loop()).__module__))


@limitd.job(name="async_test.Sync")
def sync_job(n: int) -> None:
    meter.record(("sync", n))


@limitd.job(name="async_test.AsyncFails")
async def async_fails(n: int) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(f"upstream down {n}")


@limitd.job(name="async_test.SyncFails")
def sync_fails(n: int) -> None:
    raise RuntimeError(f"upstream down {n}")


@limitd.job(name="async_test.Doomed", retry=0)
async def doomed(n: int) -> None:
    raise ValueError(f"never works {n}")


class ClassJob(limitd.Job, name="async_test.ClassJob"):
    async def perform(self, n: int) -> None:
        await asyncio.sleep(0)
        current = limitd.current_payload() or {}
        meter.record((n, self.jid, self.payload["args"], current.get("jid")))


@limitd.job(name="async_test.WhoAmI")
async def who_am_i(n: int) -> None:
    """Reads its payload before and after every other copy started: interleaved."""
    before = limitd.current_payload() or {}
    meter.enter()
    await until(lambda: meter.entered >= 20)
    await asyncio.sleep(0.001)
    after = limitd.current_payload() or {}
    meter.record((n, before.get("args"), after.get("args"), before.get("jid"), after.get("jid")))
    meter.leave(n)


@limitd.job(name="async_test.UniqueExecuted", unique_for=600)
async def unique_executed(n: int) -> None:
    await held(n)


@limitd.job(name="async_test.UniqueExecuting", unique_for=600, unique_until="executing")
async def unique_executing(n: int) -> None:
    await held(n)


@limitd.job(name="async_test.BatchWork")
async def batch_work(n: int) -> None:
    await asyncio.sleep(0.001)
    meter.record(n)


@limitd.job(name="async_test.Callback", queue="callbacks")
def callback(status: dict, options: dict) -> None: ...


@limitd.job(name="async_test.OverLimited")
async def over_limited(n: int) -> None:
    await asyncio.sleep(0)
    raise OverLimit("async_test", "concurrent", 0.0)


@limitd.job(name="async_test.Blocker")
async def blocker() -> None:
    time.sleep(0.6)  # the mistake the watch thread reports: a sync call on the loop
    meter.record("blocker")


@limitd.job(name="async_test.Polite")
async def polite() -> None:
    await asyncio.sleep(0.6)
    meter.record("polite")


@limitd.job(name="async_test.Stacked")
async def stacked_job_body(n: int) -> None:
    await held(n)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    meter.reset()
    yield
    meter.gate.set()


class Capsules:
    """Capsules of one test: started on demand, stopped at its end (unless stopped)."""

    def __init__(self, redis: redis_py.Redis) -> None:
        self.redis = redis
        self.running: list[Capsule] = []

    def start(self, middleware: ServerChain | None = None, **settings: Any) -> Capsule:
        config = CapsuleConfig(**{"concurrency": 2, "timeout": 2, **settings})
        capsule = Capsule(config, redis=self.redis, middleware=middleware)
        capsule.start()
        self.running.append(capsule)
        return capsule

    def stop(self, capsule: Capsule, timeout: float) -> int:
        self.running.remove(capsule)
        return capsule.stop(timeout=timeout)


@pytest.fixture
def capsules(redis: redis_py.Redis) -> Iterator[Capsules]:
    made = Capsules(redis)
    yield made
    meter.gate.set()
    for capsule in list(made.running):
        made.stop(capsule, timeout=2)


def in_progress(redis: redis_py.Redis) -> int:
    return sum(int(redis.llen(k)) for k in redis.scan_iter(keys.of(redis).in_progress("*", "*")))


def queued_or_held(redis: redis_py.Redis) -> int:
    """Jobs of "default" waiting or held by a capsule, read at one instant (a MULTI: the
    queue and the in-progress lists share its slot in both layouts), so a job fetched
    between two reads is not counted twice."""
    held = list(redis.scan_iter(keys.of(redis).in_progress("*", "default")))
    pipe = redis.pipeline(transaction=True)
    pipe.llen(keys.of(redis).queue("default"))
    for key in held:
        pipe.llen(key)
    return sum(int(n) for n in pipe.execute())


def settled(redis: redis_py.Redis) -> Callable[[], bool]:
    """True once no job is queued or held by any capsule (every job acknowledged)."""
    return lambda: redis.llen(keys.of(redis).queue("default")) == 0 and in_progress(redis) == 0


def messages(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if containing in r.getMessage()]


# 1. Many async jobs on few threads, never more than async_concurrency.


def test_async_and_sync_jobs_run_in_one_capsule(capsules: Capsules, redis) -> None:
    capsules.start()
    for n in range(5):
        quick.perform_async(n)
        sync_job.perform_async(n)
    wait_for(lambda: len(meter.seen) == 10, message="five async and five sync jobs")
    assert sorted(meter.seen) == sorted(
        [("async", n) for n in range(5)] + [("sync", n) for n in range(5)]
    )
    wait_for(settled(redis), message="every job acknowledged")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_async_loop_picks_the_event_loop_jobs_run_on(capsules: Capsules, redis, loop: str) -> None:
    capsule = capsules.start(async_loop=loop)
    loop_kind.perform_bulk([[n] for n in range(20)])
    wait_for(lambda: len(meter.seen) == 20, message="twenty async jobs")
    modules = {module for _, module in meter.seen}
    assert modules == {"uvloop" if loop == "uvloop" else "asyncio.unix_events"}
    wait_for(settled(redis), message="every job acknowledged")
    assert capsules.stop(capsule, timeout=2) == 0  # nothing left to requeue


def test_the_basic_fetch_runs_async_jobs_too(capsules: Capsules, redis) -> None:
    capsules.start(fetch="basic")
    for n in range(5):
        quick.perform_async(n)
        sync_job.perform_async(n)
    wait_for(lambda: len(meter.seen) == 10, message="five async and five sync jobs")
    assert sorted(meter.seen) == sorted(
        [("async", n) for n in range(5)] + [("sync", n) for n in range(5)]
    )
    assert redis.llen(keys.of(redis).queue("default")) == 0


def test_fifty_async_jobs_in_flight_on_two_threads_and_never_more(
    capsules: Capsules, redis
) -> None:
    capsule = capsules.start(concurrency=2, async_concurrency=50)
    gated.perform_bulk([[n] for n in range(60)])
    wait_for(lambda: meter.now == 50, message="fifty async jobs at once")
    # The ten others are fetched or queued, not running: the loop is full.
    assert meter.peak == 50
    assert queued_or_held(redis) == 60
    meter.gate.set()
    wait_for(lambda: len(meter.done) == 60, message="all sixty jobs")
    assert meter.peak == 50, "never more than async_concurrency on the loop"
    assert sorted(meter.done) == list(range(60))
    wait_for(settled(redis), message="every job acknowledged")
    assert capsule.lane is not None and capsule.lane.size == 50


# 2. Failures: the same retry as a sync job, and the dead set.


def retry_entries(redis: redis_py.Redis) -> dict[str, tuple[dict[str, Any], float]]:
    return {
        json.loads(raw)["class"]: (json.loads(raw), score)
        for raw, score in redis.zrange(keys.of(redis).RETRY, 0, -1, withscores=True)
    }


def test_an_async_failure_is_retried_as_a_sync_one(capsules: Capsules, redis) -> None:
    capsules.start()
    async_fails.perform_async(1)
    sync_fails.perform_async(1)
    wait_for(lambda: redis.zcard(keys.of(redis).RETRY) == 2, message="both jobs in the retry set")
    entries = retry_entries(redis)
    (failed_async, at_async) = entries["async_test.AsyncFails"]
    (failed_sync, at_sync) = entries["async_test.SyncFails"]
    assert set(failed_async) == set(failed_sync)
    fields = ("retry_count", "error_class", "error_message", "queue", "retry")
    assert [failed_async[f] for f in fields] == [failed_sync[f] for f in fields]
    assert (failed_async["retry_count"], failed_async["error_class"]) == (0, "RuntimeError")
    assert failed_async["error_message"] == "upstream down 1"
    # Sidekiq's first backoff: 15 s + up to 9 s of jitter after the failure.
    for entry, at in ((failed_async, at_async), (failed_sync, at_sync)):
        assert 15 <= at - entry["failed_at"] <= 24 + 0.01
    wait_for(settled(redis), message="both acknowledged")


def test_an_async_job_out_of_retries_is_dead(capsules: Capsules, redis) -> None:
    capsules.start()
    jid = doomed.perform_async(3)
    wait_for(lambda: redis.zcard(keys.of(redis).DEAD) == 1, message="the job in the dead set")
    [raw] = redis.zrange(keys.of(redis).DEAD, 0, -1)
    dead = json.loads(raw)
    assert (dead["jid"], dead["error_class"], dead["error_message"]) == (
        jid,
        "ValueError",
        "never works 3",
    )
    assert redis.zcard(keys.of(redis).RETRY) == 0
    wait_for(settled(redis), message="acknowledged")


# 3. Class jobs and current_payload.


def test_a_class_job_with_async_perform_has_its_jid_and_payload(capsules: Capsules, redis) -> None:
    capsules.start()
    jid = ClassJob.perform_async(7)
    wait_for(lambda: len(meter.seen) == 1, message="the class job ran")
    assert meter.seen == [(7, jid, [7], jid)]


def test_current_payload_is_each_async_jobs_own_while_interleaved(
    capsules: Capsules, redis
) -> None:
    capsules.start(async_concurrency=50)
    jids = who_am_i.perform_bulk([[n] for n in range(20)])
    wait_for(lambda: len(meter.seen) == 20, message="twenty interleaved jobs")
    assert meter.peak == 20, "all twenty were on the loop at once"
    by_n = {
        n: (before, after, jid_before, jid_after)
        for n, before, after, jid_before, jid_after in meter.seen
    }
    for n, jid in enumerate(jids):
        assert by_n[n] == ([n], [n], jid, jid)


# 4. Unique and batch.


def lock_of(redis: redis_py.Redis, job: str, args: list[Any]) -> bytes | None:
    return redis.get(keys.of(redis).unique_lock(job, "default", unique.args_digest(args)))


def test_unique_until_executed_frees_the_lock_after_the_async_job_ran(
    capsules: Capsules, redis
) -> None:
    capsules.start()
    jid = unique_executed.perform_async(1)
    assert unique_executed.perform_async(1) is None
    wait_for(lambda: meter.now == 1, message="the job running")
    assert lock_of(redis, "async_test.UniqueExecuted", [1]) == jid.encode()  # type: ignore[union-attr]
    meter.gate.set()
    wait_for(lambda: meter.done == [1], message="the job done")
    wait_for(
        lambda: lock_of(redis, "async_test.UniqueExecuted", [1]) is None,
        message="the lock freed",
    )
    assert unique_executed.perform_async(1) is not None


def test_unique_until_executing_frees_the_lock_when_the_async_job_starts(
    capsules: Capsules, redis
) -> None:
    # Both pushes before the capsule runs: once it has started the first copy, the lock
    # is gone and a second push is rightly accepted.
    unique_executing.perform_async(2)
    assert unique_executing.perform_async(2) is None
    capsules.start()
    wait_for(lambda: meter.now == 1, message="the job running")
    assert lock_of(redis, "async_test.UniqueExecuting", [2]) is None
    assert unique_executing.perform_async(2) is not None  # a new copy while it runs
    wait_for(lambda: meter.now == 2, message="the second copy running")
    meter.gate.set()
    wait_for(lambda: sorted(meter.done) == [2, 2], message="both copies done")


def callback_events(redis: redis_py.Redis) -> list[str]:
    bodies = [
        json.loads(raw) for raw in reversed(redis.lrange(keys.of(redis).queue("callbacks"), 0, -1))
    ]
    return [body["args"][0]["event"] for body in bodies]


def test_a_batch_of_async_jobs_fires_its_success_once(capsules: Capsules, redis) -> None:
    batch = limitd.Batch("async batch")
    batch.on("success", callback, {})
    batch.on("complete", callback, {})
    with batch.jobs():
        batch_work.perform_bulk([[n] for n in range(10)])
    capsules.start(queues=["default"])  # not "callbacks": the test reads that queue
    wait_for(lambda: len(meter.seen) == 10, message="the batch's jobs")
    wait_for(lambda: limitd.Batch.status(batch.bid).success, message="the batch succeeded")
    wait_for(settled(redis), message="every job acknowledged")
    # In cluster mode the callbacks wait in the hand-off set until the acknowledging
    # capsule pushes them, just after the batch records its success.
    wait_for(lambda: redis.zcard(keys.of(redis).MOVING) == 0, message="the callbacks pushed")
    assert sorted(callback_events(redis)) == ["complete", "success"]
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending, status.complete) == (10, 0, True)


# 5. Limiters.


def test_over_limit_out_of_an_async_job_reschedules_it(
    capsules: Capsules, redis, caplog: pytest.LogCaptureFixture
) -> None:
    capsules.start()
    jid = over_limited.perform_async(1)
    wait_for(lambda: redis.zcard(keys.of(redis).SCHEDULE) == 1, message="the job rescheduled")
    [raw] = redis.zrange(keys.of(redis).SCHEDULE, 0, -1)
    payload = json.loads(raw)
    assert (payload["jid"], payload["overlimit_count"]) == (jid, 1)
    assert "retry_count" not in payload
    assert redis.zcard(keys.of(redis).RETRY) == redis.zcard(keys.of(redis).DEAD) == 0
    wait_for(lambda: messages(caplog, f"rescheduled jid={jid}"), message="its outcome logged")
    wait_for(settled(redis), message="acknowledged")


# 6. Hard stop.


def test_a_stop_past_the_timeout_requeues_and_cancels_async_jobs(capsules: Capsules, redis) -> None:
    capsule = capsules.start(async_concurrency=10)
    forever.perform_bulk([[n] for n in range(5)])
    wait_for(lambda: meter.now == 5, message="five jobs on the loop")
    assert capsules.stop(capsule, timeout=0.5) == 5
    assert redis.llen(keys.of(redis).queue("default")) == 5
    requeued = sorted(
        json.loads(raw)["args"][0] for raw in redis.lrange(keys.of(redis).queue("default"), 0, -1)
    )
    assert requeued == [0, 1, 2, 3, 4]
    assert in_progress(redis) == 0
    wait_for(lambda: len(meter.cancelled) == 5, message="every task cancelled")
    assert sorted(meter.cancelled) == [0, 1, 2, 3, 4] and meter.done == []
    assert redis.zcard(keys.of(redis).RETRY) == redis.zcard(keys.of(redis).DEAD) == 0
    assert capsule.busy() == 0


# 7. A blocked loop is reported.


def test_a_job_blocking_the_loop_is_named_in_a_warning(
    capsules: Capsules, redis, caplog: pytest.LogCaptureFixture
) -> None:
    capsule = capsules.start(async_block_warning=0.2)
    assert isinstance(capsule.lane, AsyncLane)
    assert capsule.lane._loop_cpu() is not None  # on Linux the watch reads the loop's CPU
    polite.perform_async()
    wait_for(lambda: "polite" in meter.seen, message="the well-behaved job")
    assert messages(caplog, "event loop blocked") == []
    jid = blocker.perform_async()
    wait_for(lambda: "blocker" in meter.seen, message="the blocking job")
    wait_for(lambda: messages(caplog, "event loop blocked"), message="the warning")
    [warning] = [r for r in caplog.records if "event loop blocked" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"async_test.Blocker jid={jid}" in warning.getMessage()


# 8. TTIN stacks.


def test_task_stacks_name_the_async_job_and_its_function(
    capsules: Capsules, redis, caplog: pytest.LogCaptureFixture
) -> None:
    capsule = capsules.start()
    jid = stacked_job_body.perform_async(1)
    wait_for(lambda: meter.now == 1, message="the job waiting")
    caplog.clear()
    assert capsule.lane is not None
    capsule.lane.log_task_stacks()
    [stack] = messages(caplog, "async task")
    assert f"async_test.Stacked jid={jid}" in stack
    assert "stacked_job_body" in stack, stack


# 9. drain.


@pytest.fixture
def unstarted(redis: redis_py.Redis) -> Capsule:
    """A capsule only drained, never started."""
    return Capsule(CapsuleConfig(), redis=redis)


def test_drain_runs_async_and_sync_jobs_in_the_calling_thread(unstarted: Capsule, redis) -> None:
    quick.perform_async(1)
    sync_job.perform_async(2)
    jid = ClassJob.perform_async(3)
    outcomes = unstarted.drain()
    assert redis.llen(keys.of(redis).queue("default")) == 0 and in_progress(redis) == 0
    assert sorted(map(repr, meter.seen)) == sorted(
        map(repr, [("async", 1), ("sync", 2), (3, jid, [3], jid)])
    )
    assert outcomes == {"done": 3}


# 10. The process record.


def test_the_process_record_counts_running_async_jobs(capsules: Capsules, redis) -> None:
    capsule = capsules.start(concurrency=2, async_concurrency=10)
    jids = gated.perform_bulk([[n] for n in range(5)])
    wait_for(lambda: meter.now == 5, message="five jobs on the loop")
    wait_for(lambda: capsule.busy() == 5, message="five busy")
    work = capsule.work()
    assert sorted(json.loads(item.payload)["jid"] for item in work) == sorted(jids)
    assert len({item.thread for item in work}) == 5
    capsule.record.write(redis)
    assert redis.hget(capsule.identity, "busy") == b"5"
    meter.gate.set()
    wait_for(lambda: capsule.busy() == 0, message="none busy")


# 11. A server middleware without acall.


class Watcher:
    """A sync server middleware (no ``acall``): it must run on a worker thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, str]] = []

    def __call__(self, spec, payload, queue, call_next):  # type: ignore[no-untyped-def]
        self.calls.append(("before", payload["args"], threading.current_thread().name))
        if payload["args"] == [99]:
            raise PermissionError("stopped by the watcher")
        result = call_next()
        self.calls.append(("after", payload["args"], threading.current_thread().name))
        return result


def test_a_middleware_without_acall_wraps_async_jobs(
    capsules: Capsules, redis, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = Watcher()
    chain = default_server_chain(redis)
    chain.add(watcher)
    capsules.start(middleware=chain)
    assert messages(caplog, "without acall() run async jobs on a worker thread")
    quick.perform_async(1)
    wait_for(lambda: meter.seen == [("async", 1)], message="the job ran")
    wait_for(lambda: len(watcher.calls) == 2, message="the middleware after the job")
    [(before, args, thread), (after, args_after, _)] = watcher.calls
    assert (before, args, after, args_after) == ("before", [1], "after", [1])
    assert "async-worker" in thread
    quick.perform_async(99)
    wait_for(lambda: redis.zcard(keys.of(redis).RETRY) == 1, message="the stopped job retried")
    [raw] = redis.zrange(keys.of(redis).RETRY, 0, -1)
    assert json.loads(raw)["error_class"] == "PermissionError"
    assert meter.seen == [("async", 1)], "the stopped job did not run"


def test_async_jobs_go_to_the_loop_from_the_fetching_thread_not_through_processors(
    capsules: Capsules, redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the loop has room, whoever made a fetch call hands it the async jobs in one
    batch (``AsyncLane.take_fetched``): no processor passes one on (``submit``)."""
    passed_on: list[Any] = []
    submit = AsyncLane.submit

    def counted(self: AsyncLane, *args: Any) -> None:
        passed_on.append(args)
        submit(self, *args)

    monkeypatch.setattr(AsyncLane, "submit", counted)
    capsules.start(concurrency=2, async_concurrency=50)
    gated.perform_bulk([[n] for n in range(30)])
    wait_for(lambda: meter.now == 30, message="thirty async jobs at once")
    meter.gate.set()
    wait_for(lambda: len(meter.done) == 30, message="all thirty jobs")
    wait_for(settled(redis), message="every job acknowledged")
    assert passed_on == []


def test_jobs_waiting_for_a_loop_slot_are_not_counted_as_running(capsules: Capsules, redis) -> None:
    """A full loop parks a tenth of its slots' worth of fetched jobs, which start as
    slots free, and fetches no more: the processors hold none while every job is async."""
    capsule = capsules.start(concurrency=2, async_concurrency=50)
    gated.perform_bulk([[n] for n in range(60)])
    wait_for(lambda: meter.now == 50, message="fifty async jobs at once")
    wait_for(lambda: redis.llen(keys.of(redis).queue("default")) == 5, message="55 fetched")
    lane = capsule.lane
    assert lane is not None
    # The last five reach the lane a moment after Redis gave them (the fetch's reply is
    # read, then handed over): parked, not running.
    wait_for(lambda: lane.holding() == 55, message="the five fetched last parked")
    assert capsule.busy() == 50
    assert len(lane.running()) == 50
    meter.gate.set()
    wait_for(lambda: len(meter.done) == 60, message="all sixty jobs")
    assert meter.peak == 50


def test_sync_jobs_still_run_while_the_loop_is_busy_with_async_ones(
    capsules: Capsules, redis
) -> None:
    """The capsule fetches for the loop alone while every job is async; a sync job then
    comes with the loop's batch and goes to a processor."""
    capsules.start(concurrency=2, async_concurrency=50)
    gated.perform_bulk([[n] for n in range(20)])
    wait_for(lambda: meter.now == 20, message="twenty async jobs at once")
    sync_job.perform_bulk([[n] for n in range(3)])
    wait_for(lambda: len(meter.seen) == 3, message="the sync jobs, beside the async ones")
    assert sorted(meter.seen) == [("sync", 0), ("sync", 1), ("sync", 2)]
    assert meter.now == 20 and meter.done == []


def test_a_hard_stop_requeues_the_parked_jobs_and_never_starts_them(
    capsules: Capsules, redis
) -> None:
    capsule = capsules.start(async_concurrency=10)  # one job parked at most
    forever.perform_bulk([[n] for n in range(12)])
    wait_for(lambda: meter.now == 10, message="ten jobs on the loop")
    assert capsule.lane is not None
    wait_for(lambda: capsule.lane.holding() == 11, message="one more parked")
    assert capsules.stop(capsule, timeout=0.5) == 11
    assert redis.llen(keys.of(redis).queue("default")) == 12
    assert in_progress(redis) == 0
    wait_for(lambda: len(meter.cancelled) == 10, message="every running task cancelled")
    assert meter.entered == 10, "the parked job never started"


# A capsule that is never started.


def test_a_capsule_never_started_opens_no_event_loop(redis) -> None:
    """Drained capsules (tests, scripts) never start their lane: nothing may be left
    open for the collector to warn about."""
    capsule = Capsule(CapsuleConfig(), redis=redis)
    assert capsule.lane is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        capsule.drain()
        del capsule
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


# 7b. When a stall is the loop's.


@pytest.mark.parametrize(
    ("now", "pulse", "ticked", "loop_busy", "blocked"),
    [
        (10.0, None, 9.95, True, None),  # the loop has not beaten yet: a slow start
        (10.0, 9.9, 9.95, True, None),  # beat 0.1 s ago: within the 0.2 s threshold
        (10.0, 9.7, 9.95, False, 0.3),  # 0.3 s without a beat while the watch kept time
        (10.0, 9.7, 9.7, False, None),  # the watch overslept, the loop idle: held up
        (10.0, 9.4, 9.4, True, 0.6),  # the watch overslept, the loop busy: a job in C
        (10.0, 9.5, 9.9, False, 0.5),  # the watch 0.05 s late, not 0.1: the loop's stall
    ],
)
def test_a_stall_counts_when_the_watch_kept_time_or_the_loop_was_busy(
    now: float, pulse: float | None, ticked: float, loop_busy: bool, blocked: float | None
) -> None:
    late = blocked_for(now, pulse, ticked, 0.2, loop_busy=loop_busy)
    assert late == (pytest.approx(blocked) if blocked is not None else None)


def test_the_young_generation_threshold_is_raised_unless_the_app_set_one() -> None:
    import gc

    from limitd.supervisor.launcher import collect_young_less_often

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        collect_young_less_often()
        assert gc.get_threshold() == (10_000, 10, 10)
        gc.set_threshold(5000, 20, 20)  # the app's own tuning stays
        collect_young_less_often()
        assert gc.get_threshold() == (5000, 20, 20)
    finally:
        gc.set_threshold(*saved)
