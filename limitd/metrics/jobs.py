"""Job metrics of one capsule process: how long each job ran, and how each one ended.

:class:`JobMetrics` is a server middleware. Around ``perform`` it only reads the clock;
the chain's ``settled`` call (``limitd.middleware.chain``), made once the job's fate is
recorded, adds the job to two families of the process's own registry:

- ``limitd_job_duration_seconds{job_class,queue}``: histogram of the time the job spent in the
  chain below this middleware and in ``perform``;
- ``limitd_jobs_total{job_class,queue,outcome}``: jobs that ended, by outcome (``done``,
  ``retry``, ``dead``, ``discarded``, ``rescheduled``, ``expired``, and for iterable
  jobs ``interrupted`` and ``cancelled``);
- ``limitd_jobs_expired_total{job_class,queue}``: jobs dropped unrun because they were
  past their ``expires_in`` deadline (``limitd.expiry``), the series an alert watches.

No Redis call, no lock beyond prometheus-client's own per series: it runs for every job.
A job whose class no worker knows never reaches ``perform``; it is counted (with its
outcome) but has no duration.
"""

from __future__ import annotations

import contextvars
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from limitd import clock
from limitd.middleware.base import ServerMiddleware
from limitd.payload import Payload
from limitd.spec import JobSpec

OUTCOMES = (
    "done", "retry", "dead", "discarded", "rescheduled", "expired", "interrupted", "cancelled",
)  # fmt: skip
# Jobs run from milliseconds to many minutes: the default buckets stop at 10 s.
DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, float("inf"),
)  # fmt: skip


# When the job running in this context entered this middleware (monotonic seconds).
_started: contextvars.ContextVar[float] = contextvars.ContextVar("limitd_job_started", default=0.0)
# (jid, seconds) of the job that last left this middleware in this context.
_timed: contextvars.ContextVar[tuple[Any, float] | None] = contextvars.ContextVar(
    "limitd_job_timed", default=None
)


class JobMetrics(ServerMiddleware):
    """The server middleware that feeds a capsule process's job metrics (registered in
    ``registry``). One instance serves every processor thread and the event loop of the
    process: the time of the job running is kept in a context variable (each thread and
    each async job has its own) from ``starting`` and ``ended`` to ``settled``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "limitd_job_duration_seconds",
            "Time jobs took in this process, from the server middleware to the end of perform.",
            ("job_class", "queue"),
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.jobs = Counter(
            "limitd_jobs",
            "Jobs this process ran, by how they ended (done, retry, dead, discarded, rescheduled,"
            " expired, interrupted, cancelled).",
            ("job_class", "queue", "outcome"),
            registry=registry,
        )
        self.expired = Counter(
            "limitd_jobs_expired",
            "Jobs this process dropped unrun: past their expires_in deadline when fetched.",
            ("job_class", "queue"),
            registry=registry,
        )
        # The labelled series, looked up once each: prometheus-client's labels() takes
        # a lock and validates the labels at every call (about 2 us of the 5 per job).
        self._counted: dict[tuple[str, str, str], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> None:
        _started.set(clock.monotonic())

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> None:
        _timed.set((payload.get("jid"), clock.monotonic() - _started.get()))

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> None:
        """Count the job under its outcome; observe its duration when it was timed (by
        this thread, for this jid: a job that never reached the chain was not)."""
        job = str(payload.get("class"))
        counted = self._counted.get((job, queue, outcome))
        if counted is None:
            counted = self._counted[job, queue, outcome] = self.jobs.labels(job, queue, outcome)
        counted.inc()
        if outcome == "expired":
            self.expired.labels(job, queue).inc()
        timed = _timed.get()
        _timed.set(None)
        if timed is not None and timed[0] == payload.get("jid"):
            series = self._timed.get((job, queue))
            if series is None:
                series = self._timed[job, queue] = self.duration.labels(job, queue)
            series.observe(timed[1])
