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


class Dispatcher:
    """Serves a capsule's processors through the same ``retrieve_work(done)`` calls a
    fetch serves; start it with the capsule, ``close`` it on quiet, ``stop`` it last."""

    def __init__(self, fetch: LimitFetch, gate: IdleGate) -> None:
        self.fetch = fetch
        self.gate = gate
        self._conn = OwnConnection(fetch.redis)  # used by the dispatcher thread only
        self._cond = threading.Condition()
        self._ready: deque[UnitOfWork] = deque()  # fetched, for the next idle processor
        self._finished: list[UnitOfWork] = []  # run, to settle with the next call
        self._waiting = 0  # processors waiting for a job
        self._local = threading.local()  # per processor: did its last wait time out?
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
        return self._waiting

    def retrieve_work(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        """Leave ``done`` to be settled and take a fetched job, waiting up to
        ``block_seconds`` for one; None if there was none or the capsule is quieting."""
        with self._cond:
            if done is not None:
                self._finished.append(done)
            if not self._ready and not self._closed:
                self._waiting += 1
                if done is not None or not getattr(self._local, "idle", False):
                    # One more processor to serve (and maybe a job to settle). One that
                    # waited in vain is no news: the dispatcher polls for it already.
                    self.gate.wake()
                try:
                    got = self._cond.wait_for(
                        lambda: self._ready or self._closed, self.block_seconds
                    )
                finally:
                    self._waiting -= 1
                self._local.idle = not got
            elif done is not None:
                self.gate.wake()
            if self._closed or not self._ready:
                return None
            return self._ready.popleft()

    def try_retrieve(self, done: UnitOfWork | None = None) -> UnitOfWork | None:
        return self.fetch.try_retrieve(done)

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None:
        self.fetch.bulk_requeue(units)

    def held(self) -> list[UnitOfWork]:
        """Units in Redis's in-progress lists that no processor holds: fetched and not
        yet taken, or finished and not yet settled."""
        with self._cond:
            return [*self._ready, *self._finished]

    def close(self) -> None:
        """Quiet: fetch nothing more; processors waiting return None at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

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
        with self._cond:
            finished, self._finished = self._finished, []
            closed = self._closed
            want = 0 if closed else self._waiting - len(self._ready)
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
        else:
            # A push, a finished job, an idle processor, the poll, or the moment a rate
            # limit lets a waiting job go (only worth waking for with someone to serve).
            self.gate.wait(at_most=self.fetch.room_in if want > 0 else None)

    def _hand_out(self, units: Sequence[UnitOfWork]) -> None:
        with self._cond:
            if not self._closed:
                self._ready.extend(units)
                self._cond.notify(len(units))
                return
        self.fetch.bulk_requeue(units)  # fetched while the capsule was quieting

    def _keep(self, finished: list[UnitOfWork]) -> None:
        """Put back units whose settling failed, for the next attempt."""
        with self._cond:
            self._finished[:0] = finished

    def _flush(self) -> None:
        with self._cond:
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
