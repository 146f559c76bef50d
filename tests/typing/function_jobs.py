"""Enqueue calls on function jobs: those mypy accepts and those it reports.

Not a test module (pytest does not collect it, nothing imports it): tests/test_typing.py
runs mypy over this folder and expects an error on exactly the lines marked
``# E: <part of the message>``, and none elsewhere. The full messages are in
docs/typing.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import limitd


@limitd.job(queue="webhooks", retry=5)
def send(tenant_id: int, url: str, timeout: float = 5.0) -> None: ...


@limitd.job
def double(x: int) -> int:
    return x * 2


@limitd.job(queue="loose")
def loose(payload, *extra):
    """Unannotated: mypy takes its parameters as Any, so any argument passes."""


@dataclasses.dataclass
class Point:
    x: int
    y: int


@limitd.job
def plot(point: Point) -> None: ...


@limitd.job
def flagged(n: int, *, loud: bool = False) -> None: ...


def accepted() -> None:
    jid: str | None = send.perform_async(42, "https://example.com/hook")
    send.perform_async(42, url="https://example.com/hook", timeout=1.5)
    send.perform_async(url="u", tenant_id=42)
    send.perform_in(30, 42, "u")
    send.perform_in(dt.timedelta(minutes=5), 42, "u", 2)
    send.perform_at(1_800_000_000.0, 42, "u")
    send.perform_at(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), 42, url="u")
    send.set(queue="low").perform_async(42, "u")
    send.set(queue="low").set(retry=1).perform_in(10, 42, "u", timeout=3)
    doubled: int = double(21)  # the decorated function is still the function
    double.perform_bulk([[1], [2], ["three"]])  # bulk rows are not checked per argument
    loose.perform_async(object(), 1, "anything")
    assert jid is None or isinstance(jid, str)
    assert doubled == 42


def accepted_but_refused_at_run_time() -> None:
    # The annotation says Point, so mypy is content; a dataclass is not JSON, and the
    # push raises limitd.UnsafeArgument.
    plot.perform_async(Point(1, 2))
    # Keyword-only parameters have no position in the payload's list: TypeError.
    flagged.perform_async(1, loud=True)


def reported() -> None:
    send.perform_async("42", "u")  # E: Argument 1 to "perform_async" of "Enqueuer"
    send.perform_async(42)  # E: Missing positional argument "url" in call to "perform_async"
    send.perform_async(42, "u", 1.0, "extra")  # E: Too many arguments for "perform_async"
    send.perform_async(42, urll="u")  # E: Unexpected keyword argument "urll"
    send.perform_async(42, "u", timeout="slow")  # E: "str"; expected "float"
    send.perform_in(30, "42", "u")  # E: Argument 2 to "perform_in" of "Enqueuer"
    send.perform_in("soon", 42, "u")  # E: "str"; expected "float | timedelta"
    send.perform_at(dt.date(2030, 1, 1), 42, "u")  # E: "date"; expected "float | datetime"
    send.perform_in(interval=30, tenant_id=42, url="u")  # E: keyword argument "interval"
    send.set(queue="low").perform_async(42, 43)  # E: Argument 2 to "perform_async"
    double.perform_async()  # E: Missing positional argument "x"
    double("2")  # E: Argument 1 to "__call__" of "JobFunction"
    text: str = double(2)  # E: (expression has type "int", variable has type "str")
    plot.perform_async({"x": 1, "y": 2})  # E: "dict[str, int]"; expected "Point"
    print(text)


def enqueue_later(enqueuer: limitd.Enqueuer[[int, str]], tenant_id: int) -> None:
    """An enqueuer passed around keeps its parameters."""
    enqueuer.perform_async(tenant_id, "u")
    enqueuer.perform_async(tenant_id, 3)  # E: Argument 2 to "perform_async" of "Enqueuer"


def enqueue_anything(enqueuer: limitd.Enqueuer, *args: Any) -> None:
    """A bare ``Enqueuer`` takes any arguments: the types know nothing of its job."""
    enqueuer.perform_async(*args, any_keyword=1)


def pass_enqueuers_around() -> None:
    enqueue_anything(send, 1, "u")
    enqueue_anything(double.set(queue="low"))
    enqueue_later(send.set(queue="low"), 1)  # (int, str) fits: timeout has a default
    enqueue_later(double, 1)  # E: "JobFunction[[int], int]"; expected "Enqueuer[[int, str]]"
