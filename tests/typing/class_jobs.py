"""Enqueue calls on class-style jobs, checked against ``perform`` (less ``self``).

Not a test module: see function_jobs.py and tests/test_typing.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import limitd


class HardJob(limitd.Job, name="HardJob", queue="critical"):
    def perform(self, a: int, b: str = "") -> None: ...

    def retry_in(self, count: int, exc: BaseException, payload: dict[str, Any]) -> int:
        return 10 * (count + 1)


class Harder(HardJob, name="Harder"):
    """A subclass that changes ``perform`` is checked against its own."""

    def perform(self, a: int, b: str = "", c: float = 0.0) -> None: ...


class AnyArgs(limitd.Job, name="AnyArgs"):
    def perform(self, *args: Any) -> None: ...


class Base(limitd.Job, abstract=True):
    """An abstract base has no ``perform``, so no enqueue methods either."""


def accepted() -> None:
    jid: str | None = HardJob.perform_async(1, "x")
    HardJob.perform_async(1)
    HardJob.perform_async(a=1, b="x")
    HardJob.perform_in(30, 1, "x")
    HardJob.perform_at(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), 1, b="x")
    HardJob.set(queue="low").perform_async(1, "x")
    HardJob.perform_bulk([[1, "x"], [2]])
    Harder.perform_async(1, "x", 2.5)
    AnyArgs.perform_async(1, "two", [3])
    assert jid is None or isinstance(jid, str)


def reported() -> None:
    HardJob.perform_async("1")  # E: Argument 1 to "perform_async" of "Job"
    HardJob.perform_async()  # E: Missing positional argument "a" in call to "perform_async"
    HardJob.perform_async(1, "x", 2.5)  # E: Too many arguments for "perform_async" of "Job"
    HardJob.perform_async(1, c=2)  # E: Unexpected keyword argument "c"
    HardJob.perform_in(30, "1")  # E: Argument 2 to "perform_in" of "Job"
    HardJob.perform_at("tomorrow", 1)  # E: "str"; expected "float | datetime"
    HardJob.set(queue="low").perform_async(1, 2)  # E: Argument 2 to "perform_async"
    Harder.perform_async(1, "x", "2.5")  # E: Argument 3 to "perform_async" of "Job"
    Base.perform_async()  # E: Invalid self argument "type[Base]"
