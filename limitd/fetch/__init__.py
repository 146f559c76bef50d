"""Taking jobs out of Redis: queue ordering and the fetch strategies.

A fetch hands the processor a :class:`UnitOfWork` and later hears back through it
(``acknowledge`` or ``requeue``): the processor never builds a Redis key.
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

    def retrieve_work(self) -> UnitOfWork | None: ...

    def try_retrieve(self) -> UnitOfWork | None: ...

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None: ...


__all__ = ["BasicFetch", "Fetch", "LimitFetch", "LimitUnitOfWork", "QueueOrder", "UnitOfWork"]
