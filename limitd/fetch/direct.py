"""The basic fetch's dispatch: each processor calls BRPOP itself.

BRPOP takes the job out of Redis, so there is nothing to settle and no call to share:
``finish`` tells the fetch (which does nothing) and nothing is ever held in Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from limitd.fetch import keep_all, never, no_extra
from limitd.fetch.basic import BasicFetch, UnitOfWork, give_back


class DirectDispatch:
    """The ``Dispatch`` (see ``limitd.fetch``) of a capsule with the basic fetch."""

    def __init__(self, fetch: BasicFetch) -> None:
        self.fetch = fetch
        self.extra: Callable[[], int] = no_extra  # one job per BRPOP: no room for more
        # Never called: each BRPOP's job is its processor's, with nothing to spill.
        self.spill: Callable[[list[UnitOfWork]], list[UnitOfWork]] = keep_all
        self.loop_only: Callable[[], bool] = never
        self._closed = False

    @property
    def block_seconds(self) -> float:
        return self.fetch.block_seconds

    def take(self) -> UnitOfWork | None:
        """Wait up to ``block_seconds`` for a job; none once the capsule is quiet."""
        if self._closed:
            return None
        units = self.fetch.take(wait=True)
        return units[0] if units else None

    def take_now(self) -> UnitOfWork | None:
        units = self.fetch.take()
        return units[0] if units else None

    def finish(self, unit: UnitOfWork) -> None:
        if unit.give_back is not None:
            give_back(self.fetch, unit)
        else:
            self.fetch.settle([unit])

    def leave(self) -> None:
        """Nothing is kept for a next take."""

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        return self.fetch.requeue(units, reason=reason, back=back)

    def held(self) -> list[UnitOfWork]:
        return []

    def start(self) -> None:
        """No thread of its own."""

    def close(self) -> None:
        self._closed = True

    def stop(self) -> None:
        self.close()
