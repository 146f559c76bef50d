"""The push buffer: pushes kept in memory while Redis does not answer.

:class:`PushBuffer` is a push gate (``limitd.plugins.add_push_gate``). While it holds
nothing, it runs each push at once, middleware and write, and hands the client what the
push returned (``Push.ran``), so a push costs what it costs without the buffer. When that
push fails because Redis cannot be reached (a refused or cut connection, a timeout,
Redis still loading its data), the push is kept, jid already set, and the caller gets
its jid as if it had been written. From then on every push goes behind the kept ones
without trying Redis, so the jobs of one thread reach Redis in the order it pushed
them, and a background thread retries the oldest, with doubling pauses (jittered, so
that many web processes do not retry in step), until the buffer is empty.

A kept push runs again whole: its client middleware run when it is written, not when
it was kept (a unique lock is taken, a tenant counted, then). A push that fails at that
point for another reason than Redis being away (an error of a middleware) is logged with
its jids and dropped: its caller is gone. A push whose write reached Redis but whose
reply was lost (a timeout) is written again: reliable push is at least once.

The buffer is bounded in jobs (a bulk push counts each of its jobs): a push that does
not fit raises :class:`BufferFull`, a ``redis.ConnectionError`` whose cause is the error
Redis last gave, which is what the caller got before reliable push. A buffer is memory:
:meth:`PushBuffer.flush_before_exit` tries to empty it when the process exits, then logs
how many jobs, and which, are lost.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
from collections import deque
from dataclasses import dataclass

import redis as redis_py

from limitd import clock, plugins
from limitd.batch.building import building_bid
from limitd.connection import replication
from limitd.connection.backoff import Backoff

log = logging.getLogger("limitd.reliable_push")

UNREACHABLE: tuple[type[BaseException], ...] = (
    redis_py.exceptions.ConnectionError,
    redis_py.exceptions.TimeoutError,
)
"""Errors that say Redis could not be reached (``BusyLoadingError`` is one)."""

NOT_TRANSIENT: tuple[type[BaseException], ...] = (
    redis_py.exceptions.AuthenticationError,
    redis_py.exceptions.AuthorizationError,
)
"""Connection errors that waiting does not cure (a wrong password): raised at once."""

JIDS_PER_LOG_LINE = 100


class BufferFull(redis_py.exceptions.ConnectionError):
    """Redis does not answer and the push buffer has no room left for this push: the
    push was not made. A ``redis.ConnectionError``, so code that caught Redis being
    away before reliable push still catches it; its cause is the error Redis last gave."""


@dataclass(frozen=True)
class _Kept:
    push: plugins.Push
    context: contextvars.Context  # the caller's (a batch's jobs() block ...)

    @property
    def jobs(self) -> int:
        return len(self.push.payloads)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis could not be reached, for a while."""
    return isinstance(exc, UNREACHABLE) and not isinstance(exc, NOT_TRANSIENT)


class PushBuffer:
    """A bounded buffer of pushes Redis did not take, and the thread that writes them.

    ``max_buffered``: the most jobs kept at once; ``first_pause`` and ``max_pause``: the
    pauses between retries, doubling from the first to the cap (each jittered down by
    up to half). Counts for the metrics: ``buffered_jobs`` (kept now),
    ``buffered_total`` (jobs ever kept), ``dropped_total`` (kept jobs that failed for
    another reason when written)."""

    def __init__(
        self, max_buffered: int = 10_000, *, first_pause: float = 0.1, max_pause: float = 5.0
    ) -> None:
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be at least 1, not {max_buffered!r}")
        self.max_buffered = max_buffered
        self.first_pause = first_pause
        self.max_pause = max_pause
        self.buffered_jobs = 0
        self.buffered_total = 0
        self.dropped_total = 0
        self.last_error: BaseException | None = None
        self._kept: deque[_Kept] = deque()
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None

    def __call__(self, push: plugins.Push) -> bool:
        """The push gate: takes the push (True), runs it now unless pushes are kept, and
        keeps it if Redis cannot be reached. Not a push inside a batch's ``jobs()``
        block (False: the client runs it as without the buffer): the batch is opened and
        closed in Redis by that block, and must not close before its jobs are in."""
        if building_bid() is not None:
            return False
        with self._changed:
            if self._kept:
                self._keep(push, None)
                return True
        try:
            result = push.run()
        except BaseException as exc:
            if not unreachable(exc):
                raise
            with self._changed:
                self._keep(push, exc)
            return True
        push.ran.append(result)
        return True

    def _keep(self, push: plugins.Push, error: BaseException | None) -> None:
        """Keep ``push`` behind the others (under the lock), or raise ``BufferFull``."""
        push.validate()  # a bad argument fails at the caller, not in the flusher
        if error is not None:
            self.last_error = error
        if self.buffered_jobs + len(push.payloads) > self.max_buffered:
            raise BufferFull(
                f"Redis cannot be reached and the reliable push buffer is full "
                f"({self.buffered_jobs} of {self.max_buffered} jobs): not pushed: "
                f"{push.what()}; last error: {self.last_error!r}"
            ) from (error or self.last_error)
        if not self._kept:
            log.warning(
                "Redis cannot be reached (%r): keeping pushes in memory (up to %d jobs) "
                "and retrying in the background",
                self.last_error,
                self.max_buffered,
            )
        self._kept.append(_Kept(push, contextvars.copy_context()))
        self.buffered_jobs += len(push.payloads)
        self.buffered_total += len(push.payloads)
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush, name="limitd-reliable-push", daemon=True
            )
            self._flusher.start()

    def _flush(self) -> None:
        """The background thread: write the oldest kept push until none is left; while
        Redis cannot be reached, pause (doubling) between tries."""
        backoff = Backoff(log, "pushing the kept jobs", first=self.first_pause, cap=self.max_pause)
        flushed = 0
        while True:
            with self._changed:
                if not self._kept:
                    self._flusher = None
                    return
                head = self._kept[0]
            try:
                head.context.run(head.push.run)
            except replication.NotReplicated:
                log.warning("kept push written, not replicated in time: %s", head.push.what())
            except BaseException as exc:
                if unreachable(exc):
                    self.last_error = exc
                    pause = backoff.failed(exc) * random.uniform(0.5, 1.0)
                    self._wake.wait(pause)
                    self._wake.clear()
                    continue
                log.exception("kept push failed when written, dropped: %s", head.push.what())
                with self._changed:
                    self.dropped_total += head.jobs
            backoff.succeeded()
            flushed += head.jobs
            with self._changed:
                if not self._kept or self._kept[0] is not head:
                    continue  # discarded meanwhile
                self._kept.popleft()
                self.buffered_jobs -= head.jobs
                if not self._kept:
                    log.warning("Redis answers again: wrote the %d kept jobs", flushed)
                    flushed = 0
                    self._changed.notify_all()

    def discard(self) -> int:
        """Drop what is kept (logged, with the jids) and let the background thread end:
        for tests, and for code that gives up on Redis. Returns how many jobs."""
        with self._changed:
            jids = [str(p.get("jid")) for kept in self._kept for p in kept.push.payloads]
            self._kept.clear()
            self.buffered_jobs = 0
            self._changed.notify_all()
        self._wake.set()
        if jids:
            log.warning("discarded %d kept jobs, not pushed", len(jids))
            log_jids(logging.WARNING, "discarded", jids)
        return len(jids)

    def jids(self) -> list[str]:
        """The jids of the jobs kept now, oldest first."""
        with self._changed:
            return [str(p.get("jid")) for kept in self._kept for p in kept.push.payloads]

    def wait_flushed(self, timeout: float) -> bool:
        """Retry at once, then wait up to ``timeout`` seconds for the buffer to empty;
        whether it did."""
        self._wake.set()
        deadline = clock.monotonic() + timeout
        with self._changed:
            while self._kept:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def flush_before_exit(self, timeout: float) -> int:
        """The process is exiting: try to write what is kept for ``timeout`` seconds,
        then log, as an error, how many jobs are lost and their jids. Returns how many."""
        if not self._kept or self.wait_flushed(timeout):
            return 0
        jids = self.jids()
        log.error(
            "process exiting with %d jobs kept in memory and not pushed (Redis cannot be "
            "reached: %r): they are lost; use the transactional outbox for pushes that "
            "must survive the process",
            len(jids),
            self.last_error,
        )
        log_jids(logging.ERROR, "lost", jids)
        return len(jids)


def log_jids(level: int, what: str, jids: list[str]) -> None:
    """Log every one of ``jids``, a bounded number to a line."""
    for start in range(0, len(jids), JIDS_PER_LOG_LINE):
        log.log(level, "%s jids: %s", what, ",".join(jids[start : start + JIDS_PER_LOG_LINE]))
