"""One processor: a thread that takes a job, runs it, finishes it, and starts over.

Lifecycle verbs as in Sidekiq: ``start``; ``terminate`` (finish the current job, take no
new one); ``kill`` (the job was already requeued by the capsule: raise
:class:`Shutdown` inside the thread so it abandons the job without retrying it). The
loop is ``_process_one``: take from the capsule's dispatch, run through the executor,
and finish on the dispatch (``limitd.fetch.Dispatch``), which settles the job in Redis.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable

import redis as redis_py

from limitd import clock
from limitd.connection.backoff import Backoff
from limitd.fetch import Dispatch
from limitd.fetch.basic import UnitOfWork
from limitd.payload import describe_job
from limitd.supervisor.executor import HANDED_OFF, JobExecutor, Shutdown

log = logging.getLogger("limitd.processor")

FETCH_ERROR_PAUSE = 1.0


class Processor:
    """One thread of a capsule (see the module docstring)."""

    def __init__(
        self,
        index: int,
        dispatch: Dispatch,
        executor: JobExecutor,
        on_exit: Callable[[Processor], None],
        *,
        capsule: str = "default",
        on_busy: Callable[[], None] | None = None,
    ) -> None:
        self.index = index
        self.dispatch = dispatch
        self.executor = executor
        self.on_exit = on_exit
        self.on_busy = on_busy or _nothing
        self.current: UnitOfWork | None = None
        self.current_since = 0.0
        self._done = threading.Event()
        self._backoff = Backoff(log, f"processor {index}'s fetch")
        self._thread = threading.Thread(
            target=self._run, name=f"limitd-{capsule}-processor-{index}", daemon=True
        )

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def start(self) -> None:
        self._thread.start()

    def terminate(self) -> None:
        self._done.set()

    def kill(self) -> None:
        """Interrupt the job with Shutdown. Python delivers it at the thread's next
        bytecode, so code blocked in C keeps running until it returns."""
        self._done.set()
        if self._thread.ident is not None and self._thread.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._thread.ident), ctypes.py_object(Shutdown)
            )

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                self._process_one()
        except Shutdown:
            log.info("processor %d shut down with its job requeued", self.index)
        except BaseException:
            log.critical("processor %d died", self.index, exc_info=True)
        finally:
            self.dispatch.leave()
            self.current = None
            self.on_exit(self)

    def _process_one(self) -> None:
        """Take -> run -> finish: the whole life of a job on this thread."""
        unit = self._take()
        if unit is None or not self._run_job(unit):
            return
        try:
            self.dispatch.finish(unit)
        except redis_py.RedisError as exc:
            if unit.give_back is None:
                raise
            # Putting it back in line is a round trip (an iterable job that stopped):
            # with Redis away, requeue it as after an internal error, waiting Redis out.
            self._requeue(unit, exc)

    def _take(self) -> UnitOfWork | None:
        """The next job, or None: none came, Redis failed (waited out here), or the
        capsule stopped while this thread waited (the job goes back: not ours to run)."""
        try:
            unit = self.dispatch.take()
        except redis_py.RedisError as exc:
            self._done.wait(self._backoff.failed(exc))
            return None
        self._backoff.succeeded()
        if unit is not None and self._done.is_set():
            self.dispatch.requeue(unit)
            return None
        return unit

    def _run_job(self, unit: UnitOfWork) -> bool:
        """Run the job; True when it ended here, False when the event loop took it (the
        loop finishes it) or its outcome could not be recorded (it was requeued)."""
        self.current_since = clock.now()
        self.current = unit
        self.on_busy()
        try:
            return self.executor.execute(unit) != HANDED_OFF
        except Shutdown:
            raise
        except Exception as exc:
            log.exception(
                "could not record the outcome of a job (%s queue=%s); requeueing it so it "
                "is not lost (after %d such recoveries it goes to the dead set)",
                describe_job(unit.job),
                unit.queue,
                self.executor.max_recoveries,
            )
            self._requeue(unit, exc)
            return False
        except BaseException as exc:
            self._requeue(unit, exc)
            raise  # the thread ends; the capsule starts a replacement
        finally:
            self.current = None
            self.on_busy()

    def held(self) -> list[UnitOfWork]:
        """The unit this thread holds in Redis: the one it runs (what it finished is
        the dispatch's)."""
        unit = self.current
        return [] if unit is None else [unit]

    def _requeue(self, unit: UnitOfWork, error: BaseException) -> None:
        """Requeue after an internal error, waiting out a Redis outage: running a job
        twice is better than losing it. The job's recoveries are counted, so one whose
        outcome can never be recorded ends in the dead set instead of looping."""
        reason = f"{type(error).__name__}: {error}"
        while True:
            try:
                self.dispatch.requeue(unit, reason=reason)
                return
            except redis_py.RedisError as exc:
                log.error("requeue failed, retrying in %.0fs: %s", FETCH_ERROR_PAUSE, exc)
                if self._done.wait(FETCH_ERROR_PAUSE):
                    log.critical(
                        "stopping with a job not requeued: queue=%s job=%r",
                        unit.queue,
                        unit.job[:500],
                    )
                    return


def _nothing() -> None:
    """The default busy-change listener."""
