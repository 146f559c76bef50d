"""Redis refusing writes, told once and then at most once a minute, and counted.

A Redis at ``maxmemory`` with the ``noeviction`` policy answers ``OOM`` to every command
that may grow memory (SET, SADD, HSET, INCRBY, a script's writes), a replica answers
``READONLY``, and a Redis whose last save failed answers ``MISCONF``. The capsule keeps
running through it (its liveness is kept by commands Redis still allows: see
``liveness.vouch``), but every beat, record refresh and counter flush fails: a log line
for each would bury the log, and the operator must still see it. So the process keeps
one :class:`WriteRefusals`: it logs the first refusal, then at most one line a minute
with the count, and one line when Redis accepts writes again; the per-process metrics
(``limitd.metrics.process``) serve its count and state.
"""

from __future__ import annotations

import logging
import threading

import redis as redis_py

from limitd import clock

log = logging.getLogger("limitd.redis")

LOG_PERIOD = 60.0


def is_refusal(exc: BaseException) -> bool:
    """Whether Redis refused a write it understood (it is up, but will not store)."""
    if isinstance(exc, (redis_py.exceptions.OutOfMemoryError, redis_py.exceptions.ReadOnlyError)):
        return True
    return isinstance(exc, redis_py.ResponseError) and "MISCONF" in str(exc)[:40]


class WriteRefusals:
    """What this process saw of Redis refusing its writes: ``total`` refusals since it
    started, ``refusing`` while the last write was refused."""

    def __init__(self, log_period: float = LOG_PERIOD) -> None:
        self.log_period = log_period
        self.total = 0
        self.refusing = False
        self._lock = threading.Lock()
        self._since_logged = 0
        self._logged_at: float | None = None
        self._told = False  # a refusal was logged, its end not yet

    def note(self, exc: BaseException, what: str) -> bool:
        """Count ``exc`` if it is a refusal (``what``: the write refused), logging as the
        module says. Returns whether it was one: other errors are the caller's to tell."""
        if not is_refusal(exc):
            return False
        now = clock.monotonic()
        with self._lock:
            self.total += 1
            self.refusing = True
            self._since_logged += 1
            if self._logged_at is not None and now - self._logged_at < self.log_period:
                return True
            count, self._since_logged, self._logged_at = self._since_logged, 0, now
            self._told = True
        log.error(
            "Redis refuses writes (%s, %d refused since the last report; last: %s): "
            "liveness is kept, job counters and the process record wait",
            exc,
            count,
            what,
        )
        return True

    def accepted(self) -> None:
        """A write went through: if Redis was refusing, say that it is over (once per
        refusal logged, so flapping still logs at most two lines a minute)."""
        if not self.refusing:
            return
        with self._lock:
            self.refusing = False
            told, self._told = self._told, False
            unreported = self._since_logged
        if told:
            log.warning("Redis accepts writes again (%d more refused before)", unreported)


# One per process: the capsule's threads report into it, the process metrics read it.
REFUSALS = WriteRefusals()
