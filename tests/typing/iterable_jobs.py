"""Iterable jobs as app code writes them: each class's ``build_items`` and ``each_item``
with its own parameters (the base class declares none, so no override is reported),
and enqueue calls that take any arguments (``perform`` is generated from
``build_items`` at run time, where keyword arguments are placed by it).

Not a test module: see function_jobs.py and tests/test_typing.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import limitd
from limitd.iteration.job import items_of, numbers


class Backfill(limitd.IterableJob, name="Backfill", queue="migrations"):
    max_slice_seconds = 60.0

    def build_items(self, team_id: int, *, cursor: int | None) -> Iterator[tuple[int, int]]:
        return iter(numbers(0, 10, cursor))

    def each_item(self, user_id: int, team_id: int) -> None: ...

    def on_complete(self, team_id: int) -> None: ...


class Pages(limitd.IterableJob, name="Pages"):
    async def build_items(self, *, cursor: int | None) -> AsyncIterator[tuple[str, int]]:
        for pair in items_of(["a", "b"], cursor):
            yield pair

    async def each_item(self, page: str) -> None:
        if await limitd.acancelled():
            return


def accepted() -> None:
    jid: str | None = Backfill.perform_async(42)
    Backfill.perform_async(team_id=42)
    Backfill.perform_in(30, 42)
    Backfill.set(queue="low").perform_async(42)
    Pages.perform_async()
    stopped: bool = limitd.cancelled()
    assert jid is None or isinstance(jid, str) or stopped


def reported() -> None:
    Backfill.perform_in("soon", 42)  # E: Argument 1 to "perform_in" of "Job"
    limitd.cancelled(1)  # E: Too many arguments for "cancelled"
