"""Taking jobs out of Redis: queue ordering and the fetch strategies.

Two roles, two protocols. A :class:`Fetch` is a strategy that talks to Redis: it takes
jobs, settles finished ones (in the same call as the next take where it can), puts jobs
back (``requeue``, the one verb for that), and does its own work at heartbeat time. A
:class:`Dispatch` stands between a capsule's threads and its fetch: processors ``take``
from it, and every job that ends, on a processor, on the event loop or in a drain, goes
to its ``finish``. The limit fetch's dispatcher (``fetch/dispatcher.py``) batches the
processors' calls into one; the basic fetch's (``fetch/direct.py``) lets each processor
call BRPOP itself. ``fetch/factory.py`` builds the pair from the config. Nobody above
the fetch builds a Redis key.

Only the protocols live here, so ``import limitd.fetch.recoveries`` (as ``import
limitd`` does) loads no fetch: the implementations are imported from their modules
(``fetch.basic``, ``fetch.limit``, ``fetch.sharded``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: importing the package loads no implementation
    from limitd.connection import Conn
    from limitd.fetch.basic import UnitOfWork

# A pub/sub channel's handler (see ``limitd.fetch.wakeup``): given the texts heard on
# the channel since the listener's last read, each once, in the order first heard; [""]
# after every (re)subscription, since something may have been published meanwhile.
WakeHandler = Callable[[Sequence[str]], None]


class Fetch(Protocol):
    """A fetch strategy: ``BasicFetch``, ``LimitFetch``, ``ShardedLimitFetch``."""

    @property
    def block_seconds(self) -> float:
        """The longest ``take(wait=True)`` waits before returning nothing."""
        ...

    def take(
        self,
        want: int = 1,
        finished: Sequence[UnitOfWork] = (),
        *,
        wait: bool = False,
        conn: Conn | None = None,
    ) -> Sequence[UnitOfWork]:
        """Settle ``finished`` and take up to ``want`` jobs (with ``wait``, waiting up to
        ``block_seconds`` when there is none)."""
        ...

    def settle(self, units: Sequence[UnitOfWork]) -> int:
        """Settle finished jobs now; returns how many were still this capsule's."""
        ...

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        """Put jobs back in line, first (with ``back``: last); with a ``reason``,
        charged a recovery each."""
        ...

    def vouch(self, period: float) -> None:
        """Heartbeat, first: say this capsule is alive for a few ``period`` more."""
        ...

    def maintain(self, held: Callable[[], list[UnitOfWork]], *, reap: bool) -> None:
        """Heartbeat, then: reaping, orphan recovery, whatever the strategy needs."""
        ...

    def retire(self) -> int:
        """At stop: return what is still held; returns how many jobs that was."""
        ...

    def wake_handlers(self) -> dict[str, WakeHandler]:
        """The pub/sub channels this fetch listens to, with their handlers."""
        ...


class Dispatch(Protocol):
    """What a capsule's processors, event loop and drain use to take and end jobs."""

    # Jobs to take per call beyond the waiting processors' (the event loop's room).
    extra: Callable[[], int]
    # Offered the jobs a call fetched before the processors are: returns those it did
    # not take (the event loop takes the async jobs it has room for, in one batch).
    spill: Callable[[list[UnitOfWork]], list[UnitOfWork]]
    # True while the event loop takes every job fetched lately: fetch for it alone.
    loop_only: Callable[[], bool]

    @property
    def block_seconds(self) -> float: ...

    def take(self) -> UnitOfWork | None:
        """For a processor: the next job, or None after ``block_seconds`` or on quiet."""
        ...

    def take_now(self) -> UnitOfWork | None:
        """For a drain: a job if one can be taken now, settling what was finished."""
        ...

    def finish(self, unit: UnitOfWork) -> None:
        """Every job that ended, whatever its outcome, comes here to be settled (or put
        back in line, when it asks to be: ``unit.give_back``)."""
        ...

    def leave(self) -> None:
        """A processor thread ends: what it finished must not wait for its next take."""
        ...

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        """Put jobs back (the fetch's ``requeue``)."""
        ...

    def held(self) -> list[UnitOfWork]:
        """Units held in Redis for this capsule that no processor or loop holds."""
        ...

    def start(self) -> None: ...

    def close(self) -> None:
        """Quiet: take nothing more; processors waiting get None at once."""
        ...

    def stop(self) -> None:
        """After the processors: settle what they finished, requeue what none took."""
        ...


# A Dispatch's hooks as they are without an event loop (the capsule's lane replaces them,
# see limitd.supervisor.async_lane): no extra jobs, nothing spilled, never for the loop
# alone.


def no_extra() -> int:
    return 0


def keep_all(units: list[UnitOfWork]) -> list[UnitOfWork]:
    return units


def never() -> bool:
    return False


__all__ = ["Dispatch", "Fetch", "keep_all", "never", "no_extra"]
