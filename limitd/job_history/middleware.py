"""The server middleware that feeds the job history: it times each job and, once the
job's fate is recorded, adds it to the process's :class:`~limitd.job_history.store.Tally`
under the minute it ended in. No Redis work here: the service in
``limitd.job_history.process`` writes the tally every few seconds.

What counts: a job that ran is ``processed``; one that raised (retried, dead, or
discarded after an error) is also ``failed``. A job put back by a rate limiter
(``rescheduled``), or an iterable job put back in line (``interrupted``), is not
counted: it runs again later, and is counted then. Nor is an expired job: it was
dropped before it ran.
"""

from __future__ import annotations

import contextvars
from typing import Any

from limitd import clock
from limitd.job_history.store import Tally
from limitd.middleware.base import ServerMiddleware
from limitd.payload import Payload
from limitd.spec import JobSpec

# When the job running in this context entered this middleware (monotonic seconds).
_started: contextvars.ContextVar[float] = contextvars.ContextVar(
    "limitd_history_started", default=0.0
)
# (jid, milliseconds) of the job that last left this middleware in this context.
# Outcomes of a job that did not run, or runs again and is counted then.
NOT_RUN = frozenset({"rescheduled", "interrupted", "expired"})

_timed: contextvars.ContextVar[tuple[Any, float] | None] = contextvars.ContextVar(
    "limitd_history_timed", default=None
)


class JobHistory(ServerMiddleware):
    """Tallies every job of the process into ``tally``. One instance serves every
    processor thread and the event loop: each job's start time lives in a context
    variable from ``starting`` to ``settled``."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> None:
        _started.set(clock.monotonic())

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> None:
        _timed.set((payload.get("jid"), (clock.monotonic() - _started.get()) * 1000.0))

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> None:
        timed = _timed.get()
        _timed.set(None)
        if outcome in NOT_RUN:
            return
        milliseconds = timed[1] if timed is not None and timed[0] == payload.get("jid") else None
        minute = int(clock.now() // 60)
        self.tally.record(minute, str(payload.get("class")), milliseconds, error is not None)
