"""Limit fetch: the default fetch, aware of queue limits and reliable.

One Lua call (``limit_fetch.lua``) picks the first eligible queue in this fetch's order,
moves one job into this capsule's in-progress list and counts the busy slot. The job
stays in Redis until :meth:`LimitUnitOfWork.acknowledge` (or ``requeue``) removes it in
another single call (``limit_release.lua``), so a capsule killed with SIGKILL loses
nothing: the reaper returns its in-progress jobs to their queues.

A queue is skipped when it is paused, when this capsule runs ``process_limit`` jobs of
it, or when all capsules together run ``limit``. A *blocking* queue that has jobs but is
at its limit stops the fetch there: queues after it wait too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import redis as redis_py

from limitd import clock, keys
from limitd.fetch.basic import UnitOfWork
from limitd.fetch.order import QueueOrder
from limitd.fetch.wakeup import IdleGate
from limitd.redis import LuaScript, set_members

LIMIT_FETCH = LuaScript(__package__ or "limitd.fetch", "limit_fetch.lua")
LIMIT_RELEASE = LuaScript(__package__ or "limitd.fetch", "limit_release.lua")
DYNAMIC_REFRESH_SECONDS = 5.0


@dataclass
class LimitUnitOfWork(UnitOfWork):
    fetch: LimitFetch  # type: ignore[assignment]

    def acknowledge(self) -> None:
        """Remove the job from the in-progress list and free its slot. A capsule that
        was reaped meanwhile frees nothing: the job is no longer its own."""
        self.fetch.release(self, requeue=False)

    def requeue(self) -> None:
        self.fetch.release(self, requeue=True)


class LimitFetch:
    """Fetches for one capsule, identified by ``capsule_id``."""

    def __init__(
        self,
        redis: redis_py.Redis,
        order: QueueOrder,
        capsule_id: str,
        *,
        gate: IdleGate | None = None,
        blocking: Iterable[str] = (),
        dynamic: bool = False,
    ) -> None:
        self.redis = redis
        self.order = order
        self.capsule_id = capsule_id
        self.gate = gate or IdleGate()
        self.blocking = frozenset(blocking)
        self.dynamic = dynamic
        self._fixed_keys = [
            keys.LIMITS,
            keys.PROCESS_LIMITS,
            keys.PAUSED,
            keys.BUSY,
            keys.capsule_queues(capsule_id),
            keys.CAPSULES,
        ]
        self._queue_keys: dict[str, tuple[str, str]] = {}
        self._extra_queues: list[str] = []
        self._extra_refreshed = float("-inf")
        self._lock = threading.Lock()

    @property
    def block_seconds(self) -> float:
        return self.gate.poll_range[1]

    def retrieve_work(self) -> LimitUnitOfWork | None:
        """Take a job, or wait on the idle gate once and try again."""
        unit = self.try_retrieve()
        if unit is None:
            self.gate.wait()
            unit = self.try_retrieve()
        if unit is not None:
            self.gate.wake_one_more()
        return unit

    def try_retrieve(self) -> LimitUnitOfWork | None:
        """One atomic fetch attempt over this fetch's queue order, without waiting."""
        names = self.queue_names()
        queue_keys: list[str] = list(self._fixed_keys)
        args: list[str] = [self.capsule_id]
        for name in names:
            queue_keys.extend(self._keys_for(name))
            args += [name, "1" if name in self.blocking else "0"]
        found = cast("list[bytes] | None", LIMIT_FETCH(self.redis, queue_keys, args))
        if not found:
            return None
        return LimitUnitOfWork(found[0].decode(), found[1], self)

    def queue_names(self) -> list[str]:
        """This fetch's order; with ``dynamic``, queues known to Redis but not configured
        follow the configured ones."""
        names = self.order.next_order()
        if self.dynamic:
            names += self._dynamic_queues()
        return names

    def wants(self, queue: str) -> bool:
        """Whether a wake-up for ``queue`` concerns this fetch ("" means any queue)."""
        return not queue or self.dynamic or queue in self.order.weights

    def release(self, unit: UnitOfWork, *, requeue: bool) -> bool:
        """Ack or requeue one unit; False when it was no longer this capsule's."""
        return bool(self._release(self.redis, unit, requeue))

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None:
        """Requeue several units in one round trip (hard shutdown)."""
        batch = list(units)
        if not batch:
            return
        pipe = self.redis.pipeline(transaction=False)
        for unit in batch:
            self._release(pipe, unit, True)
        pipe.execute()

    def _release(self, conn: object, unit: UnitOfWork, requeue: bool) -> object:
        queue_key, in_progress = self._keys_for(unit.queue)
        return LIMIT_RELEASE(
            conn,
            [in_progress, keys.BUSY, keys.LIMITS, queue_key],
            [unit.job, unit.queue, "requeue" if requeue else "ack", keys.WAKE_CHANNEL],
        )

    def _keys_for(self, name: str) -> tuple[str, str]:
        cached = self._queue_keys.get(name)
        if cached is None:
            cached = (keys.queue(name), keys.in_progress(self.capsule_id, name))
            self._queue_keys[name] = cached
        return cached

    def _dynamic_queues(self) -> list[str]:
        now = clock.monotonic()
        with self._lock:
            if now - self._extra_refreshed >= DYNAMIC_REFRESH_SECONDS:
                known = self.order.weights
                names = set_members(self.redis, keys.QUEUES)
                self._extra_queues = [name for name in names if name not in known]
                self._extra_refreshed = now
            return list(self._extra_queues)

    def refresh_dynamic(self) -> None:
        """Forget the cached queue list (a wake-up named a queue we do not know yet)."""
        with self._lock:
            self._extra_refreshed = float("-inf")
