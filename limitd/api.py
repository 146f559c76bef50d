"""The admin API: what operators (and the CLI) read and steer at run time.

Queues, the ``schedule`` / ``retry`` / ``dead`` sorted sets and the global counters,
read straight from Sidekiq's data model, so the same calls work on jobs a Ruby client
pushed. The server never imports this module: nothing here is on a running job's path.

Every entry keeps the exact bytes Redis holds, because removing it (LREM, ZREM) must
name the stored value exactly. A value that is not a runnable payload is still listed,
with ``payload`` None and its raw text, and can be deleted or killed. A move out of a
sorted set is one Lua call (the poller's own moves, ``limitd.sorted_set_moves``), so an
entry retried twice, or by two operators at once, is enqueued once::

    from limitd.api import Queue, RetrySet, Stats

    for entry in RetrySet():
        if entry.error_class == "TimeoutError":
            entry.retry()
    print(Queue("default").latency(), Stats().enqueued)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections import deque
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, TypeVar

import redis as redis_py

from limitd import clock, keys
from limitd.client import default_client
from limitd.payload import (
    DEFAULT_QUEUE,
    MalformedPayload,
    Payload,
    dead_entry_for_malformed,
    parse,
    to_seconds,
)
from limitd.redis import LuaScript
from limitd.retry import DeadSetPolicy, trim_dead
from limitd.sorted_set_moves import bury_member, enqueue_member

QUEUE_PAGE = LuaScript(__package__ or "limitd", "api_queue_page.lua")
SET_PAGE = LuaScript(__package__ or "limitd", "api_set_page.lua")

PAGE_SIZE = 100
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def _connection(redis: redis_py.Redis | None) -> redis_py.Redis:
    return redis if redis is not None else default_client().redis


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _Seen:
    """What one iteration yielded and the caller has not removed since, newest first:
    the anchors the next page resumes after (see the page scripts). Entries deleted,
    retried or killed through the API leave it, so acting on entries while iterating
    never loses the iterator's place."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: deque[bytes] = deque()

    def add(self, raw: bytes) -> None:
        self.entries.appendleft(raw)

    def anchors(self) -> list[bytes]:
        """The newest ``size`` entries kept. Trimmed only here, between pages, so the
        caller's removals from the page just read leave older survivors as anchors."""
        while len(self.entries) > self.size:
            self.entries.pop()
        return list(self.entries)

    def discard(self, raw: bytes) -> None:
        with contextlib.suppress(ValueError):
            self.entries.remove(raw)


class JobRecord:
    """One stored job, read-only: the payload fields an operator looks at.

    ``raw`` is the value exactly as Redis holds it. ``payload`` is None when those bytes
    are not a payload a server could run (``parse_error`` says why): the record then has
    no jid, class or queue, and ``text`` shows what is there."""

    def __init__(self, raw: bytes, seen: _Seen | None = None) -> None:
        self.raw = raw
        self._seen = seen
        self.payload: Payload | None = None
        self.parse_error: str | None = None
        try:
            self.payload = parse(raw)
        except MalformedPayload as exc:
            self.parse_error = str(exc)

    def get(self, field: str, default: Any = None) -> Any:
        """A payload field, or ``default`` when absent or the entry is malformed."""
        return default if self.payload is None else self.payload.get(field, default)

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "backslashreplace")

    def get_str(self, field: str) -> str | None:
        """A string payload field, or None (absent, not a string, or malformed)."""
        value = self.get(field)
        return value if isinstance(value, str) else None

    @property
    def jid(self) -> str | None:
        return self.get_str("jid")

    @property
    def klass(self) -> str | None:
        """The ``class`` field: the job's wire name."""
        return self.get_str("class")

    @property
    def args(self) -> list[Any]:
        return list(self.get("args", []))

    @property
    def queue(self) -> str | None:
        """The queue the job runs in (where ``retry()`` sends it)."""
        return None if self.payload is None else str(self.get("queue") or DEFAULT_QUEUE)

    @property
    def enqueued_at(self) -> float | None:
        return to_seconds(self.get("enqueued_at"))

    @property
    def created_at(self) -> float | None:
        return to_seconds(self.get("created_at"))

    @property
    def failed_at(self) -> float | None:
        return to_seconds(self.get("failed_at"))

    @property
    def error_class(self) -> str | None:
        return self.get_str("error_class")

    @property
    def error_message(self) -> str | None:
        return self.get_str("error_message")

    @property
    def retry_count(self) -> int | None:
        count = self.get("retry_count")
        return count if isinstance(count, int) else None

    def latency(self) -> float:
        """Seconds since the job was enqueued (or created), never negative; 0.0 when the
        entry carries no timestamp."""
        since = self.enqueued_at or self.created_at
        return 0.0 if since is None else max(0.0, clock.now() - since)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} jid={self.jid} class={self.klass}>"

    def _removed(self, moved: bool) -> bool:
        if moved and self._seen is not None:
            self._seen.discard(self.raw)
        return moved


class QueueEntry(JobRecord):
    """A job waiting in a queue list."""

    def __init__(self, raw: bytes, source: Queue, seen: _Seen | None = None) -> None:
        super().__init__(raw, seen)
        self.source = source

    def delete(self) -> bool:
        """Remove this job (LREM of its exact bytes). False when a fetcher or another
        operator took it first."""
        removed = self.source.redis.lrem(self.source.key, 1, self.raw)  # type: ignore[arg-type]
        return self._removed(bool(removed))


class Queue:
    """One queue, ``queue:<name>``: a list that producers LPUSH and fetchers take from
    the right, so the oldest job sits at index -1."""

    page_size: int = PAGE_SIZE

    def __init__(self, name: str, redis: redis_py.Redis | None = None) -> None:
        self.name = name
        self.key = keys.queue(name)
        self.redis = _connection(redis)

    @classmethod
    def all(cls, redis: redis_py.Redis | None = None) -> list[Queue]:
        """Every queue named in ``queues``, sorted by name."""
        conn = _connection(redis)
        return [cls(name, conn) for name in sorted(map(_text, conn.smembers(keys.QUEUES)))]

    def size(self) -> int:
        return int(self.redis.llen(self.key))

    def latency(self) -> float:
        """Age in seconds of the oldest job, the one fetched next; 0.0 when empty."""
        raw: bytes | None = self.redis.lindex(self.key, -1)  # type: ignore[assignment]
        return 0.0 if raw is None else JobRecord(raw).latency()

    def __iter__(self) -> Iterator[QueueEntry]:
        """Jobs oldest first (fetch order), a page at a time. A job queued throughout is
        yielded once, whatever the caller deletes and fetchers take meanwhile; jobs
        pushed meanwhile come last. Only another operator deleting every job of the page
        just read can make older ones repeat (never skip)."""
        seen = _Seen(self.page_size)
        for page in self._pages(seen):
            yield from (QueueEntry(raw, self, seen) for raw in page)

    def find_job(self, jid: str) -> QueueEntry | None:
        """The queued job with this jid, or None. Scans the list: O(size)."""
        needle = jid.encode()
        for page in self._pages(_Seen(self.page_size)):
            for raw in page:
                if needle in raw and (entry := QueueEntry(raw, self)).jid == jid:
                    return entry
        return None

    def clear(self) -> int:
        """Drop the queue and its name from ``queues`` in one MULTI; returns how many
        jobs were removed."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.llen(self.key)
        pipe.delete(self.key)
        pipe.srem(keys.QUEUES, self.name)
        return int(pipe.execute()[0])

    def _pages(self, seen: _Seen) -> Iterator[list[bytes]]:
        """Pages oldest first; ``api_queue_page.lua`` finds where each one resumes."""
        walked = 0
        while True:
            args = [self.page_size, walked, *seen.anchors()]
            offset, page = QUEUE_PAGE(self.redis, [self.key], args)
            if not page:
                return
            walked = int(offset) + len(page)
            page.reverse()
            for raw in page:
                seen.add(raw)
            yield page

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"


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


class Stats:
    """A snapshot of the figures an operator watches, read when built and on
    ``refresh()``: two round trips, one MULTI for counters and set sizes, then the
    lengths of the queues it named (key names are built here, never in Lua)."""

    processed: int
    failed: int
    scheduled_size: int
    retry_size: int
    dead_size: int
    processes_size: int
    queues: dict[str, int]

    def __init__(self, redis: redis_py.Redis | None = None) -> None:
        self.redis = _connection(redis)
        self.refresh()

    @property
    def enqueued(self) -> int:
        """Jobs waiting in all queues together."""
        return sum(self.queues.values())

    def refresh(self) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(keys.STAT_PROCESSED)
        pipe.get(keys.STAT_FAILED)
        pipe.zcard(keys.SCHEDULE)
        pipe.zcard(keys.RETRY)
        pipe.zcard(keys.DEAD)
        pipe.scard(keys.PROCESSES)
        pipe.smembers(keys.QUEUES)
        processed, failed, scheduled, retries, dead, processes, names = pipe.execute()
        self.processed, self.failed = int(processed or 0), int(failed or 0)
        self.scheduled_size, self.retry_size, self.dead_size = scheduled, retries, dead
        self.processes_size = processes
        self.queues = self._queue_sizes(sorted(map(_text, names)))

    def _queue_sizes(self, names: list[str]) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(keys.queue(name))
        return dict(zip(names, map(int, pipe.execute()), strict=True))
