"""One fetcher per capsule: it settles what the processors finished and fetches for
them, several jobs per Lua call when they are busy.

Why not let each processor thread fetch for itself, as Sidekiq's do? In CPython every
socket call releases and retakes the GIL, and with ten threads each making a round trip
per job a busy capsule spent its CPU handing the GIL around: strace counted 45 futex
calls per job, and the capsule drained faster with 4 threads than with 10. With one
dispatcher, idle processors sleep on a condition instead of contending, and a busy
capsule sends one call for many jobs.

Nothing is fetched ahead of need: the dispatcher asks for as many jobs as processors are
waiting, so a job counted busy under a limit is one about to run, as before, and other
capsules are not starved of it. Finished jobs are settled by the next call, which the
finishing processor triggers at once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence

import redis as redis_py

from limitd.fetch.basic import UnitOfWork
from limitd.fetch.limit import LimitFetch
from limitd.fetch.wakeup import IdleGate
from limitd.redis import OwnConnection

log = logging.getLogger("limitd.fetch")

ERROR_PAUSE = 1.0
CLOSED_POLL = 0.05


class _Waiter:
    """One processor's place in line: a lock held until a unit (or None, on quiet) is
    put in ``unit``. Made once per thread and reused: a handoff is one lock release."""

    __slots__ = ("lock", "timed_out", "unit")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.unit: UnitOfWork | None = None
        self.timed_out = False  # its last wait ended with nothing


class Dispatcher:
    """Serves a capsule's processors through the same ``retrieve_work(done)`` calls a
    fetch serves; start it with the capsule, ``close`` it on quiet, ``stop`` it last."""

    def __init__(self, fetch: LimitFetch, gate: IdleGate) -> None:
        self.fetch = fetch
        self.gate = gate
        self._conn = OwnConnection(fetch.redis)  # used by the dispatcher thread only
        self._mutex = threading.Lock()
        self._ready: deque[UnitOfWork] = deque()  # fetched, for the next processor
        self._finished: list[UnitOfWork] = []  # run, to settle with the next call
        self._idle: list[_Waiter] = []  # processors waiting, the latest last
        self._local = threading.local()
        # The dispatcher sleeps on the gate only after saying so here; until then a
        # processor with news (a job to settle, or a fresh wait) counts it instead of
        # waking it, and the dispatcher looks at the count before it sleeps.
        self._asleep = False
        self._news = 0
        self._closed = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-dispatcher", daemon=True)

    @property
    def block_seconds(self) -> float:
        return self.fetch.block_seconds

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Processors waiting for a job."""
        return len(self._idle)

    def retrieve_work(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Leave ``done`` to be settled and take a fetched job, waiting up to
        ``block_seconds`` for one; None if there was none or the capsule is quieting."""
        waiter = self._waiter()
        with self._mutex:
            if done is not None:
                self._finished.append(done)
            if self._closed:
                return None
            unit = self._ready.popleft() if self._ready else None
            if unit is None:
                self._idle.append(waiter)
            # A processor that waited in vain is no news: the dispatcher polls for it.
            wake = (done is not None or (unit is None and not waiter.timed_out)) and self._tell()
        if wake:
            self.gate.wake()
        return unit if unit is not None else self._wait(waiter)

    def _tell(self) -> bool:
        """Called under the mutex with news: True when the dispatcher sleeps and must be
        woken (by the caller, after letting go of the mutex)."""
        if self._asleep:
            self._asleep = False
            return True
        self._news += 1
        return False

    def _wait(self, waiter: _Waiter) -> UnitOfWork | None:
        if not waiter.lock.acquire(timeout=self.block_seconds):
            with self._mutex:
                if waiter in self._idle:  # nobody served it
                    self._idle.remove(waiter)
                    waiter.timed_out = True
                    return None
            waiter.lock.acquire()  # served just now: the release is on its way
        waiter.timed_out = False
        unit, waiter.unit = waiter.unit, None
        return unit

    def _waiter(self) -> _Waiter:
        waiter: _Waiter | None = getattr(self._local, "waiter", None)
        if waiter is None:
            waiter = self._local.waiter = _Waiter()
        return waiter

    def try_retrieve(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        return self.fetch.try_retrieve(done)

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None:
        self.fetch.bulk_requeue(units)

    def held(self) -> list[UnitOfWork]:
        """Units in Redis's in-progress lists that no processor holds: fetched and not
        yet taken, or finished and not yet settled."""
        with self._mutex:
            return [*self._ready, *self._finished]

    def close(self) -> None:
        """Quiet: fetch nothing more; processors waiting return None at once."""
        with self._mutex:
            self._closed = True
            self._serve()

    def stop(self, timeout: float = 2.0) -> None:
        """After the processors have stopped: settle what they finished, requeue what
        none of them took."""
        self.close()
        self._stopped.set()
        self.gate.close()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self._flush()
        self._conn.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._step()
            except Exception:
                log.exception("dispatcher failed; retrying in %.0fs", ERROR_PAUSE)
                self._stopped.wait(ERROR_PAUSE)

    def _step(self) -> None:
        """One call to Redis if there is anything to settle or anyone to serve, then a
        wait when there is nothing more to do right now."""
        with self._mutex:
            finished, self._finished = self._finished, []
            closed, self._news = self._closed, 0
            want = 0 if closed else len(self._idle) - len(self._ready)
        if finished or want > 0:
            try:
                units = self.fetch.settle_and_take(finished, want, self._conn)
            except redis_py.RedisError as exc:
                self._keep(finished)
                log.warning("fetch failed, retrying in %.0fs: %s", ERROR_PAUSE, exc)
                self._stopped.wait(ERROR_PAUSE)
                return
            self._hand_out(units)
            if want > 0 and len(units) == want:
                return  # there may be more: ask again at once
        if closed:
            self._stopped.wait(CLOSED_POLL)
            return
        with self._mutex:
            if self._news:
                return  # processors came with news during the call: serve them first
            self._asleep = True
        # A push, a finished job, an idle processor, the poll, or the moment a rate
        # limit lets a waiting job go (only worth waking for with someone to serve).
        self.gate.wait(at_most=self.fetch.room_in if want > 0 else None)
        with self._mutex:
            self._asleep = False

    def _hand_out(self, units: Sequence[UnitOfWork]) -> None:
        with self._mutex:
            if not self._closed:
                self._ready.extend(units)
                self._serve()
                return
        self.fetch.bulk_requeue(units)  # fetched while the capsule was quieting

    def _serve(self) -> None:
        """Under the mutex: give each waiting processor a fetched unit, the one that
        waited least first (its thread is the likeliest still in the CPU's caches); on
        quiet, give them None."""
        while self._idle and (self._ready or self._closed):
            waiter = self._idle.pop()
            waiter.unit = None if self._closed else self._ready.popleft()
            waiter.lock.release()

    def _keep(self, finished: list[UnitOfWork]) -> None:
        """Put back units whose settling failed, for the next attempt."""
        with self._mutex:
            self._finished[:0] = finished

    def _flush(self) -> None:
        with self._mutex:
            finished, self._finished = self._finished, []
            ready = list(self._ready)
            self._ready.clear()
        try:
            if finished:
                self.fetch.settle_and_take(finished, 0)
            if ready:
                self.fetch.bulk_requeue(ready)
        except redis_py.RedisError as exc:
            # Left in progress: the capsule's retirement (or a reaper) returns them.
            log.error(
                "could not settle %d / requeue %d jobs at stop: %s", len(finished), len(ready), exc
            )
