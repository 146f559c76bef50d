"""The scheduled poller: moves due jobs from ``schedule`` and ``retry`` to their queues.

Due jobs move a page at a time, atomically within one Lua call (see
``limitd/retry/moves.py``), so pollers of many processes never move a job twice: on a
standalone server each call reads and moves a page in Redis, so pollers that look at the
same moment take different pages; in a cluster, where each job is handed off to its
queue's shard on its own, they race for each job harmlessly and one wins.

When to look depends on the capsule's ``scheduled_poll``:

- ``due`` (the default): read the earliest score of each set (``ZRANGE 0 0 WITHSCORES``)
  and sleep until then. Whoever adds to ``schedule`` or ``retry`` publishes the due time
  on ``limitd:wake:due`` in the same round trip; the capsule's wake-up listener passes it
  to :meth:`ScheduledPoller.announce`, which brings the wake-up forward when it is sooner,
  without a Redis command. A job starts within milliseconds of its time, and with nothing
  scheduled the poller sleeps the long interval below.
- ``interval``: Sidekiq's scheme, kept for comparison: look every long interval only.

The long interval is random, with an average that grows with the number of live
processes, so that together they look about every ``average_scheduled_poll_interval``
seconds. It caps every sleep: a job whose announcement was lost (pushed by a client that
does not publish, such as Ruby Sidekiq, or while the subscription was being remade)
waits no longer than it would with Sidekiq. It also paces the upkeep: the first one (after
heartbeats have registered) prunes ``processes`` of identities whose heartbeat hash has
expired, and each one runs the housekeeping the features registered
(``limitd.plugins.Feature.housekeeping``; batches drop expired entries from their index,
one process an hour).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import redis as redis_py

from limitd import clock, handoff, keys, plugins
from limitd.connection.backoff import Backoff
from limitd.fetch import WakeHandler
from limitd.payload import MalformedPayload, dead_entry_for_malformed, parse
from limitd.retry import DeadSetPolicy, trim_dead
from limitd.retry.moves import bury_member, enqueue_member, move_due_page

log = logging.getLogger("limitd.poller")
T = TypeVar("T")


def sorted_sets(layout: keys.KeyLayout) -> tuple[str, str]:
    """The sets the poller drains."""
    return layout.RETRY, layout.SCHEDULE


MODES = ("due", "interval")
PEEK = 500  # due jobs read and moved per call
SPREAD = 8  # pages of a burst among which each call picks one (see _drain_parsed)
INITIAL_WAIT = 10.0
ERROR_PAUSE = 5.0
CLEANUP_LOCK_SECONDS = 60


class ScheduledPoller:
    def __init__(
        self,
        redis: redis_py.Redis,
        *,
        poll_interval_average: float | None = None,
        average_scheduled_poll_interval: float = 5.0,
        mode: str = "due",
        rng: random.Random | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"scheduled poll mode must be one of {MODES}, not {mode!r}")
        self.redis = redis
        self.keys = keys.of(redis)  # the key layout of its connection
        self.poll_interval_average = poll_interval_average
        self.average_scheduled_poll_interval = average_scheduled_poll_interval
        self.mode = mode
        self.rng = rng or random.Random()
        self._done = threading.Event()
        self._cond = threading.Condition()
        self._backoff = Backoff(log, "poller", first=1.0, cap=ERROR_PAUSE)
        self._announced: float | None = None  # earliest due time heard since the last look
        self._cleaned = False
        self._thread = threading.Thread(target=self._run, name="limitd-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def terminate(self) -> None:
        self._done.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def channels(self) -> dict[str, WakeHandler]:
        """The pub/sub channels this poller needs, with their handlers: the capsule adds
        them to its one wake-up subscription (see ``fetch/wakeup.py``)."""
        return {keys.DUE_CHANNEL: self.announce} if self.mode == "due" else {}

    def announce(self, messages: Sequence[str]) -> None:
        """Jobs were scheduled at ``messages`` (epoch seconds): wake at the soonest if
        that is sooner than planned. "" (sent after each subscription) means: look now,
        something may have been announced while nobody listened. Called from the
        listener thread."""
        if not messages:
            return
        due = min(due_time(message) for message in messages)
        with self._cond:
            if self._announced is None or due < self._announced:
                self._announced = due
                self._cond.notify_all()

    def enqueue_due(self, now: float | None = None) -> int:
        """Move every job due at ``now`` (default: the clock) and return how many."""
        moved = 0
        if self.keys.cluster:  # batch callbacks and stalled moves (limitd.handoff)
            moved += handoff.push_waiting(self.redis, clock.now() if now is None else now)
        for zset in sorted_sets(self.keys):
            moved += self._drain_set(zset, clock.now() if now is None else now)
        return moved

    def heads(self) -> dict[str, float]:
        """The earliest score of each non-empty set, in one round trip."""
        names = sorted_sets(self.keys)
        pipe = self.redis.pipeline(transaction=False)
        for zset in names:
            pipe.zrange(zset, 0, 0, withscores=True)
        rows = zip(names, pipe.execute(), strict=True)
        return {zset: float(head[0][1]) for zset, head in rows if head}

    def move_due(self) -> float | None:
        """Move every job due now, reading only the sets whose earliest job is due.
        Returns the earliest due time left (None: both sets are empty)."""
        while not self._done.is_set():
            now = clock.now()
            if self.keys.cluster:  # batch callbacks and stalled moves
                handoff.push_waiting(self.redis, now)
            heads = self.heads()
            due = [zset for zset, score in heads.items() if score <= now]
            if not due:
                return min(heads.values(), default=None)
            for zset in due:
                self._drain_set(zset, now)
        return None

    def seconds_to_sleep(self, earliest: float | None, upkeep_at: float) -> float:
        """Until the earliest due time known (read or announced; epoch seconds) or the
        upkeep (``clock.monotonic`` time, the cap), whichever comes first."""
        due = min((t for t in (earliest, self._announced) if t is not None), default=math.inf)
        return min(upkeep_at - clock.monotonic(), due - clock.now())

    def cleanup_processes(self) -> int:
        """Forget processes whose heartbeat hash expired; at most once a minute across
        the whole cluster (the lock key), because it reads every process."""
        lock = self.keys.PROCESS_CLEANUP_LOCK
        if not self.redis.set(lock, "1", nx=True, ex=CLEANUP_LOCK_SECONDS):
            return 0
        identities = list(self.redis.sscan_iter(self.keys.PROCESSES))
        pipe = self.redis.pipeline(transaction=False)
        for identity in identities:
            pipe.hget(identity, "info")
        infos = pipe.execute()
        gone = [ident for ident, info in zip(identities, infos, strict=True) if info is None]
        return int(self.redis.srem(self.keys.PROCESSES, *gone)) if gone else 0

    def random_poll_interval(self) -> float:
        """Random around the average, ±50% for small clusters, so restarts don't
        synchronise the pollers (a thundering herd)."""
        count = max(1, int(self.redis.scard(self.keys.PROCESSES)))
        interval = self.poll_interval_average or count * self.average_scheduled_poll_interval
        if count < 10:
            return interval * self.rng.random() + interval / 2
        return interval * self.rng.random()

    def _drain_set(self, zset: str, now: float) -> int:
        """Move the jobs of ``zset`` due at ``now``, a page (``PEEK`` jobs) per call: a
        burst of jobs due at the same second reaches the queues in a few calls, in due
        order. An unreadable member goes to the dead set (and counts as moved).

        On a standalone server each page is read and moved by one script in Redis
        (``move_due_page.lua``): the poller decodes and sends no job, and pollers of
        other processes draining the same burst each move other pages, none reading a
        page another moves. The few members the script leaves (those it cannot read for
        certain) are parsed here and moved one by one."""
        if self.keys.cluster:
            return self._drain_parsed(zset, now)
        moved = 0
        while not self._done.is_set():
            read, page_moved, left = move_due_page(self.redis, zset, now, PEEK)
            moved += page_moved + self._move_each(zset, left, now)
            if read < PEEK:
                break
        return moved

    def _move_each(self, zset: str, members: list[bytes], now: float) -> int:
        """Parse and move ``members`` one at a time (to the dead set when unreadable)."""
        moved = 0
        for member in members:
            try:
                payload = parse(member)
            except MalformedPayload as exc:
                moved += self._bury(zset, member, exc, now)
            else:
                moved += enqueue_member(self.redis, zset, member, payload, now)
        return moved

    def _drain_parsed(self, zset: str, now: float) -> int:
        """``_drain_set`` in a cluster, where each queue is on its own shard: each page
        is read here and each job handed off on its own (``limitd.handoff``).

        Pollers of other processes drain the same burst at the same moment. Reading the
        same first page each time, they decoded and handed off the same jobs, only one
        of them moving each. So once another poller took jobs of a page from under this
        one, each later call reads a page chosen at random among the first ``SPREAD``
        due: the burst moves in pages out of order, each page still in due order."""
        moved, offset, racing = 0, 0, False
        while not self._done.is_set():
            due = self._page(zset, now, offset)
            if not due and offset:  # past the end of the burst: back to its start
                offset = 0
                due = self._page(zset, now, 0)
            if not due:
                break
            page_moved = self._move_each(zset, due, now)
            moved += page_moved
            if len(due) < PEEK and not offset:
                break
            racing = racing or page_moved < len(due)
            offset = self.rng.randrange(SPREAD) * PEEK if racing else 0
        return moved

    def _page(self, zset: str, now: float, offset: int) -> list[bytes]:
        return cast("list[bytes]", self.redis.zrangebyscore(zset, "-inf", now, offset, PEEK))

    def _bury(self, zset: str, member: bytes, exc: MalformedPayload, now: float) -> bool:
        log.error("unreadable job in %s sent to the dead set: %s", zset, exc)
        entry = dead_entry_for_malformed(member, "", str(exc), now)
        buried = bury_member(self.redis, zset, member, entry, now)
        trim_dead(self.redis, now, DeadSetPolicy())
        return buried

    def _run(self) -> None:
        upkeep_at = clock.monotonic() + self._initial_wait()
        if self.mode == "interval":
            self._sleep(None, upkeep_at)
        while not self._done.is_set():
            earliest = self._safely(self._look)
            if clock.monotonic() >= upkeep_at:
                self._upkeep()
                upkeep_at = clock.monotonic() + (self._safely(self.random_poll_interval) or 0)
            self._sleep(earliest, upkeep_at)

    def _look(self) -> float | None:
        """Move what is due; the earliest due time left, when this mode knows it."""
        if self.mode == "due":
            return self.move_due()
        self.enqueue_due()
        return None

    def _upkeep(self) -> None:
        if not self._cleaned:
            self._cleaned = True
            self._safely(self.cleanup_processes)
        for feature in plugins.registered():
            if feature.housekeeping is not None:
                self._safely(functools.partial(self._housekeep, feature.name, feature.housekeeping))

    def _housekeep(self, name: str, housekeeping: Callable[[redis_py.Redis], object]) -> None:
        """One feature's upkeep. A Redis error goes up (the poller backs off); any other
        is the feature's bug: logged, and the poller and the other features go on."""
        try:
            housekeeping(self.redis)
        except redis_py.RedisError:
            raise
        except Exception:
            log.exception("housekeeping of the %s feature failed", name)

    def _initial_wait(self) -> float:
        """Give heartbeats time to register (they size the interval), plus jitter so
        processes started together do not poll together. An explicit average (small in
        tests) replaces the fixed part. In ``due`` mode only the upkeep waits."""
        if self.poll_interval_average:
            return self.rng.random() * self.poll_interval_average
        return INITIAL_WAIT + 5 * self.rng.random()

    def _sleep(self, earliest: float | None, upkeep_at: float) -> None:
        """Until :meth:`seconds_to_sleep` says it is time (an announcement may bring
        that forward) or the poller is terminated. What was announced is then forgotten:
        the look that follows reads it from Redis (the ZADD precedes its PUBLISH), and
        announcements heard during that look are kept for the next sleep."""
        with self._cond:
            while not self._done.is_set():
                seconds = self.seconds_to_sleep(earliest, upkeep_at)
                if seconds <= 0:
                    break
                self._cond.wait(seconds)
            self._announced = None

    def _wait(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(self._done.is_set, seconds)

    def _safely(self, action: Callable[[], T]) -> T | None:
        try:
            found = action()
        except redis_py.RedisError as exc:
            self._wait(self._backoff.failed(exc))
            return None
        self._backoff.succeeded()
        return found


def due_time(message: str) -> float:
    """The due time an announcement carries; "" or anything unreadable means now."""
    try:
        due = float(message)
    except ValueError:
        return -math.inf
    return due if math.isfinite(due) else -math.inf
