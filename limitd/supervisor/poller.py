"""The scheduled poller: moves due jobs from ``schedule`` and ``retry`` to their queues.

Each job moves in one atomic Lua call (see ``limitd/sorted_set_moves.py``). Pollers of many
processes do not coordinate; instead each sleeps a random interval whose average grows
with the number of live processes, so that together they poll about every
``average_scheduled_poll_interval`` seconds (Sidekiq's scheme). At start the poller
also prunes ``processes`` of identities whose heartbeat hash has expired, and once an
hour across the cluster it drops expired batches from the batch index.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar, cast

import redis as redis_py

from limitd import clock, keys
from limitd.batch.store import prune_index
from limitd.payload import MalformedPayload, dead_entry_for_malformed, parse
from limitd.retry import DeadSetPolicy, trim_dead
from limitd.sorted_set_moves import bury_member, enqueue_member

log = logging.getLogger("limitd.poller")
T = TypeVar("T")

SORTED_SETS = (keys.RETRY, keys.SCHEDULE)
PEEK = 100
INITIAL_WAIT = 10.0
ERROR_PAUSE = 5.0
CLEANUP_LOCK_SECONDS = 60
BATCH_PRUNE_SECONDS = 3600


class ScheduledPoller:
    def __init__(
        self,
        redis: redis_py.Redis,
        *,
        poll_interval_average: float | None = None,
        average_scheduled_poll_interval: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.redis = redis
        self.poll_interval_average = poll_interval_average
        self.average_scheduled_poll_interval = average_scheduled_poll_interval
        self.rng = rng or random.Random()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def terminate(self) -> None:
        self._done.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def enqueue_due(self, now: float | None = None) -> int:
        """Move every job due at ``now`` (default: the clock) and return how many."""
        moved = 0
        for zset in SORTED_SETS:
            moved += self._drain_set(zset, clock.now() if now is None else now)
        return moved

    def cleanup_processes(self) -> int:
        """Forget processes whose heartbeat hash expired; at most once a minute across
        the whole cluster (the lock key), because it reads every process."""
        if not self.redis.set(keys.PROCESS_CLEANUP_LOCK, "1", nx=True, ex=CLEANUP_LOCK_SECONDS):
            return 0
        identities = list(self.redis.sscan_iter(keys.PROCESSES))
        pipe = self.redis.pipeline(transaction=False)
        for identity in identities:
            pipe.hget(identity, "info")
        infos = pipe.execute()
        gone = [ident for ident, info in zip(identities, infos, strict=True) if info is None]
        return int(self.redis.srem(keys.PROCESSES, *gone)) if gone else 0

    def prune_batch_index(self) -> int:
        """Forget batches whose data expired; one process an hour does it (the lock)."""
        if not self.redis.set(keys.BATCH_INDEX_PRUNE_LOCK, "1", nx=True, ex=BATCH_PRUNE_SECONDS):
            return 0
        return prune_index(self.redis)

    def random_poll_interval(self) -> float:
        """Random around the average, ±50% for small clusters, so restarts don't
        synchronise the pollers (a thundering herd)."""
        count = max(1, int(self.redis.scard(keys.PROCESSES)))
        interval = self.poll_interval_average or count * self.average_scheduled_poll_interval
        if count < 10:
            return interval * self.rng.random() + interval / 2
        return interval * self.rng.random()

    def _drain_set(self, zset: str, now: float) -> int:
        moved = 0
        while not self._done.is_set():
            due = cast("list[bytes]", self.redis.zrangebyscore(zset, "-inf", now, 0, PEEK))
            if not due:
                break
            moved += sum(self._move(zset, member, now) for member in due)
            if len(due) < PEEK:
                break
        return moved

    def _move(self, zset: str, member: bytes, now: float) -> bool:
        try:
            payload = parse(member)
        except MalformedPayload as exc:
            log.error("unreadable job in %s sent to the dead set: %s", zset, exc)
            entry = dead_entry_for_malformed(member, "", str(exc), now)
            buried = bury_member(self.redis, zset, member, entry, now)
            trim_dead(self.redis, now, DeadSetPolicy())
            return buried
        return enqueue_member(self.redis, zset, member, payload, now)

    def _run(self) -> None:
        self._wait(self._initial_wait())
        self._safely(self.cleanup_processes)
        while not self._done.is_set():
            self._safely(self.enqueue_due)
            self._safely(self.prune_batch_index)
            self._wait(self._safely(self.random_poll_interval) or ERROR_PAUSE)

    def _initial_wait(self) -> float:
        """Give heartbeats time to register (they size the interval), plus jitter so
        processes started together do not poll together. An explicit average (small in
        tests) replaces the fixed part."""
        if self.poll_interval_average:
            return self.rng.random() * self.poll_interval_average
        return INITIAL_WAIT + 5 * self.rng.random()

    def _wait(self, seconds: float) -> None:
        self._done.wait(seconds)

    def _safely(self, action: Callable[[], T]) -> T | None:
        try:
            return action()
        except redis_py.RedisError as exc:
            log.warning("poller: %s", exc)
            self._wait(ERROR_PAUSE)
            return None
