"""Basic fetch: BRPOP over the capsule's queues in this fetch's order.

The job leaves Redis when it is fetched, so a process killed with SIGKILL loses what it
was running (the limit fetch keeps an in-progress list instead). So settling a finished
job costs nothing here, and a graceful stop puts unfinished units back with
:meth:`BasicFetch.requeue`. Nothing happens at heartbeat time: no capsule holds a job in
Redis, so there is nothing to reap or recover.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import redis as redis_py

from limitd import keys
from limitd.connection import Conn, ScriptCall, retry_on_failover
from limitd.fetch import WakeHandler, recoveries
from limitd.payload import Payload
from limitd.queues.order import QueueOrder

# BRPOP returns at least this often so a stopping processor notices promptly.
BLOCK_SECONDS = 1.0

# Where a job that asks to be put back goes (``UnitOfWork.give_back``): first in line
# again, or behind the jobs queued meanwhile.
FRONT, BACK = "front", "back"


@dataclass
class UnitOfWork:
    """One fetched job. Its fetch settles it (the job was handled, whatever its outcome)
    or requeues it (puts it back, with a reason: counting a recovery, see
    ``fetch/recoveries.py``); the unit itself only carries what the job's run needs.

    ``recoveries``: the crashes charged to the job, as the fetch found it, and ``alone``
    how many of them it was alone in (see ``fetch/recoveries.py``; the basic fetch keeps
    its count in the payload instead). A unit with crashes is its capsule's suspect."""

    queue: str
    job: bytes
    fetch: BasicFetch
    recoveries: int = 0
    alone: int = 0
    # Set when the job ended asking to be put back in line rather than acknowledged (an
    # iterable job stopping between items, ``limitd.middleware.chain.Interrupted``):
    # "front" or "back" of its queue. The dispatch's ``finish`` obeys it.
    give_back: str | None = None
    # ``defer`` makes its calls at once (a round trip) rather than keeping them.
    defer_is_io: ClassVar[bool] = True

    def recovery_reason(self, payload: Payload) -> str:
        """Why the job was last given back."""
        return str(payload.get(recoveries.REASON_FIELD, "unknown"))

    def forget_recoveries(self) -> None:
        """Nothing kept outside the payload."""

    def suspect_started(self) -> None:
        """Nothing to say: a process killed running a basic-fetch job loses it anyway."""

    def defer(self, calls: Sequence[ScriptCall]) -> None:
        """Make ``calls`` (a job's bookkeeping, see ``ScriptCall``) before the job is
        settled. BRPOP has no acknowledgement to carry them: made now."""
        for call in calls:
            call.run(self.fetch.redis)


def give_back(fetch: Any, unit: UnitOfWork) -> None:
    """Put a job that asked for it (``unit.give_back``) back in line, instead of
    settling it: its fetch moves it back to its queue, to the end it named."""
    fetch.requeue(unit, back=unit.give_back == BACK)


def as_units(units: UnitOfWork | Iterable[UnitOfWork]) -> list[UnitOfWork]:
    """One unit or many, as a list: every fetch's ``requeue`` takes either."""
    return [units] if isinstance(units, UnitOfWork) else list(units)


class BasicFetch:
    """Fetches for one capsule. Implements ``limitd.fetch.Fetch``."""

    def __init__(
        self, redis: redis_py.Redis, order: QueueOrder, block_seconds: float = BLOCK_SECONDS
    ) -> None:
        self.redis = redis
        self.keys = keys.of(redis)  # the key layout of its connection
        self.order = order
        self.block_seconds = block_seconds

    def take(
        self,
        want: int = 1,
        finished: Sequence[UnitOfWork] = (),
        *,
        wait: bool = False,
        conn: Conn | None = None,
    ) -> list[UnitOfWork]:
        """Up to ``want`` jobs from the first non-empty queues, without waiting (drain
        mode), or with ``wait`` one job, waiting up to ``block_seconds`` for it.
        ``finished`` needs no settling: BRPOP removed it already."""
        if wait:
            unit = self._wait_for_one()
            return [] if unit is None else [unit]
        units: list[UnitOfWork] = []
        while len(units) < want and (unit := self._take_now()) is not None:
            units.append(unit)
        return units

    def settle(self, units: Sequence[UnitOfWork]) -> int:
        """Nothing to do: BRPOP removed the jobs when it took them."""
        return len(units)

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        """Put jobs back at the end their queue is read from, so they run next (with
        ``back``, at the other end, behind the jobs queued meanwhile). With a
        ``reason`` (their outcome could not be recorded), each goes back with its count
        of recoveries raised, in its payload: the job is out of Redis."""
        batch = as_units(units)
        if back and reason is None:
            for unit in batch:
                self.redis.lpush(self.keys.queue(unit.queue), unit.job)
            return len(batch)
        if reason is not None:
            for unit in batch:
                self.redis.rpush(
                    self.keys.queue(unit.queue), recoveries.mark_recovered(unit.job, reason)
                )
            return len(batch)
        by_queue: dict[str, list[bytes]] = defaultdict(list)
        for unit in batch:
            by_queue[unit.queue].append(unit.job)
        if by_queue:
            pipe = self.redis.pipeline(transaction=False)
            for queue, jobs in by_queue.items():
                pipe.rpush(self.keys.queue(queue), *jobs)
            pipe.execute()
        return len(batch)

    # -- heartbeat time: nothing held in Redis, nothing to do -------------------------

    def vouch(self, period: float) -> None:
        """No liveness key: nobody reaps a basic-fetch capsule."""

    def maintain(self, held: Callable[[], list[UnitOfWork]], *, reap: bool) -> None:
        """No in-progress list to reap or recover."""

    def retire(self) -> int:
        """Nothing left in progress at stop."""
        return 0

    def wake_handlers(self) -> dict[str, WakeHandler]:
        """BRPOP wakes by itself when a job is pushed."""
        return {}

    def _wait_for_one(self) -> UnitOfWork | None:
        queue_keys = [self.keys.queue(name) for name in self.order.next_order()]
        found = retry_on_failover(
            self.redis, lambda: self.redis.brpop(queue_keys, timeout=self.block_seconds)
        )
        if found is None:
            return None
        key, job = cast("tuple[bytes, bytes]", found)
        return UnitOfWork(self.keys.queue_name(key.decode()), job, self)

    def _take_now(self) -> UnitOfWork | None:
        for name in self.order.next_order():
            job = cast("bytes | None", self.redis.rpop(self.keys.queue(name)))
            if job is not None:
                return UnitOfWork(name, job, self)
        return None
