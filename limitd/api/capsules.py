"""The limit-fetch capsules Redis knows about, for operators asking "who holds my jobs?".

Each capsule registers its id in ``limitd:capsules`` and keeps a heartbeat key alive
with a TTL; the jobs it runs sit in one in-progress list per queue. A capsule whose key
expired is dead: its jobs stay in its lists until a reaper (any live capsule) returns
them to their queues, so a dead capsule with jobs is normal for a few seconds, and a
sign of trouble if it stays::

    from limitd.api import Capsules

    for capsule in Capsules():
        print(capsule.id, capsule.alive, capsule.ttl, capsule.in_progress)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import redis as redis_py

from limitd import keys
from limitd.client import connection_or_default
from limitd.connection import decode_name, set_members

NO_KEY = -2  # TTL's reply for a key that does not exist


@dataclasses.dataclass(frozen=True)
class Capsule:
    """One registered capsule. ``alive``: its heartbeat key exists, so no reaper will
    take its jobs. ``ttl``: seconds before that key expires (None when there is no key,
    or no expiry). ``in_progress``: jobs it is running, per queue it has taken jobs from
    (0 for queues it has emptied)."""

    id: str
    alive: bool
    ttl: int | None
    in_progress: dict[str, int]

    @property
    def busy(self) -> int:
        """Jobs this capsule is running, all queues together."""
        return sum(self.in_progress.values())


class Capsules:
    """A snapshot of every registered capsule, sorted by id, read when built and on
    ``refresh()``: three round trips however many capsules and queues there are (ids;
    heartbeats and queue sets; in-progress lengths)."""

    capsules: list[Capsule]

    def __init__(self, redis: redis_py.Redis | None = None) -> None:
        self.redis = connection_or_default(redis)
        self.refresh()

    def refresh(self) -> None:
        k = keys.of(self.redis)
        ids = set_members(self.redis, k.CAPSULES)
        cluster = k.cluster
        pipe = self.redis.pipeline(transaction=False)
        for capsule_id in ids:
            pipe.ttl(k.capsule_heartbeat(capsule_id))
        for capsule_id in [] if cluster else ids:
            pipe.smembers(k.capsule_queues(capsule_id))
        replies = pipe.execute()
        ttls = [int(ttl) for ttl in replies[: len(ids)]]
        # In cluster mode no set spans queues: every queue Redis knows is looked at.
        every = set_members(self.redis, k.QUEUES) if cluster else []
        held = (
            [every for _ in ids]
            if cluster
            else [sorted(map(decode_name, queues)) for queues in replies[len(ids) :]]
        )
        counts = self._in_progress(ids, held)
        self.capsules = [
            Capsule(capsule_id, ttl != NO_KEY, ttl if ttl >= 0 else None, in_progress)
            for capsule_id, ttl, in_progress in zip(ids, ttls, counts, strict=True)
        ]

    def _in_progress(self, ids: list[str], held: list[list[str]]) -> list[dict[str, int]]:
        """Length of each capsule's in-progress list of each queue it holds, in one
        pipeline."""
        k = keys.of(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        for capsule_id, queues in zip(ids, held, strict=True):
            for queue in queues:
                pipe.llen(k.in_progress(capsule_id, queue))
        lengths = iter(pipe.execute())
        return [{queue: int(next(lengths)) for queue in queues} for queues in held]

    def __iter__(self) -> Iterator[Capsule]:
        return iter(self.capsules)

    def __len__(self) -> int:
        return len(self.capsules)

    def __repr__(self) -> str:
        return f"<Capsules {[capsule.id for capsule in self.capsules]}>"
