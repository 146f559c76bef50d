"""Queues for the admin API: the jobs waiting in one, and the knobs that steer it.

The jobs are read straight from Sidekiq's ``queue:<name>`` list. Limits, pause and busy
counts go through ``limitd.fetch.limits``, the module the limit fetcher itself uses, so
the admin API and the servers can never disagree on how they are stored::

    from limitd.api import Queue

    q = Queue("webhooks")
    q.limit = 5          # at most 5 webhooks at once, across all capsules
    q.pause()            # running jobs finish, nothing new starts; the limit stays
    print(q.size(), q.latency(), q.busy(), q.busy_by_capsule())
"""

from __future__ import annotations

from collections.abc import Iterator

import redis as redis_py

from limitd import keys
from limitd.api.records import PAGE_SIZE, JobRecord, _Seen
from limitd.client import connection_or_default
from limitd.connection import LuaScript, set_members
from limitd.fair_queues import store as fair_store
from limitd.queues import limits, rates
from limitd.queues.rates import Rate

QUEUE_PAGE = LuaScript("limitd.api", "queue_page.lua")


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


class LineEntry(QueueEntry):
    """A job waiting in a fair queue's tenant line (``limitd.fair_queues``)."""

    def __init__(self, raw: bytes, source: Queue, tenant: str) -> None:
        super().__init__(raw, source)
        self.tenant = tenant

    def delete(self) -> bool:
        """Remove this job from its tenant's line. False when a fetcher or another
        operator took it first."""
        source = self.source
        removed = fair_store.delete_from_line(source.redis, source.name, self.tenant, self.raw)
        return self._removed(removed)


class Queue:
    """One queue, ``queue:<name>``: a list that producers LPUSH and fetchers take from
    the right, so the oldest job sits at index -1."""

    page_size: int = PAGE_SIZE

    def __init__(self, name: str, redis: redis_py.Redis | None = None) -> None:
        self.name = name
        self.redis = connection_or_default(redis)
        self.key = keys.of(self.redis).queue(name)

    @classmethod
    def all(cls, redis: redis_py.Redis | None = None) -> list[Queue]:
        """Every queue named in ``queues``, sorted by name."""
        conn = connection_or_default(redis)
        return [cls(name, conn) for name in set_members(conn, keys.of(conn).QUEUES)]

    def size(self) -> int:
        """Jobs waiting: its list, and for a fair queue its tenants' lines too."""
        k = keys.of(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.key)
        pipe.hget(k.fair_queues_of(self.name), self.name)
        pipe.hget(k.fair_part(self.name, "state"), "jobs")
        length, setting, lines = pipe.execute()
        return int(length) + (int(lines or 0) if fair_store.parse_stored(setting) else 0)

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

    def page(self, start: int, count: int) -> list[QueueEntry]:
        """``count`` jobs from the ``start``-th oldest, oldest first: one LRANGE, however
        long the queue (a dashboard's page ``n`` of a million jobs). A fair queue's pages
        go on past its list into its tenants' lines, tenant by tenant in turn order."""
        raw: list[bytes] = self.redis.lrange(self.key, -(start + count), -(start + 1))  # type: ignore[assignment]
        entries = [QueueEntry(item, self) for item in reversed(raw)]
        if len(entries) < count and self.fair():
            listed = int(self.redis.llen(self.key))
            rest = fair_store.lines_page(
                self.redis, self.name, max(0, start - listed), count - len(entries)
            )
            entries += [LineEntry(item, self, tenant) for tenant, item in rest]
        return entries

    def fair(self) -> bool:
        """Whether the queue serves its tenants in turn (``limitd.fair_queues``)."""
        k = keys.of(self.redis)
        stored = self.redis.hget(k.fair_queues_of(self.name), self.name)
        return fair_store.parse_stored(stored) is not None

    def find_job(self, jid: str) -> QueueEntry | None:
        """The queued job with this jid, or None. Scans the list: O(size)."""
        needle = jid.encode()
        for page in self._pages(_Seen(self.page_size)):
            for raw in page:
                if needle in raw and (entry := QueueEntry(raw, self)).jid == jid:
                    return entry
        return self._find_in_lines(jid) if self.fair() else None

    def _find_in_lines(self, jid: str) -> QueueEntry | None:
        """A fair queue's job waiting in its tenant's line, by jid: O(jobs waiting)."""
        needle, start = jid.encode(), 0
        while page := fair_store.lines_page(self.redis, self.name, start, self.page_size):
            for tenant, raw in page:
                if needle in raw and (entry := LineEntry(raw, self, tenant)).jid == jid:
                    return entry
            start += len(page)
        return None

    def clear(self) -> int:
        """Drop the queue and its name from ``queues`` in one MULTI (in cluster mode, where
        they are on different shards, one round trip); returns how many jobs were
        removed. Its limits and pause flag stay: they steer jobs pushed later."""
        k = keys.of(self.redis)
        pipe = self.redis.pipeline(transaction=not k.cluster)
        pipe.llen(self.key)
        pipe.delete(self.key)
        pipe.srem(k.QUEUES, self.name)
        removed = int(pipe.execute()[0])
        return removed + fair_store.clear_lines(self.redis, self.name)

    # Limits: how many jobs of this queue may run at once, across all capsules (limit)
    # and within one capsule (process_limit). None means unlimited.

    @property
    def limit(self) -> int | None:
        """The limit for all capsules together; None when the queue has none."""
        return limits.get_limit(self.redis, self.name)

    @limit.setter
    def limit(self, value: int | None) -> None:
        """Set it now (running capsules apply it on their next fetch); None clears it."""
        self._set_limit(value, process=False)

    @property
    def process_limit(self) -> int | None:
        """The limit within each capsule; None when the queue has none."""
        return limits.get_limit(self.redis, self.name, process=True)

    @process_limit.setter
    def process_limit(self, value: int | None) -> None:
        self._set_limit(value, process=True)

    def clear_limit(self, *, process: bool = False) -> None:
        """Make the queue unlimited, and keep it so even where configuration sets a
        limit: capsules write their configured limits only where Redis has no value."""
        limits.clear_limit(self.redis, self.name, process=process)

    def reset_limit(self, *, process: bool = False) -> None:
        """Undo run-time changes: the configured limit (if any) comes back at the next
        capsule heartbeat."""
        limits.reset_limit(self.redis, self.name, process=process)

    def _set_limit(self, value: int | None, *, process: bool) -> None:
        if value is None:
            self.clear_limit(process=process)
            return
        where = f"queue {self.name!r} {'process_limit' if process else 'limit'}"
        limits.set_limit(self.redis, self.name, limits.check_limit(value, where), process=process)

    # Rate limit: how many jobs of this queue may start per interval, all capsules
    # together. None means none.

    @property
    def rate_limit(self) -> Rate | None:
        """The rate limit in force (``str()`` gives "100/minute"); None when none."""
        return rates.get_rate(self.redis, self.name)

    @rate_limit.setter
    def rate_limit(self, value: Rate | str | None) -> None:
        """Set it now ("100/minute", "10/30s" or a ``Rate``; running capsules apply it
        on their next fetch); None clears it. ValueError for a malformed rate."""
        if value is None:
            self.clear_rate_limit()
        else:
            rates.set_rate(self.redis, self.name, value)

    def clear_rate_limit(self) -> None:
        """No rate limit, and none even where configuration sets one."""
        rates.clear_rate(self.redis, self.name)

    def reset_rate_limit(self) -> None:
        """Undo run-time changes: the configured rate (if any) comes back at the next
        capsule heartbeat."""
        rates.reset_rate(self.redis, self.name)

    # Pause and busy slots.

    def pause(self) -> None:
        """Stop fetching from this queue: jobs already running finish, jobs keep
        arriving, the limits stay as they are."""
        limits.pause(self.redis, self.name)

    def resume(self) -> None:
        """Fetch again, waking idle fetchers at once."""
        limits.resume(self.redis, self.name)

    @property
    def paused(self) -> bool:
        return limits.is_paused(self.redis, self.name)

    def busy(self) -> int:
        """Jobs of this queue in progress across all capsules: the figure its ``limit``
        is checked against."""
        return limits.busy(self.redis, self.name)

    def busy_by_capsule(self) -> dict[str, int]:
        """Jobs of this queue in progress per capsule id, from each capsule's
        in-progress list (capsules running none are left out)."""
        return limits.busy_by_capsule(self.redis, self.name)

    def _pages(self, seen: _Seen) -> Iterator[list[bytes]]:
        """Pages oldest first; ``queue_page.lua`` finds where each one resumes."""
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
