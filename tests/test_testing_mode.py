"""limitd.testing: the fake and inline modes, with no Redis at all.

Every test here runs with the default client's Redis pointed at a closed port
(``no_redis``): a push or a job that tried to reach Redis would fail with a connection
error, so each passing test also shows that the testing modes never open a socket.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import freezegun
import pytest
import redis as redis_py

import limitd
from limitd import testing
from limitd.iteration.job import numbers
from limitd.middleware.client_chain import ClientChain

ran: list[Any] = []


@limitd.job(name="tm.add")
def add(a: int, b: int) -> None:
    ran.append(("add", a + b))


@limitd.job(name="tm.fanout", queue="fan")
def fanout(n: int) -> None:
    ran.append(("fanout", n))
    if n > 0:
        fanout.perform_async(n - 1)


@limitd.job(name="tm.forever")
def forever() -> None:
    forever.perform_async()


@limitd.job(name="tm.fails", retry=3)
def fails(text: str) -> None:
    raise ValueError(text)


@limitd.job(name="tm.unique", unique_for=60)
def unique(key: str) -> None:
    ran.append(("unique", key))


@limitd.job(name="tm.uses_redis")
def uses_redis() -> None:
    limitd.redis_client().incr("visits")


class Report(limitd.Job, name="tm.Report", queue="reports"):
    def perform(self, month: str) -> None:
        ran.append(("report", month, self.jid))


@limitd.job(name="tm.async_job")
async def async_job(n: int) -> None:
    await asyncio.sleep(0)
    payload = limitd.current_payload()
    ran.append(("async", n, payload["jid"] if payload else None))


@limitd.job(name="tm.callback")
def callback(status: dict[str, Any], options: dict[str, Any]) -> None:
    ran.append(("callback", status["event"], status["total"], options))


@limitd.job(
    name="tm.tenant",
    fair_tenant_queues=[{"queue": "throttled", "threshold": 2, "per": 60}],
    tenant=lambda account: account,
)
def tenant_job(account: str) -> None:
    ran.append(("tenant", account))


class Walk(limitd.IterableJob, name="tm.Walk"):
    max_slice_seconds = 0.0  # in a capsule, one item per run; here, the whole walk

    def build_items(self, count: int, *, cursor: int | None) -> Any:
        return numbers(0, count, cursor)

    def each_item(self, item: int, count: int) -> None:
        ran.append(("item", item, limitd.cancelled()))


class AsyncWalk(limitd.IterableJob, name="tm.AsyncWalk"):
    async def build_items(self, count: int, *, cursor: int | None) -> Any:
        for pair in numbers(0, count, cursor):
            yield pair

    async def each_item(self, item: int, count: int) -> None:
        ran.append(("async item", item, await limitd.acancelled()))


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No Redis anywhere: the app's default client would point at a closed port."""
    ran.clear()
    monkeypatch.setenv("LIMITD_REDIS_URL", f"redis://127.0.0.1:{closed_port()}/0")
    limitd.set_default_client(None)
    yield
    limitd.set_default_client(None)


def test_fake_records_pushes_per_queue_without_redis() -> None:
    with testing.fake() as jobs:
        jid = add.perform_async(1, 2)
        Report.perform_async("2026-11")
        Report.set(queue="urgent").perform_async("2026-12")
        assert [p["jid"] for p in jobs.jobs_for(add)] == [jid]
        assert jobs.args_for("tm.Report") == [["2026-11"], ["2026-12"]]
        assert {q: len(js) for q, js in jobs.queues.items()} == {
            "default": 1,
            "reports": 1,
            "urgent": 1,
        }
        assert jobs.jobs_for(queue="urgent")[0]["class"] == "tm.Report"
        assert ran == []  # recorded, not run
        assert jobs.clear(Report) == 2
        assert len(jobs) == 1


def test_drain_runs_jobs_and_the_jobs_they_push() -> None:
    with testing.fake() as jobs:
        fanout.perform_async(3)
        Report.perform_async("2026-11")
        assert jobs.drain_queue("fan") == 4
        assert ran == [("fanout", 3), ("fanout", 2), ("fanout", 1), ("fanout", 0)]
        report = jobs.run_one(Report)
        assert ran[-1] == ("report", "2026-11", report["jid"])
        assert len(jobs) == 0
        with pytest.raises(LookupError, match="no job waiting"):
            jobs.run_one()


def test_drain_stops_jobs_that_push_forever() -> None:
    with testing.fake() as jobs:
        forever.perform_async()
        with pytest.raises(testing.TooManyJobs, match=r"class=tm\.forever"):
            jobs.drain(max_jobs=50)
        assert len(jobs) == 1  # the next one is still waiting


def test_bulk_and_scheduled_pushes_are_recorded_with_their_time() -> None:
    with freezegun.freeze_time("2026-11-01 12:00:00") as frozen, testing.fake() as jobs:
        add.perform_bulk([[1, 1], [2, 2]])
        add.perform_in(60, 3, 3)
        [scheduled] = jobs.scheduled
        assert scheduled["args"] == [3, 3]
        assert scheduled["at"] == pytest.approx(limitd.clock.now() + 60)
        assert jobs.drain(due_only=True) == 2
        assert len(jobs) == 1  # not due yet
        frozen.tick(61)
        assert jobs.drain(due_only=True) == 1
        assert [r[1] for r in ran] == [2, 4, 6]


def test_failing_job_raises_from_drain() -> None:
    with testing.fake() as jobs:
        fails.perform_async("boom")
        with pytest.raises(ValueError, match="boom"):
            jobs.drain()
        assert len(jobs) == 0


def test_async_jobs_and_the_async_client() -> None:
    async def push() -> str | None:
        return await async_job.aio.perform_async(7)

    with testing.fake() as jobs:
        jid = asyncio.run(push())
        assert jobs.args_for(async_job) == [[7]]
        jobs.drain()
    assert ran == [("async", 7, jid)]


def test_adrain_runs_async_jobs_on_the_callers_loop() -> None:
    async def scenario(jobs: testing.FakeJobs) -> int:
        await async_job.aio.perform_bulk([[1], [2]])
        add.perform_async(1, 1)
        return await jobs.adrain()

    with testing.fake() as jobs:
        assert asyncio.run(scenario(jobs)) == 3
    assert [r[:2] for r in ran] == [("async", 1), ("async", 2), ("add", 2)]


def test_unique_duplicate_is_dropped_until_the_job_ran() -> None:
    with testing.fake() as jobs:
        assert unique.perform_async("k") is not None
        assert unique.perform_async("k") is None  # the lock is held
        assert unique.perform_async("other") is not None
        jobs.drain()
        assert unique.perform_async("k") is not None  # released when it succeeded


def test_batch_callbacks_fire_when_its_jobs_have_run() -> None:
    with testing.fake() as jobs:
        batch = limitd.Batch("import")
        batch.on("success", callback, {"month": "11"})
        with batch.jobs():
            add.perform_async(1, 1)
            add.perform_bulk([[2, 2]])
        assert {p.get("bid") for p in jobs.jobs_for(add)} == {batch.bid}
        jobs.drain()
    assert ran[-1] == ("callback", "success", 2, {"month": "11"})


def test_async_batch_block() -> None:
    async def build() -> None:
        batch = limitd.Batch("async import")
        batch.on("complete", callback)
        async with batch.aio.jobs():
            await async_job.aio.perform_async(1)

    with testing.inline():
        asyncio.run(build())
    assert [r[:2] for r in ran] == [("async", 1), ("callback", "complete")]


def test_fair_tenant_rules_reroute_a_busy_tenant() -> None:
    with testing.fake() as jobs:
        for _ in range(3):
            tenant_job.perform_async("acme")
        tenant_job.perform_async("small")
        assert [p["queue"] for p in jobs.jobs_for(tenant_job)] == [
            "default",
            "default",
            "throttled",
            "default",
        ]


class Tag:
    """A client middleware, as an app adds one."""

    def __call__(
        self, spec: Any, payload: dict[str, Any], redis: Any, call_next: Callable[..., Any]
    ) -> Any:
        payload["tag"] = "web"
        return call_next(payload)


class Around:
    """A server middleware, as an app adds one."""

    def __call__(self, spec: Any, payload: Any, queue: str, call_next: Callable[[], Any]) -> Any:
        ran.append(("before", payload["class"], queue))
        return call_next()


def test_the_apps_client_middleware_runs() -> None:
    app_client = limitd.Client(redis_py.Redis(port=closed_port()), middleware=ClientChain([Tag()]))
    limitd.set_default_client(app_client)
    with testing.fake() as jobs:
        add.perform_async(1, 1)
        assert jobs.jobs[0]["tag"] == "web"
    assert limitd.default_client() is app_client  # restored


def test_client_and_server_middleware_given_to_the_mode() -> None:
    with testing.fake(client_middleware=[Tag()], server_middleware=[Around()]) as jobs:
        Report.perform_async("2026-11")
        assert jobs.jobs[0]["tag"] == "web"
        jobs.drain()
    with testing.inline(server_middleware=[Around()]):
        add.perform_async(2, 2)
    assert [r[0] for r in ran] == ["before", "report", "before", "add"]
    assert ran[0] == ("before", "tm.Report", "reports")


def test_inline_runs_at_push_time_and_raises() -> None:
    with freezegun.freeze_time("2026-11-01"), testing.inline() as performed:
        add.perform_async(1, 2)
        add.perform_in(3600, 2, 2)  # at once, too
        assert ran == [("add", 3), ("add", 4)]
        with pytest.raises(ValueError, match="boom"):
            fails.perform_async("boom")
        assert [p["class"] for p in performed.performed] == ["tm.add", "tm.add", "tm.fails"]


def test_iterable_jobs_walk_every_item_in_one_run_in_both_modes() -> None:
    with testing.fake() as jobs:
        Walk.perform_async(3)
        AsyncWalk.perform_async(2)
        assert ran == []
        assert jobs.drain() == 2
    with testing.inline():
        Walk.perform_async(2)
    assert ran == [
        ("item", 0, False), ("item", 1, False), ("item", 2, False),
        ("async item", 0, False), ("async item", 1, False),
        ("item", 0, False), ("item", 1, False),
    ]  # fmt: skip


def test_inline_async_job_from_sync_and_async_code() -> None:
    async def push() -> None:
        await async_job.aio.perform_async(1)
        async_job.perform_async(2)  # a sync push inside a running loop

    with testing.inline():
        async_job.perform_async(0)
        asyncio.run(push())
    assert [r[:2] for r in ran] == [("async", 0), ("async", 1), ("async", 2)]


def test_inline_unique_lock_is_released_after_the_run() -> None:
    with testing.inline():
        assert unique.perform_async("k") is not None
        assert unique.perform_async("k") is not None
    assert ran == [("unique", "k"), ("unique", "k")]


def test_modes_nest_and_restore() -> None:
    with testing.inline():
        with testing.fake() as jobs:
            add.perform_async(1, 1)
            assert len(jobs) == 1 and ran == []
        add.perform_async(2, 2)
        assert ran == [("add", 4)]


def test_a_jobs_own_redis_use_says_it_needs_a_real_redis() -> None:
    with testing.inline(), pytest.raises(testing.NeedsRealRedis, match="INCRBY needs a real Redis"):
        uses_redis.perform_async()


def test_fixtures(limitd_fake: testing.FakeJobs) -> None:
    add.perform_async(5, 5)
    assert limitd_fake.args_for(add) == [[5, 5]]


def test_inline_fixture(limitd_inline: testing.InlineJobs) -> None:
    add.perform_async(5, 6)
    assert ran == [("add", 11)]


@limitd.job(name="tm.warm", expires_in=60)
def warm(key: str) -> None:
    ran.append(("warm", key))


@limitd.job(name="tm.unique_fails", unique_for=60, retry=3)
def unique_fails(key: str) -> None:
    raise ValueError(key)


def test_an_expired_job_is_dropped_in_a_drain_as_in_production() -> None:
    with freezegun.freeze_time("2026-11-01 09:00") as clock, testing.fake() as jobs:
        warm.perform_async("late")
        clock.tick(120)
        assert jobs.drain() == 1
    assert ran == []


def test_a_failing_job_in_inline_mode_fails_its_batch_and_keeps_its_unique_lock() -> None:
    with testing.inline():
        batch = limitd.Batch()
        batch.on("complete", callback, {"which": "complete"})
        batch.on("success", callback, {"which": "success"})
        with pytest.raises(ValueError, match="boom"), batch.jobs():
            fails.perform_async("boom")
        with pytest.raises(ValueError, match="k"):
            unique_fails.perform_async("k")
        assert unique_fails.perform_async("k") is None, "its lock stays, as after a failure"
    assert [event[:2] for event in ran] == [("callback", "complete")]


@limitd.job(name="tm.limited")
def limited() -> None:
    with limitd.Limiter.concurrent("tm-api", 2).within_limit():
        ran.append("limited")


def test_a_limiter_says_which_script_needs_a_real_redis() -> None:
    with testing.inline(), pytest.raises(testing.NeedsRealRedis, match="the script '"):
        limited.perform_async()
