"""Taking jobs out of Redis: queue ordering and the fetch strategies.

A fetch hands the processor a :class:`UnitOfWork` and later hears back about it: the
processor gives the finished unit to its next ``retrieve_work`` call (which settles it in
the same round trip), or calls the unit's ``acknowledge`` / ``requeue``. The processor
never builds a Redis key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from limitd.fetch.basic import BasicFetch, UnitOfWork
from limitd.fetch.limit import LimitFetch, LimitUnitOfWork
from limitd.fetch.order import QueueOrder


class Fetch(Protocol):
    """What a processor needs from a fetch strategy."""

    @property
    def block_seconds(self) -> float:
        """The longest ``retrieve_work`` waits before returning None."""
        ...

    def retrieve_work(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Acknowledge ``done`` (the unit the caller finished) and take the next job,
        waiting at most ``block_seconds``."""
        ...

    def try_retrieve(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Acknowledge ``done`` and take a job if one is available now."""
        ...

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None: ...


__all__ = ["BasicFetch", "Fetch", "LimitFetch", "LimitUnitOfWork", "QueueOrder", "UnitOfWork"]
