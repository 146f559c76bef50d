"""``job.aio`` enqueue calls: awaitable, and typed like the sync ones.

Not a test module: see function_jobs.py and tests/test_typing.py.
"""

from __future__ import annotations

import datetime as dt

import limitd


@limitd.job(queue="webhooks")
def send(tenant_id: int, url: str) -> None: ...


@limitd.job
async def fetch(url: str) -> bytes:
    return url.encode()


class HardJob(limitd.Job, name="AsyncCallsHardJob"):
    def perform(self, a: int, b: str) -> None: ...


async def accepted() -> None:
    jid: str | None = await send.aio.perform_async(42, "u")
    await send.aio.perform_async(42, url="u")
    await send.aio.perform_in(dt.timedelta(seconds=30), 42, "u")
    await send.aio.perform_at(1_800_000_000, 42, "u")
    await send.aio.set(queue="low").perform_async(42, "u")
    await send.set(queue="low").aio.perform_async(42, "u")
    await send.aio.perform_bulk([[1, "a"], [2, "b"]])
    await HardJob.aio.perform_async(1, "x")
    await HardJob.set(queue="low").aio.perform_in(5, 1, b="x")
    await fetch.aio.perform_async("u")  # an async job enqueues like any other
    body: bytes = await fetch("u")  # and is still the coroutine function
    assert jid is None or body is not None


async def reported() -> None:
    await send.aio.perform_async("42", "u")  # E: Argument 1 to "perform_async" of "AsyncEnqueuer"
    await send.aio.perform_async(42)  # E: Missing positional argument "url"
    await send.aio.perform_in(30, 42, 43)  # E: Argument 3 to "perform_in" of "AsyncEnqueuer"
    await send.aio.set(queue="low").perform_at(1.0, 42, urll="u")  # E: keyword argument "urll"
    await send.set(queue="low").aio.perform_async(42, 43)  # E: Argument 2 to "perform_async"
    await HardJob.aio.perform_async(1, 2)  # E: Argument 2 to "perform_async" of "AsyncEnqueuer"
    await fetch.aio.perform_async(b"u")  # E: "bytes"; expected "str"
    jid: str = await send.aio.perform_async(42, "u")  # E: variable has type "str"
    send.aio.perform_async(42, "u")  # E: "Coroutine[Any, Any, str | None]" must be used
    print(jid)
