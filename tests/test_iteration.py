"""Iterable jobs and cancelling, through real Redis in one process (standalone and
cluster): a walk saved item by item, a run stopped by its capsule's quiet and resumed
after the last item done, slices that give way to the jobs queued behind, a failure
retried from its cursor, async jobs, cancelling a queued, scheduled or running job, and
the class's mistakes. Under ``limitd start`` with SIGTERM: test_iteration_processes.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.api import RetrySet, ScheduledSet, batch_status, cancel, iteration_progress
from limitd.iteration.job import items_of, numbers
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.supervisor.processor import Processor
from tests.helpers import command_runner

done: list[Any] = []
hooks: list[str] = []
stop_after: dict[str, int] = {}  # class -> item after which the capsule quiets
fail_at: set[int] = set()


class Walk(limitd.IterableJob, name="iteration_test.Walk"):
    def build_items(self, count: int, *, cursor: int | None) -> Iterator[tuple[int, int]]:
        return iter(numbers(0, count, cursor))

    def each_item(self, item: int, count: int) -> None:
        done.append(item)
        if item in fail_at:
            fail_at.discard(item)
            raise RuntimeError(f"item {item} failed")
        if stop_after.get("Walk") == item:
            _quiet_the_capsule()

    def on_start(self, count: int) -> None:
        hooks.append("start")

    def on_resume(self, count: int) -> None:
        hooks.append(f"resume at {self.cursor} after {self.items_done}")

    def on_stop(self, count: int) -> None:
        hooks.append("stop")

    def on_complete(self, count: int) -> None:
        hooks.append("complete")

    def on_cancel(self, count: int) -> None:
        hooks.append("cancel")


class Sliced(limitd.IterableJob, name="iteration_test.Sliced"):
    max_slice_seconds = 0.0  # one item per run: every run gives way

    def build_items(self, letters: str, *, cursor: int | None) -> Iterator[tuple[str, int]]:
        return iter(items_of(letters, cursor))

    def each_item(self, letter: str, letters: str) -> None:
        done.append(letter)


class AsyncWalk(limitd.IterableJob, name="iteration_test.AsyncWalk"):
    async def build_items(self, count: int, *, cursor: int | None) -> AsyncIterator[Any]:
        for pair in numbers(0, count, cursor):
            yield pair

    async def each_item(self, item: int, count: int) -> None:
        done.append(("async", item))
        if stop_after.get("AsyncWalk") == item:
            _quiet_the_capsule()


class CancelsItself(limitd.IterableJob, name="iteration_test.CancelsItself"):
    def build_items(self, count: int, *, cursor: int | None) -> Iterator[tuple[int, int]]:
        return iter(numbers(0, count, cursor))

    def each_item(self, item: int, count: int) -> None:
        done.append(item)
        if item == 3:
            cancel(self.jid)


@limitd.job(name="iteration_test.Plain")
def plain(key: str) -> None:
    done.append(key)


@limitd.job(name="iteration_test.LooksAtItsFlag")
def looks_at_its_flag() -> None:
    payload = limitd.current_payload() or {}
    done.append(("before", limitd.cancelled()))
    cancel(str(payload["jid"]))
    done.append(("after", limitd.cancelled()))


_capsules: list[Capsule] = []


def _quiet_the_capsule() -> None:
    """What TERM or a quiet from the dashboard does to the capsule running the job."""
    _capsules[-1].executor.chain.quiet()


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    done.clear()
    hooks.clear()
    stop_after.clear()
    fail_at.clear()
    yield
    _capsules.clear()


def capsule(redis: redis_py.Redis, fetch: str = "limit") -> Capsule:
    made = Capsule(CapsuleConfig(queues=["default"], fetch=fetch), redis=redis)
    _capsules.append(made)
    return made


def run_one(made: Capsule) -> str:
    """Take one job and run it as a processor does (execute, then finish)."""
    unit = made.dispatcher.take_now()
    assert unit is not None, "no job to take"
    outcome = made.executor.execute(unit, inline=True)
    made.dispatcher.finish(unit)
    return outcome


def queued(redis: redis_py.Redis, queue: str = "default") -> list[str]:
    """The jids in a queue, next to run first."""
    import json

    raw = redis.lrange(keys.of(redis).queue(queue), 0, -1)
    return [json.loads(job)["jid"] for job in reversed(raw)]


def test_a_walk_runs_every_item_once_and_records_its_progress(redis: redis_py.Redis) -> None:
    jid = Walk.perform_async(25)
    assert jid is not None
    outcomes = capsule(redis).drain()
    assert outcomes == {"done": 1}
    assert done == list(range(25))
    assert hooks == ["start", "complete"]
    progress = iteration_progress(jid)
    assert progress is not None
    assert (progress.state, progress.items, progress.runs, progress.cursor) == (
        "completed", 25, 1, 24,
    )  # fmt: skip
    assert progress.job_class == "iteration_test.Walk" and progress.started_at is not None
    assert redis.ttl(keys.of(redis).iteration(jid)) <= 86400  # kept a day once finished


def test_a_quiet_stops_the_run_after_its_item_and_the_next_run_resumes_after_it(
    redis: redis_py.Redis,
) -> None:
    jid = Walk.perform_async(12)
    other = plain.perform_async("queued after")
    stop_after["Walk"] = 4
    first = capsule(redis)
    assert run_one(first) == "interrupted"
    assert done == [0, 1, 2, 3, 4], "the item on hand ends; no other starts"
    assert hooks == ["start", "stop"]
    assert queued(redis) == [jid, other], "back at the front of its queue"
    progress = iteration_progress(jid)
    assert progress is not None
    assert (progress.state, progress.cursor, progress.items) == ("interrupted", 4, 5)
    assert redis.llen(keys.of(redis).in_progress(first.id, "default")) == 0

    del stop_after["Walk"]
    outcomes = capsule(redis).drain()
    assert outcomes == {"done": 2}
    assert done == [*range(12), "queued after"], "every item once, in order"
    assert hooks[-2:] == ["resume at 4 after 5", "complete"]
    progress = iteration_progress(jid)
    assert progress is not None and (progress.items, progress.runs) == (12, 2)


@pytest.mark.standalone_only("the basic fetch is BRPOP, the same in both layouts")
def test_the_basic_fetch_puts_a_stopped_walk_first_and_a_sliced_one_last(
    redis: redis_py.Redis,
) -> None:
    walk = Walk.perform_async(5)
    sliced = Sliced.perform_async("ab")
    other = plain.perform_async("x")
    stop_after["Walk"] = 1
    made = capsule(redis, fetch="basic")
    assert run_one(made) == "interrupted"
    assert queued(redis) == [walk, sliced, other]
    del stop_after["Walk"]
    slicing = capsule(redis, fetch="basic")
    slicing.dispatcher.take_now()  # the walk, taken out of the way: the sliced job is next
    assert run_one(slicing) == "interrupted"
    assert queued(redis) == [other, sliced]


def test_a_job_that_starts_while_its_capsule_quiets_goes_straight_back(
    redis: redis_py.Redis,
) -> None:
    jid = Walk.perform_async(3)
    made = capsule(redis)
    made.executor.chain.quiet()
    assert run_one(made) == "interrupted"
    assert done == [] and queued(redis) == [jid]


def test_slices_give_way_to_the_jobs_queued_behind(redis: redis_py.Redis) -> None:
    jid = Sliced.perform_async("abc")
    plain.perform_async("x")
    plain.perform_async("y")
    outcomes = capsule(redis).drain()
    # Each slice does one item and goes to the back of the queue: the plain jobs queued
    # behind it run after its first slice, not after the whole walk.
    assert done == ["a", "x", "y", "b", "c"]
    assert outcomes["done"] == 3 and outcomes["interrupted"] >= 3
    progress = iteration_progress(jid)
    assert progress is not None and (progress.state, progress.items) == ("completed", 3)


def test_a_failed_item_is_retried_from_the_last_item_done(redis: redis_py.Redis) -> None:
    jid = Walk.perform_async(8)
    fail_at.add(5)
    made = capsule(redis)
    assert made.drain() == {"retry": 1}
    assert done == [0, 1, 2, 3, 4, 5]
    progress = iteration_progress(jid)
    assert progress is not None and (progress.state, progress.cursor) == ("failed", 4)
    entry = RetrySet(redis).find_job(jid)
    assert entry is not None
    entry.retry()
    assert made.drain() == {"done": 1}
    assert done == [0, 1, 2, 3, 4, 5, 5, 6, 7], "item 5 again (it failed), then on"


def test_an_async_walk_stops_and_resumes_too(redis: redis_py.Redis) -> None:
    jid = AsyncWalk.perform_async(6)
    assert AsyncWalk.spec.is_async
    stop_after["AsyncWalk"] = 2
    assert run_one(capsule(redis)) == "interrupted"
    del stop_after["AsyncWalk"]
    assert capsule(redis).drain() == {"done": 1}
    assert done == [("async", n) for n in range(6)]
    progress = iteration_progress(jid)
    assert progress is not None and (progress.items, progress.runs) == (6, 2)


def test_cancelling_a_running_walk_stops_it_after_its_item(redis: redis_py.Redis) -> None:
    jid = CancelsItself.perform_async(10)
    assert capsule(redis).drain() == {"cancelled": 1}
    assert done == [0, 1, 2, 3]
    progress = iteration_progress(jid)
    assert progress is not None and (progress.state, progress.items) == ("cancelled", 4)
    assert progress.cancelled_at is not None
    assert not redis.exists(keys.of(redis).cancel_flag(jid)), "the flag did its work"
    assert redis.llen(keys.of(redis).queue("default")) == 0


def test_cancel_removes_a_queued_or_scheduled_job_and_stops_an_iterable_one_unstarted(
    redis: redis_py.Redis,
) -> None:
    queued_jid = Walk.perform_async(3)
    scheduled_jid = plain.perform_in(3600, "later")
    kept = plain.perform_async("kept")
    assert queued_jid and scheduled_jid and kept
    one = cancel(queued_jid, redis)
    two = cancel(scheduled_jid, redis)
    assert one.removed_from == ("queue:default",) and not one.running and one.found
    assert two.removed_from == ("schedule",) and ScheduledSet(redis).size() == 0
    assert not cancel("0" * 24, redis).found
    assert queued(redis) == [kept]
    # A copy of the iterable job that a fetcher held during the search stops unstarted.
    limitd.Client(redis).push({"class": "iteration_test.Walk", "args": [3], "jid": queued_jid})
    assert capsule(redis).drain() == {"cancelled": 1, "done": 1}
    assert done == ["kept"]


def test_a_plain_job_may_look_at_its_cancel_flag(redis: redis_py.Redis) -> None:
    looks_at_its_flag.perform_async()
    assert capsule(redis).drain() == {"done": 1}
    assert done == [("before", False), ("after", True)]
    assert limitd.cancelled() is False, "outside a job"


def test_a_copy_of_a_completed_walk_does_nothing(redis: redis_py.Redis) -> None:
    jid = Walk.perform_async(3)
    made = capsule(redis)
    made.drain()
    # The same job again, as a crash between its end and its acknowledgement leaves it.
    limitd.Client(redis).push({"class": "iteration_test.Walk", "args": [3], "jid": jid})
    assert made.drain() == {"done": 1}
    assert done == [0, 1, 2]


def test_keyword_arguments_are_placed_by_build_items(redis: redis_py.Redis) -> None:
    Walk.perform_async(count=2)
    assert capsule(redis).drain() == {"done": 1}
    assert done == [0, 1]


def test_a_walk_outside_a_capsule_keeps_no_progress() -> None:
    job = Walk()
    job.jid, job.payload = "a" * 24, {"class": "iteration_test.Walk", "jid": "a" * 24}
    job.perform(3)
    assert done == [0, 1, 2] and job.items_done == 3 and job.cursor == 2


def test_the_class_is_checked_when_defined() -> None:
    with pytest.raises(TypeError, match="defines perform"):

        class Both(limitd.IterableJob):
            def build_items(self, *, cursor: Any) -> list[Any]:
                return []

            def each_item(self, item: Any) -> None: ...

            def perform(self) -> None: ...

    with pytest.raises(TypeError, match="must define each_item"):

        class NoWork(limitd.IterableJob):
            def build_items(self, *, cursor: Any) -> list[Any]:
                return []

    with pytest.raises(TypeError, match="cursor keyword"):

        class NoCursor(limitd.IterableJob):
            def build_items(self) -> list[Any]:
                return []

            def each_item(self, item: Any) -> None: ...


def test_a_cursor_must_be_json(redis: redis_py.Redis) -> None:
    class BadCursor(limitd.IterableJob, name="iteration_test.BadCursor"):
        def build_items(self, *, cursor: Any) -> Iterator[tuple[int, Any]]:
            yield 1, object()

        def each_item(self, item: int) -> None:
            done.append(item)

    BadCursor.perform_async()
    assert capsule(redis).drain() == {"retry": 1}
    entry = RetrySet(redis).find_job(str(RetrySet(redis).page(0, 1)[0].jid))
    assert entry is not None and "cursor must be JSON" in str(entry.error_message)


def test_a_quiet_capsule_drains_no_further_than_a_walk_it_put_back(
    redis: redis_py.Redis,
) -> None:
    jid = Walk.perform_async(3)
    made = capsule(redis)
    made.quiet()
    assert made.drain() == {"interrupted": 1}
    assert queued(redis) == [jid]


@limitd.job(name="iteration_test.Unique", unique_for=600, unique_until="executing")
def unique_job(key: str) -> None:
    done.append(key)


@limitd.job(name="iteration_test.Callback")
def batch_callback(status: dict[str, Any], options: dict[str, Any]) -> None:
    done.append(("callback", status["event"]))


def test_a_cancelled_job_is_settled_as_one_that_ended_cancelled(
    redis: redis_py.Redis,
) -> None:
    batch = limitd.Batch()
    batch.on("success", batch_callback)
    with batch.jobs():
        in_batch = plain.perform_in(3600, "in a batch")
    locked = unique_job.perform_async("k")
    assert in_batch and locked
    assert unique_job.perform_async("k") is None, "the lock holds while it waits"
    assert cancel(in_batch, redis).removed_from == ("schedule",)
    assert cancel(locked, redis).removed_from == ("queue:default",)
    status = batch_status(redis, batch.bid)
    assert status is not None and status.pending == 0, "its batch counts it as done"
    assert capsule(redis).drain() == {"done": 1}
    assert done == [("callback", "success")]
    assert unique_job.perform_async("k") is not None, "its unique lock went with it"


class FailingGiveBack:
    """A capsule's dispatch whose first give-back meets a Redis outage."""

    def __init__(self, dispatch: Any) -> None:
        self.dispatch = dispatch
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatch, name)

    def finish(self, unit: Any) -> None:
        if unit.give_back is not None and not self.failed:
            self.failed += 1
            raise redis_py.ConnectionError("Redis went away")
        self.dispatch.finish(unit)


@pytest.mark.standalone_only("the basic fetch is BRPOP, the same in both layouts")
def test_a_walk_put_back_while_redis_fails_is_requeued_not_lost(redis: redis_py.Redis) -> None:
    """With the basic fetch the job is out of Redis while it runs: a failed give-back
    must not drop it."""
    jid = Walk.perform_async(3)
    stop_after["Walk"] = 0
    made = capsule(redis, fetch="basic")
    dispatch = FailingGiveBack(made.dispatcher)
    Processor(0, dispatch, made.executor, lambda _: None)._process_one()  # type: ignore[arg-type]
    assert dispatch.failed == 1
    assert queued(redis) == [jid], "requeued as after an internal error"


def test_limitd_cancel_and_progress_on_the_command_line(
    redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from limitd.iteration.commands import add_iteration_commands

    run = command_runner(add_iteration_commands, redis, capsys)

    walked = Walk.perform_async(4)
    waiting = plain.perform_in(600, "later")
    assert walked and waiting
    capsule(redis).drain()
    code, out = run("progress", walked)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:5] == ["JID", "CLASS", "STATE", "ITEMS", "RUNS"]
    assert row.split()[:5] == [walked, "iteration_test.Walk", "completed", "4", "1"]
    code, out = run("progress", "--json", walked, "f" * 24)
    assert code == 1, "a jid without progress"
    [document] = json.loads(out)
    assert (document["jid"], document["cursor"], document["items"]) == (walked, 3, 4)

    code, out = run("cancel", waiting, "e" * 24)
    assert code == 1, "a jid found nowhere"
    assert out.splitlines() == [
        f"{waiting}: removed from schedule",
        f"{'e' * 24}: not found (flag set)",
    ]
    code, out = run("cancel", "--json", walked)
    assert json.loads(out) == [{"jid": walked, "removed_from": [], "running": False}]


def test_a_walk_expires_only_before_its_first_run(redis: redis_py.Redis) -> None:
    """Once started, a walk resumes to its end, past its expires_in deadline too; one
    not started by then is dropped, as any job is."""
    client = limitd.Client(redis)
    started = client.push(
        {"class": "iteration_test.Walk", "args": [4], "expires_at": limitd.clock.now() + 3600}
    )
    stop_after["Walk"] = 1
    assert run_one(capsule(redis)) == "interrupted"
    del stop_after["Walk"]
    late = client.push({"class": "iteration_test.Walk", "args": [4], "expires_at": 1.0})
    with freeze_time(dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)):
        assert capsule(redis).drain() == {"done": 1, "expired": 1}
    assert done == [0, 1, 2, 3], "the started walk resumed and ended; the late one ran none"
    assert late and started
    progress = iteration_progress(late)
    assert progress is not None and (progress.state, progress.items) == ("expired", 0)
