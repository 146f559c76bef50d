"""One fetch call at a time per capsule: it settles what the processors finished and
fetches for every processor waiting, several jobs per Lua call when they are busy.

The path of a job's end: whoever ran it calls :meth:`Dispatcher.finish`. On a processor
thread the unit waits in that thread's place in line (``_Waiter.done``) and rides its
very next ``take``, which either makes the call (settling it in the same round trip as
the fetch) or leaves it in ``_finished`` for the call in flight's successor. Anywhere
else (the event loop, a drain) it goes to ``_finished`` at once, waking the dispatcher
thread if it sleeps: the next call settles it.

Why not let each processor thread fetch for itself, as Sidekiq's do? In CPython every
socket call releases and retakes the GIL, and with ten threads each making a round trip
per job a busy capsule spent its CPU handing the GIL around (strace: 45 futex calls per
job), and each Lua call costs Redis several times a plain command. One call for all the
waiting processors keeps both down.

Who makes the call: under load, the processor that finished a job and found nobody
calling. It already holds the GIL and needs a job itself, so the call costs no thread
hop: py-spy showed a separate fetcher thread, queueing for the GIL behind ten busy
processors after each socket call, kept them waiting for jobs 65% of the time.
Processors that finish while a call is in flight wait; the caller serves them from its
reply if it asked for them, and hands the next call to one of those it could not serve.
When the capsule is idle, its dispatcher thread makes the calls: it sleeps until a push
is announced, a processor arrives, the poll interval passes, or a rate limit lets a
waiting job go.

Nothing is fetched ahead of need: a call asks for as many jobs as processors are
waiting, so a job counted busy under a limit is one about to run, and other capsules are
not starved of it. The exception is a capsule running async jobs: while its event loop
has room, a call also asks for ``extra`` jobs (see ``limitd.supervisor.async_lane``).
Whoever made the call offers what it fetched to the loop first (``spill``), which takes
the async jobs it has room for in one batch; the rest wait in the ready list for
processors. (Passing each async job on through a processor cost a thread hand-off per
job: at 1,000 jobs in flight the processors used 27 us of CPU per job to do it.)
Finished jobs are settled by the next call.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import redis as redis_py

from limitd.connection import OwnConnection, own_connection
from limitd.connection.backoff import Backoff
from limitd.fetch import keep_all, never, no_extra
from limitd.fetch.basic import UnitOfWork, give_back
from limitd.fetch.limit import LimitFetch
from limitd.fetch.wakeup import IdleGate

# Give up the GIL and the CPU. ``time.sleep(0)`` gives up only the GIL: on a capsule kept
# on one CPU (``cpu_affinity``) the successor cannot run until this thread blocks, so it
# takes the GIL straight back; ``sched_yield`` lets the successor run there and then
# (1 x 10 on one CPU, 3 rounds alternated: 1.20x the drain, 0.88x the worker CPU per job).
yield_cpu: Callable[[], None] = getattr(os, "sched_yield", None) or functools.partial(time.sleep, 0)

log = logging.getLogger("limitd.fetch")

ERROR_PAUSE = 1.0
CLOSED_POLL = 0.05


class _Waiter:
    """One processor's place in line: a lock held until it is given a job in ``unit``,
    None (on quiet), or the next call to make (``lead``); and the job it finished last
    (``done``), which its next take brings along. Made once per thread and reused: a
    handoff is one lock release."""

    __slots__ = ("done", "lead", "lock", "timed_out", "unit")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.unit: UnitOfWork | None = None
        self.done: UnitOfWork | None = None
        self.timed_out = False  # its last wait ended with nothing
        self.lead = False


class Dispatcher:
    """The limit fetch's ``Dispatch`` (see ``limitd.fetch``): start it with the capsule,
    ``close`` it on quiet, ``stop`` it last."""

    def __init__(self, fetch: LimitFetch, gate: IdleGate) -> None:
        self.fetch = fetch
        self.gate = gate
        self._conn = own_connection(fetch.redis)  # used by whoever holds _calling
        self._mutex = threading.Lock()
        self._ready: deque[UnitOfWork] = deque()  # fetched, for the next processor
        self._finished: list[UnitOfWork] = []  # run, to settle with the next call
        self._idle: list[_Waiter] = []  # processors waiting, the latest last
        self._waiters: list[_Waiter] = []  # one per processor thread that ever took
        self._local = threading.local()
        self._calling = False  # a call is in flight (it owns _conn)
        # The dispatcher thread sleeps on the gate only after saying so here; until
        # then news (a job to settle, a fresh wait) is counted instead of waking it,
        # and it looks at the count before it sleeps.
        self._asleep = False
        self._news = 0
        self._closed = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-dispatcher", daemon=True)
        # Jobs to fetch per call beyond the waiting processors' (the capsule's event loop
        # has room: processors hand it async jobs in microseconds, so fetching one per
        # processor per call would make the call the cost of every async job).
        self.extra: Callable[[], int] = no_extra
        # Offered every call's jobs first (see the module docstring): returns the rest.
        self.spill: Callable[[list[UnitOfWork]], list[UnitOfWork]] = keep_all
        # True while the loop takes every job fetched lately: then a call fetches what
        # the loop has room for, and nothing for idle processors, which would only wait
        # for a slot with it (see ``limitd.supervisor.async_lane``).
        self.loop_only: Callable[[], bool] = never
        self._backoff = Backoff(log, "fetch")

    @property
    def block_seconds(self) -> float:
        return self.fetch.block_seconds

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Processors waiting for a job."""
        return len(self._idle)

    def take(self) -> UnitOfWork | None:
        """Bring the job this thread finished (see ``finish``) and take a job, making the
        call if nobody is, else waiting up to ``block_seconds`` to be served; None if
        there was none or the capsule is quieting."""
        waiter = self._waiter()
        done, waiter.done = waiter.done, None
        # A processor that waited in vain is no news: the dispatcher thread polls for it.
        news = done is not None or not waiter.timed_out
        lead, unit, wake = False, None, False
        with self._mutex:
            if done is not None:
                self._finished.append(done)
            if self._closed:
                return None
            if self._ready:
                unit = self._ready.popleft()
                wake = done is not None and self._tell()
            elif news and not self._calling:
                self._calling = lead = True
            else:
                self._idle.append(waiter)
                wake = news and self._tell()
        if wake:
            self.gate.wake()
        if lead:
            return self._lead(waiter)
        return unit if unit is not None else self._wait(waiter)

    def finish(self, unit: UnitOfWork) -> None:
        """A job ended (whatever its outcome): settle it with the next call. A processor
        thread keeps it for its own next take, which follows at once (it would be woken
        for nothing otherwise); from anywhere else it waits for the next call, which
        under load some processor makes anyway, and the dispatcher thread is woken. A
        job that asks to be put back in line (``unit.give_back``) goes back now."""
        if unit.give_back is not None:
            give_back(self.fetch, unit)
            return
        waiter: _Waiter | None = getattr(self._local, "waiter", None)
        if waiter is not None and waiter.done is None:
            waiter.done = unit
            return
        with self._mutex:
            self._finished.append(unit)
            wake = self._tell()
        if wake:
            self.gate.wake()

    def leave(self) -> None:
        """A processor thread ends: the job it finished waits for the next call."""
        waiter: _Waiter | None = getattr(self._local, "waiter", None)
        if waiter is not None and waiter.done is not None:
            done, waiter.done = waiter.done, None
            self.finish(done)

    def take_now(self) -> UnitOfWork | None:
        """For a drain, in the calling thread, with the capsule not started: settle what
        was finished and take a job if one is there, in one call. No wake-ups are heard
        here: every queue is looked at."""
        self.fetch.woken("")
        with self._mutex:
            finished, self._finished = self._finished, []
        units = self.fetch.take(1, finished)
        return units[0] if units else None

    def _tell(self) -> bool:
        """Under the mutex, with news: True when the dispatcher thread sleeps and must
        be woken (by the caller, once out of the mutex). A call in flight will see it."""
        if self._asleep and not self._calling:
            self._asleep = False
            return True
        self._news += 1
        return False

    def _lead(self, waiter: _Waiter) -> UnitOfWork | None:
        """Make the call (``_calling`` is ours) for this processor and every one waiting;
        keep the first job and serve the others; wait like them if there was none."""
        with self._mutex:
            self._news = 0
            finished, self._finished = self._finished, []
            want = self._want(1 + len(self._idle) - len(self._ready))
        units: Sequence[UnitOfWork] = []
        fetched = 0
        crashed = True  # until the call returns or fails as Redis calls may
        try:
            if want or finished:  # (the loop alone may have no room: nothing to ask)
                units = self.fetch.take(want, finished, conn=self._conn)
            finished, crashed, fetched = [], False, len(units)
            units = self._spilled(units)
        except redis_py.RedisError as exc:
            crashed = False
            log.warning("fetch failed, the dispatcher retries: %s", exc)
        finally:
            with self._mutex:
                mine, unwanted, handed = self._after_call(finished, units, want, fetched)
                if mine is None and not unwanted and not self._closed and not crashed:
                    self._idle.append(waiter)
        if handed:
            # The successor needs the GIL to write its call; without a yield it waits for
            # this thread's next socket call, and its round trip starts that much later
            # (measured at 2 x 10: 1.16x the drain, faster in each of six rounds).
            yield_cpu()
        if unwanted:
            self.fetch.requeue(unwanted)  # fetched while the capsule was quieting
            return None
        if mine is None and not self._closed:
            return self._wait(waiter)
        return mine

    def _after_call(
        self, unsettled: list[UnitOfWork], units: Sequence[UnitOfWork], want: int, fetched: int
    ) -> tuple[UnitOfWork | None, list[UnitOfWork], bool]:
        """Under the mutex, after a processor's call that fetched ``fetched`` jobs, of
        which ``units`` are left for the processors: the caller's own job (if any), the
        jobs to requeue because the capsule quieted meanwhile, and whether the next call
        was passed to a waiting processor."""
        unwanted = self._call_done(unsettled, units)
        if self._closed:
            return None, unwanted, False
        mine = self._ready.popleft() if self._ready else None
        self._serve()
        loop_only = self.loop_only()
        if fetched == want and self._idle and not loop_only:
            # More came during the call: the latest of them makes the next one. (Not
            # while the loop takes every job: a processor would lead call after call
            # without a job of its own; the dispatcher thread makes them.)
            successor = self._idle.pop()
            successor.lead, self._calling = True, True
            successor.lock.release()
            return mine, [], True
        if fetched < want or self._finished or loop_only:
            # No more jobs for now, or the call failed: the dispatcher thread polls,
            # waits for wake-ups, and settles what is left.
            if self._asleep:
                self._asleep = False
                self.gate.wake()
            else:
                self._news += 1
        return mine, [], False

    def _wait(self, waiter: _Waiter) -> UnitOfWork | None:
        if not waiter.lock.acquire(timeout=self.block_seconds):
            with self._mutex:
                if waiter in self._idle:  # nobody served it
                    self._idle.remove(waiter)
                    waiter.timed_out = True
                    return None
            waiter.lock.acquire()  # served just now: the release is on its way
        waiter.timed_out = False
        if waiter.lead:
            waiter.lead = False
            return self._lead(waiter)
        unit, waiter.unit = waiter.unit, None
        return unit

    def _waiter(self) -> _Waiter:
        waiter: _Waiter | None = getattr(self._local, "waiter", None)
        if waiter is None:
            waiter = self._local.waiter = _Waiter()
            with self._mutex:
                self._waiters.append(waiter)
        return waiter

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        return self.fetch.requeue(units, reason=reason, back=back)

    def held(self) -> list[UnitOfWork]:
        """Units in Redis's in-progress lists that no processor holds: fetched and not
        yet taken, or finished and not yet settled."""
        with self._mutex:
            return [*self._ready, *self._finished, *self._kept()]

    def _kept(self) -> list[UnitOfWork]:
        """Under the mutex: the jobs processor threads finished and keep for their next
        take (``_Waiter.done``)."""
        return [waiter.done for waiter in self._waiters if waiter.done is not None]

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
        if isinstance(self._conn, OwnConnection):  # not a shared cluster client
            self._conn.close()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._step()
            except Exception:
                log.exception("dispatcher failed; retrying in %.0fs", ERROR_PAUSE)
                self._stopped.wait(ERROR_PAUSE)

    def _step(self) -> None:
        """One call to Redis if there is anything to settle or anyone to serve and no
        processor is calling, then a wait when there is nothing more to do right now."""
        with self._mutex:
            # While a processor's call is in flight, it says if anything is left.
            finished, want, closed, calling = [], 0, self._closed, False
            if not self._calling:
                finished, self._finished = self._finished, []
                self._news = 0
                want = 0 if closed else self._want(len(self._idle) - len(self._ready))
                calling = self._calling = bool(finished) or want > 0
        if calling:
            try:
                units = self.fetch.take(want, finished, conn=self._conn)
            except redis_py.RedisError as exc:
                # What was finished is settled by the next call; nothing held is lost.
                self._hand_out([], unsettled=finished)
                self._stopped.wait(self._backoff.failed(exc))
                return
            self._backoff.succeeded()
            self._hand_out(self._spilled(units))
            if want > 0 and len(units) == want:
                return  # there may be more: ask again at once
        if closed:
            self._stopped.wait(CLOSED_POLL)
            return
        with self._mutex:
            if self._news and not self._calling:
                return  # processors came with news during the call: serve them first
            self._asleep = True
        # A push, a finished job, an idle processor, the end of a processor's call that
        # left work, the poll, or the moment a rate limit lets a waiting job go (only
        # worth waking for with someone to serve).
        self.gate.wait(at_most=self.fetch.room_in if want > 0 else None)
        with self._mutex:
            self._asleep = False

    def _hand_out(self, units: Sequence[UnitOfWork], unsettled: Sequence[UnitOfWork] = ()) -> None:
        """After the dispatcher's own call: serve the waiting processors, and keep what
        could not be settled for the next call."""
        with self._mutex:
            unwanted = self._call_done(unsettled, units)
            self._serve()
        if unwanted:
            self.fetch.requeue(unwanted)  # fetched while the capsule was quieting

    def _want(self, waiting: int) -> int:
        """Under the mutex: the jobs for a call, one per processor ``waiting`` for one
        and what the event loop has room for (``extra``); the loop's room alone while it
        takes every job fetched (``loop_only``)."""
        if self.loop_only():
            return self.extra()
        return waiting + self.extra() if waiting > 0 else 0

    def _spilled(self, units: Sequence[UnitOfWork]) -> Sequence[UnitOfWork]:
        """Outside the mutex, after a call: what ``spill`` left of its jobs."""
        if not units or self.spill is keep_all or self._closed:
            return units
        return self.spill(list(units))

    def _call_done(
        self, unsettled: Sequence[UnitOfWork], units: Sequence[UnitOfWork]
    ) -> list[UnitOfWork]:
        """Under the mutex, after any call: nobody is calling any more, what it could not
        settle waits for the next call, and its jobs wait for processors; returns them
        instead if the capsule quieted meanwhile (to requeue, outside the mutex)."""
        self._calling = False
        self._finished[:0] = unsettled
        if self._closed:
            return list(units)
        self._ready.extend(units)
        return []

    def _serve(self) -> None:
        """Under the mutex: give each waiting processor a fetched unit, the one that
        waited least first (its thread is the likeliest still in the CPU's caches); on
        quiet, give them None."""
        while self._idle and (self._ready or self._closed):
            waiter = self._idle.pop()
            waiter.unit = None if self._closed else self._ready.popleft()
            waiter.lock.release()

    def _flush(self) -> None:
        with self._mutex:
            kept = self._kept()
            for waiter in self._waiters:
                waiter.done = None
            finished, self._finished = [*self._finished, *kept], []
            ready = list(self._ready)
            self._ready.clear()
        try:
            if finished:
                self.fetch.settle(finished)
            if ready:
                self.fetch.requeue(ready)
        except redis_py.RedisError as exc:
            # Left in progress: the capsule's retirement (or a reaper) returns them.
            log.error(
                "could not settle %d / requeue %d jobs at stop: %s", len(finished), len(ready), exc
            )
