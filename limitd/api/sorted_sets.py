"""The ``schedule``, ``retry`` and ``dead`` sorted sets, for the admin API.

Members are payloads scored by epoch seconds (when they run, or when they died). A move
out of a set is one Lua call (the poller's own moves, ``limitd.retry.moves``), so an
entry retried twice, or by two operators at once, is enqueued once::

    from limitd.api import RetrySet

    for entry in RetrySet():
        if entry.error_class == "TimeoutError":
            entry.retry()
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, TypeVar

import redis as redis_py

from limitd import clock, keys
from limitd.api.records import PAGE_SIZE, JobRecord, _connection, _Seen
from limitd.payload import MalformedPayload, dead_entry_for_malformed
from limitd.redis import LuaScript
from limitd.retry import DeadSetPolicy, trim_dead
from limitd.retry.moves import bury_member, enqueue_member

SET_PAGE = LuaScript("limitd.api", "set_page.lua")

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


class SortedEntry(JobRecord):
    """A job in a sorted set, with its score: when it runs (schedule, retry) or when
    it died (dead)."""

    def __init__(
        self, raw: bytes, score: float, source: SortedSet[Any], seen: _Seen | None = None
    ) -> None:
        super().__init__(raw, seen)
        self.score = score
        self.source = source

    @property
    def at(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.score, dt.timezone.utc)

    def delete(self) -> bool:
        """Remove it; False when someone (a poller, an operator) moved it first."""
        return self._removed(bool(self.source.redis.zrem(self.source.key, self.raw)))

    def retry(self) -> bool:
        """Enqueue it now in its payload's queue with a fresh ``enqueued_at`` (retry
        count unchanged), in one atomic move. False when it was no longer in the set;
        MalformedPayload when no server could run it (delete or kill it instead)."""
        if self.payload is None:
            raise MalformedPayload(f"cannot retry {self.source.key} entry: {self.parse_error}")
        moved = enqueue_member(
            self.source.redis, self.source.key, self.raw, self.payload, clock.now()
        )
        return self._removed(moved)


class PendingEntry(SortedEntry):
    """An entry waiting to run (schedule or retry set): it can also be killed."""

    def kill(self) -> bool:
        """Move it to the dead set now, then trim the dead set. False when it was no
        longer here."""
        now = clock.now()
        moved = self._bury(now)
        if moved:
            trim_dead(self.source.redis, now, self.source.dead_policy)
        return moved

    def _bury(self, now: float) -> bool:
        """The atomic move alone. A malformed entry is wrapped with its reason, as the
        poller does, so the dead set holds something a reader can explain."""
        entry: bytes | str = self.raw
        if self.payload is None:
            entry = dead_entry_for_malformed(self.raw, "", str(self.parse_error), now)
        return self._removed(bury_member(self.source.redis, self.source.key, self.raw, entry, now))


EntryT = TypeVar("EntryT", bound=SortedEntry)


class SortedSet(Generic[EntryT]):
    """A sorted set of payloads scored by epoch seconds. ``dead_policy`` bounds the dead
    set after a kill (default: the one the retry handler uses)."""

    key: ClassVar[str]
    entry_class: ClassVar[type[SortedEntry]]
    page_size: int = PAGE_SIZE

    def __init__(
        self, redis: redis_py.Redis | None = None, *, dead_policy: DeadSetPolicy | None = None
    ) -> None:
        self.redis = _connection(redis)
        self.dead_policy = dead_policy or DeadSetPolicy()

    def size(self) -> int:
        return int(self.redis.zcard(self.key))

    def __iter__(self) -> Iterator[EntryT]:
        """Entries newest (highest score) first, a page at a time. An entry present
        throughout is yielded once, whatever the caller deletes, retries or kills. Only
        others (pollers, operators) removing every entry of the page just read can make
        entries with the last score seen repeat (never skip)."""
        seen = _Seen(self.page_size)
        last_score: bytes | str = "+inf"
        while True:
            flat = SET_PAGE(self.redis, [self.key], [self.page_size, last_score, *seen.anchors()])
            if not flat:
                return
            for member, score in zip(flat[0::2], flat[1::2], strict=True):
                seen.add(member)
                yield self._entry(member, float(score), seen)
                last_score = score

    def find_job(self, jid: str) -> EntryT | None:
        """The entry with this jid, or None (a server-side ZSCAN match on the jid)."""
        pattern = "*" + _GLOB_SPECIAL.sub(r"\\\1", jid) + "*"
        for member, score in self.redis.zscan_iter(self.key, match=pattern, count=1000):
            entry = self._entry(member, score)
            if entry.jid == jid:
                return entry
        return None

    def retry_all(self) -> int:
        """Enqueue every runnable entry now; returns how many moved. Malformed entries
        stay: delete or kill them."""
        return sum(entry.retry() for entry in self if entry.payload is not None)

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zcard(self.key)
        pipe.delete(self.key)
        return int(pipe.execute()[0])

    def _entry(self, member: bytes, score: float, seen: _Seen | None = None) -> EntryT:
        return self.entry_class(member, score, self, seen)  # type: ignore[return-value]


class PendingSet(SortedSet[PendingEntry]):
    """A set of jobs waiting to run, which can also be sent to the dead set."""

    entry_class = PendingEntry

    def kill_all(self) -> int:
        """Move every entry to the dead set, trimming it once at the end; returns how
        many moved."""
        now = clock.now()
        moved = sum(entry._bury(now) for entry in self)
        if moved:
            trim_dead(self.redis, now, self.dead_policy)
        return moved


class ScheduledSet(PendingSet):
    """Jobs pushed with ``perform_in`` / ``perform_at``, scored by when they run."""

    key = keys.SCHEDULE


class RetrySet(PendingSet):
    """Failed jobs waiting for their next attempt, scored by when it is due."""

    key = keys.RETRY


class DeadSet(SortedSet[SortedEntry]):
    """Jobs that ran out of retries or were killed, scored by when they died. Entries
    can be retried or deleted; they offer no ``kill``, they are dead already."""

    key = keys.DEAD
    entry_class = SortedEntry
