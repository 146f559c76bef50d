"""One thread per capsule process that keeps the deadlines of the sync jobs running.

A job's processor thread registers itself (its ``threading.get_ident()``) with its
deadline before the job runs and unregisters when it returns. At the deadline the
watchdog raises ``TimeLimitExceeded`` in that thread with
``PyThreadState_SetAsyncExc``. Python delivers such an exception at the thread's next
bytecode: a job looping in Python stops at once, but one blocked in C code
(``time.sleep``, a socket read without timeout, a C extension's loop) goes on until the
call returns. So the watchdog looks again:

- ``WARN_AFTER`` seconds (or half the grace, if shorter) past the deadline, a job still
  registered is logged as a warning: it is blocked in C code, or it caught the error;
- ``grace`` seconds past the deadline, it is still there: the watchdog marks the job in
  Redis as having exceeded its limit and stops its own process gracefully (SIGTERM to
  itself, as the supervisor recycles a process over ``max_memory_mb``). The other jobs of
  the process finish or are requeued by that stop, the stuck one is requeued with them;
  when it comes back, the mark makes it fail with ``TimeLimitExceeded`` without running
  (``TimeLimits.__call__``), so it follows its retry policy rather than running again.

The race between a deadline and the job's end: firing and unregistering take the same
lock, and an unregistering thread whose exception was set clears it if it is still
pending (``SetAsyncExc(tid, NULL)``). A delivery before that happens inside the
middleware's call, so the job fails with it: it never reaches the processor loop.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from limitd import clock

log = logging.getLogger("limitd.time_limits")

WARN_AFTER = 1.0  # seconds past a deadline before a job still running is warned about


@dataclass(eq=False)
class Running:
    """A sync job under a limit, as its thread registered it."""

    thread_id: int
    limit: float
    deadline: float  # clock.monotonic()
    jid: str
    job_class: str
    active: bool = True
    fired: bool = False  # TimeLimitExceeded was set in its thread
    marked: bool = False  # marked in Redis to fail unrun when it comes back


@dataclass(order=True)
class _Check:
    at: float
    seq: int
    stage: str = field(compare=False)  # "fire", "warn" or "recycle"
    running: Running = field(compare=False)


def set_async_exc(thread_id: int, error: type[BaseException] | None) -> int:
    """Raise ``error`` in the thread at its next bytecode (None: clear a pending one)."""
    exc = ctypes.py_object(error) if error is not None else None
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc))


class Watchdog:
    """The deadlines of the running jobs, in a heap, and the thread that enforces them
    (started at the first registration: a process whose jobs have no limit has none)."""

    def __init__(
        self,
        error: type[BaseException],
        grace: float,
        on_stuck: Callable[[Running], None],
        recycle: Callable[[], None] | None = None,
    ) -> None:
        self.error = error
        self.grace = grace
        self.on_stuck = on_stuck  # marks the job before the process is recycled
        self.recycle = recycle or _stop_this_process
        self.recycling = False
        self._heap: list[_Check] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopped = False
        self._thread: threading.Thread | None = None

    def register(self, running: Running) -> None:
        """Watch ``running`` (made by :meth:`running` in its thread). Its caller is ready
        for the exception from here on: inside its ``try``, before its ``finally`` that
        unregisters."""
        with self._lock:
            self._push(running.deadline, "fire", running)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="limitd-time-limits", daemon=True
                )
                self._thread.start()

    @staticmethod
    def running(limit: float, jid: str, job_class: str) -> Running:
        """The calling thread's job, which may run ``limit`` seconds from now."""
        now = clock.monotonic()
        return Running(threading.get_ident(), limit, now + limit, jid, job_class)

    def unregister(self, running: Running) -> None:
        """The job returned or raised: no exception may reach its thread any more."""
        with self._lock:
            running.active = False
            if running.fired:
                set_async_exc(running.thread_id, None)  # undelivered yet: never will be

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(2.0)

    def _push(self, at: float, stage: str, running: Running) -> None:
        heapq.heappush(self._heap, _Check(at, next(self._seq), stage, running))
        self._wake.notify()

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException:  # limits would silently stop applying: say so loudly
            log.critical("the time-limit watchdog died: limits no longer apply", exc_info=True)
            raise

    def _watch(self) -> None:
        while True:
            with self._lock:
                while not self._stopped:
                    now = clock.monotonic()
                    if self._heap and self._heap[0].at <= now:
                        break
                    wait = self._heap[0].at - now if self._heap else None
                    self._wake.wait(wait)
                if self._stopped:
                    return
                check = heapq.heappop(self._heap)
                if not check.running.active:
                    continue
                stuck = self._act(check)
            if stuck is not None:
                self._recycle(stuck)

    def _act(self, check: _Check) -> Running | None:
        """Under the lock: the step due for a job still running; the job if it is
        stuck past its grace (recycled outside the lock)."""
        running = check.running
        if check.stage == "fire":
            running.fired = True
            set_async_exc(running.thread_id, self.error)
            log.info(
                "time limit of %gs reached jid=%s class=%s: TimeLimitExceeded raised in its thread",
                running.limit,
                running.jid,
                running.job_class,
            )
            self._push(running.deadline + min(WARN_AFTER, self.grace / 2), "warn", running)
            return None
        if check.stage == "warn":
            log.warning(
                "jid=%s class=%s still runs past its time limit of %gs: blocked in C code "
                "(which TimeLimitExceeded cannot interrupt) or it caught the error; this "
                "process is recycled if it still runs %gs past the limit",
                running.jid,
                running.job_class,
                running.limit,
                self.grace,
            )
            self._push(running.deadline + self.grace, "recycle", running)
            return None
        return running

    def _recycle(self, running: Running) -> None:
        """Mark the job, and every other one past its limit (the stop requeues them all),
        then stop the process, once."""
        with self._lock:  # held across the marks: a job ending now unmarks after them
            over = {c.running for c in self._heap if c.running.active and c.running.fired}
            for job in [running, *(over - {running})]:
                if job.active and not job.marked:
                    job.marked = True
                    try:
                        self.on_stuck(job)
                    except Exception:
                        log.exception("could not mark jid=%s as over its time limit", job.jid)
        if self.recycling:
            return
        log.error(
            "jid=%s class=%s still runs %gs past its time limit of %gs: recycling this "
            "process; the job fails with TimeLimitExceeded when it comes back",
            running.jid,
            running.job_class,
            self.grace,
            running.limit,
        )
        self.recycling = True
        self.recycle()


def _stop_this_process() -> None:
    """A graceful stop, as the supervisor asks one (it starts a new process)."""
    os.kill(os.getpid(), signal.SIGTERM)
