"""The limit fetch's unit of work: a job held in the capsule's in-progress list until
its fetch settles it, and the bookkeeping calls (``ScriptCall``) the server middleware
leaves on it, sent with its settlement in the same round trip as the next take.

Apart from :mod:`limitd.fetch.limit`, which holds the Redis call, since this is what
travels with each job (the sharded fetch settles the same units).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from limitd.connection import ScriptCall
from limitd.fetch import recoveries
from limitd.fetch.basic import UnitOfWork
from limitd.payload import Payload

if TYPE_CHECKING:
    from limitd.fetch.limit import LimitFetch


@dataclass
class LimitUnitOfWork(UnitOfWork):
    """A job held in this capsule's in-progress list until its fetch settles it."""

    fetch: LimitFetch  # type: ignore[assignment]
    after_run: list[ScriptCall] = field(default_factory=list)
    defer_is_io: ClassVar[bool] = False

    def defer(self, calls: Sequence[ScriptCall]) -> None:
        """Keep ``calls`` to send with this job's settlement, in the same round trip
        (they run first)."""
        self.after_run.extend(calls)

    def recovery_reason(self, payload: Payload) -> str:
        if self.recoveries:
            return recoveries.last_reason(self.fetch.redis, self.job, self.queue)
        return super().recovery_reason(payload)

    def forget_recoveries(self) -> None:
        if self.recoveries:
            recoveries.forget(self.fetch.redis, self.fetch.capsule_id, self.job, self.queue)

    def suspect_started(self) -> None:
        """Say in Redis that this suspect runs now, so that a crash is charged to it."""
        if self.recoveries:
            recoveries.started(self.fetch.redis, self.fetch.capsule_id, self.job, self.queue)


def forget_calls(units: Sequence[UnitOfWork]) -> None:
    """The units' bookkeeping calls were made: they must not be made again."""
    for unit in units:
        if isinstance(unit, LimitUnitOfWork):
            unit.after_run = []


def calls_before_ack(units: Sequence[UnitOfWork]) -> list[ScriptCall]:
    """The bookkeeping server middleware left on these units (see ``ScriptCall``)."""
    return [call for unit in units if isinstance(unit, LimitUnitOfWork) for call in unit.after_run]
