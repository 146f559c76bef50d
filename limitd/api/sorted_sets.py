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

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

import redis as redis_py

from limitd import clock, keys
from limitd.api.records import PAGE_SIZE, JobRecord, _Seen
from limitd.client import connection_or_default
from limitd.connection import LuaScript
from limitd.payload import MalformedPayload, dead_entry_for_malformed
from limitd.retry import DeadSetPolicy, trim_dead
from limitd.retry.moves import bury_member, enqueue_member

SET_PAGE = LuaScript("limitd.api", "set_page.lua")

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
SCAN_COUNT = 1000  # members one ZSCAN call looks at (a hint to Redis)
SCAN_LIMIT = 20_000  # members a filtered page looks at, at most (see filtered_page)


def _glob(text: str) -> str:
    """A ZSCAN MATCH pattern for members containing ``text``."""
    return "*" + _GLOB_SPECIAL.sub(r"\\\1", text) + "*"


@dataclasses.dataclass(frozen=True)
class EntryFilter:
    """Which entries a filtered read keeps: ``name`` is a substring of the job's class,
    ``text`` a substring of the payload as stored (both case-sensitive; None or empty
    keeps all). Malformed entries have no class: they never match a name."""

    name: str | None = None
    text: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.name or self.text)

    def pattern(self) -> str:
        """What Redis matches server-side, so only likely members cross the wire: the
        text (a substring of the stored bytes by definition), else the name when JSON
        writes it as is (printable ASCII without quote or backslash)."""
        if self.text:
            return _glob(self.text)
        name = self.name or ""
        if name.isascii() and name.isprintable() and not {'"', "\\"} & set(name):
            return _glob(name)
        return "*"

    def keeps(self, raw: bytes, klass: str | None) -> bool:
        if self.text and self.text.encode() not in raw:
            return False
        return not self.name or self.name in (klass or "")


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


@dataclasses.dataclass(frozen=True)
class FilteredPage(Generic[EntryT]):
    """One page of the entries a filter keeps. ``matched`` counts the matches found;
    ``complete`` is False when the scan stopped at its bound: more entries (and more
    pages) may match than ``matched`` says."""

    entries: list[EntryT]
    matched: int
    complete: bool


class SortedSet(Generic[EntryT]):
    """A sorted set of payloads scored by epoch seconds. ``dead_policy`` bounds the dead
    set after a kill (default: the one the retry handler uses)."""

    entry_class: ClassVar[type[SortedEntry]]
    page_size: int = PAGE_SIZE

    key_name: ClassVar[str]  # the name in a keys.KeyLayout: SCHEDULE, RETRY or DEAD

    @property
    def key(self) -> str:
        """The set's name in the key layout of this set's connection."""
        return str(getattr(keys.of(self.redis), self.key_name))

    def __init__(
        self, redis: redis_py.Redis | None = None, *, dead_policy: DeadSetPolicy | None = None
    ) -> None:
        self.redis = connection_or_default(redis)
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

    def page(self, start: int, count: int, *, ascending: bool = False) -> list[EntryT]:
        """``count`` entries from the ``start``-th, highest score first (``ascending``:
        lowest first): one ZREVRANGE (ZRANGE) with scores, however large the set (a
        dashboard's page ``n`` of the dead set)."""
        if count <= 0:
            return []
        read = self.redis.zrange if ascending else self.redis.zrevrange
        flat: list[tuple[bytes, float]] = read(  # type: ignore[assignment]
            self.key, start, start + count - 1, withscores=True
        )
        return [self._entry(member, float(score)) for member, score in flat]

    def filtered_page(
        self,
        where: EntryFilter,
        start: int,
        count: int,
        *,
        ascending: bool = False,
        scan_limit: int = SCAN_LIMIT,
    ) -> FilteredPage[EntryT]:
        """``count`` of the entries ``where`` keeps, from the ``start``-th match, in the
        set's order (highest score first, or lowest with ``ascending``).

        ZSCAN walks the set in no order, with Redis matching ``where.pattern()`` so
        only candidates are sent. It stops after about ``scan_limit`` members (a call
        per ``SCAN_COUNT``): matches found so far are sorted and paged, and
        ``complete`` is False, for "more may match". A set smaller than the bound (the
        dead set keeps 10,000 at most) is filtered exactly."""
        found, complete = self._scan(where.pattern(), max(1, -(-scan_limit // SCAN_COUNT)))
        ordered = sorted(found.items(), key=lambda item: (item[1], item[0]), reverse=not ascending)
        stop = start + max(0, count)
        if not where.name:  # the stored bytes decide: parse only the page shown
            kept = [(member, score) for member, score in ordered if where.keeps(member, None)]
            page = [self._entry(member, score) for member, score in kept[start:stop]]
            return FilteredPage(page, len(kept), complete)
        entries = (self._entry(member, score) for member, score in ordered)
        matches = [entry for entry in entries if where.keeps(entry.raw, entry.klass)]
        return FilteredPage(matches[start:stop], len(matches), complete)

    def matching(self, where: EntryFilter) -> Iterator[EntryT]:
        """Every entry ``where`` keeps, in no order (a ZSCAN over the whole set): what
        an action on "all matching" walks. Entries present throughout are yielded once,
        whatever the caller removes meanwhile."""
        seen: set[bytes] = set()
        for member, score in self.redis.zscan_iter(
            self.key, match=where.pattern(), count=SCAN_COUNT
        ):
            if member in seen:
                continue
            seen.add(member)
            entry = self._entry(member, float(score))
            if where.keeps(entry.raw, entry.klass):
                yield entry

    def find_job(self, jid: str, score: float | None = None) -> EntryT | None:
        """The entry with this jid, or None: a server-side ZSCAN match on the jid. With
        ``score``, only an entry with exactly that score (see ``entries_at``): what a
        page that listed the entry sends back, so a duplicate jid elsewhere in the set
        or an entry that moved since (a retry due later) is not mistaken for it."""
        if score is not None:
            return next((entry for entry in self.entries_at(score) if entry.jid == jid), None)
        for member, member_score in self.redis.zscan_iter(
            self.key, match=_glob(jid), count=SCAN_COUNT
        ):
            entry = self._entry(member, float(member_score))
            if entry.jid == jid:
                return entry
        return None

    def entries_at(self, score: float) -> list[EntryT]:
        """The entries with exactly this score (one ZRANGEBYSCORE): how a page names an
        entry it listed, malformed ones (no jid) included."""
        flat: list[tuple[bytes, float]] = self.redis.zrangebyscore(  # type: ignore[assignment]
            self.key, score, score, withscores=True
        )
        return [self._entry(member, float(member_score)) for member, member_score in flat]

    def retry_all(self, entries: Iterable[EntryT] | None = None) -> int:
        """Enqueue every runnable entry now (or those of ``entries``, e.g.
        ``matching(...)``); returns how many moved. Malformed entries stay: delete or
        kill them."""
        chosen = self if entries is None else entries
        return sum(entry.retry() for entry in chosen if entry.payload is not None)

    def _scan(self, pattern: str, calls: int) -> tuple[dict[bytes, float], bool]:
        """Members matching ``pattern`` with their scores, from at most ``calls`` ZSCAN
        calls; True when the scan went round the whole set."""
        found: dict[bytes, float] = {}
        cursor: int = 0
        batch: list[tuple[bytes, float]]
        for _ in range(calls):
            reply = self.redis.zscan(self.key, cursor, match=pattern, count=SCAN_COUNT)
            cursor, batch = reply  # type: ignore[assignment]
            found.update(batch)
            if cursor == 0:
                return found, True
        return found, False

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

    def kill_all(self, entries: Iterable[PendingEntry] | None = None) -> int:
        """Move every entry (or those of ``entries``, e.g. ``matching(...)``) to the
        dead set, trimming it once at the end; returns how many moved."""
        now = clock.now()
        moved = sum(entry._bury(now) for entry in (self if entries is None else entries))
        if moved:
            trim_dead(self.redis, now, self.dead_policy)
        return moved


class ScheduledSet(PendingSet):
    """Jobs pushed with ``perform_in`` / ``perform_at``, scored by when they run."""

    key_name = "SCHEDULE"


class RetrySet(PendingSet):
    """Failed jobs waiting for their next attempt, scored by when it is due."""

    key_name = "RETRY"


class DeadSet(SortedSet[SortedEntry]):
    """Jobs that ran out of retries or were killed, scored by when they died. Entries
    can be retried or deleted; they offer no ``kill``, they are dead already."""

    key_name = "DEAD"

    entry_class = SortedEntry
