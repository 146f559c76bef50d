"""Basic fetch: BRPOP over the capsule's queues in this fetch's order.

The job leaves Redis when it is fetched, so a process killed with SIGKILL loses what it
was running (the limit fetch keeps an in-progress list instead). On a graceful stop the
capsule hands unfinished units back with :meth:`BasicFetch.bulk_requeue`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, cast

import redis as redis_py

from limitd import keys
from limitd.fetch import recoveries
from limitd.fetch.order import QueueOrder
from limitd.payload import Payload
from limitd.redis import ScriptCall, retry_on_failover

# BRPOP returns at least this often so a stopping processor notices promptly.
BLOCK_SECONDS = 1.0


@dataclass
class UnitOfWork:
    """One fetched job. The processor calls exactly one of ``acknowledge`` (the job was
    handled, whatever its outcome), ``requeue`` (give it back untouched) or
    ``give_back`` (give it back, counting a recovery: see ``fetch/recoveries.py``).

    ``recoveries``: the crashes charged to the job, as the fetch found it, and ``alone``
    how many of them it was alone in (see ``fetch/recoveries.py``; the basic fetch keeps
    its count in the payload instead). A unit with crashes is its capsule's suspect."""

    queue: str
    job: bytes
    fetch: BasicFetch
    recoveries: int = 0
    alone: int = 0
    # ``defer`` makes its calls at once (a round trip) rather than keeping them.
    defer_is_io: ClassVar[bool] = True

    def acknowledge(self) -> None:
        """Nothing to do: BRPOP already removed the job."""

    def give_back(self, reason: str) -> None:
        """Push the job back with its count raised, in the payload: it is out of Redis."""
        self.fetch.redis.rpush(keys.queue(self.queue), recoveries.mark_recovered(self.job, reason))

    def recovery_reason(self, payload: Payload) -> str:
        """Why the job was last given back."""
        return str(payload.get(recoveries.REASON_FIELD, "unknown"))

    def forget_recoveries(self) -> None:
        """Nothing kept outside the payload."""

    def suspect_started(self) -> None:
        """Nothing to say: a process killed running a basic-fetch job loses it anyway."""

    def defer(self, calls: Sequence[ScriptCall]) -> None:
        """Make ``calls`` (a job's bookkeeping, see ``ScriptCall``) before the job is
        acknowledged. BRPOP has no acknowledgement to carry them: made now."""
        for call in calls:
            call.run(self.fetch.redis)

    def requeue(self) -> None:
        self.fetch.bulk_requeue([self])


class BasicFetch:
    """Fetches for one capsule."""

    def __init__(
        self, redis: redis_py.Redis, order: QueueOrder, block_seconds: float = BLOCK_SECONDS
    ) -> None:
        self.redis = redis
        self.order = order
        self.block_seconds = block_seconds

    def retrieve_work(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Wait up to ``block_seconds`` for a job from the first non-empty queue.
        ``done`` needs no settling: BRPOP removed it already."""
        queue_keys = [keys.queue(name) for name in self.order.next_order()]
        found = retry_on_failover(
            self.redis, lambda: self.redis.brpop(queue_keys, timeout=self.block_seconds)
        )
        if found is None:
            return None
        key, job = cast("tuple[bytes, bytes]", found)
        return UnitOfWork(keys.queue_name(key.decode()), job, self)

    def try_retrieve(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Take a job without waiting, or None if every queue is empty (drain mode)."""
        for name in self.order.next_order():
            job = cast("bytes | None", self.redis.rpop(keys.queue(name)))
            if job is not None:
                return UnitOfWork(name, job, self)
        return None

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None:
        """Put jobs back at the end their queue is read from, so they run next."""
        by_queue: dict[str, list[bytes]] = defaultdict(list)
        for unit in units:
            by_queue[unit.queue].append(unit.job)
        if not by_queue:
            return
        pipe = self.redis.pipeline(transaction=False)
        for queue, jobs in by_queue.items():
            pipe.rpush(keys.queue(queue), *jobs)
        pipe.execute()
