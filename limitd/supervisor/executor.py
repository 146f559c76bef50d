"""Runs one fetched job: parse -> resolve -> server middleware -> perform -> outcome.

Sync jobs run in the calling processor thread (``execute``); async jobs are handed to the
capsule's event loop and run there by ``execute_async``, through the same steps.

This is where every job's fate is decided and logged, once: ``done``, ``retry``,
``dead``, ``discarded``, ``rescheduled`` (a middleware put it back in ``schedule``,
see ``limitd.middleware.chain.Rescheduled``), ``interrupted`` (the job stopped between
two steps and is put back in line, ``limitd.middleware.chain.Interrupted``: its unit's
``give_back`` says where) or the one that dropped the job names (``expired``,
``cancelled``, see ``limitd.middleware.chain.Dropped``). The caller
acknowledges the unit of work only after ``execute`` returned, that is after the outcome
was recorded in Redis, so a fetch that keeps jobs until acknowledged never loses one
whose retry could not be written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from limitd import clock
from limitd.connection import ScriptCall
from limitd.fetch.basic import BACK, FRONT
from limitd.fetch.recoveries import RecoveredTooOften, count_in
from limitd.logs import job_fields, own_frames
from limitd.middleware.chain import Dropped, Interrupted, Rescheduled, ServerChain
from limitd.payload import MalformedPayload, Payload, dead_entry, parse
from limitd.registry import JobRegistry, registry
from limitd.retry import Fate, RetryHandler, error_class_name
from limitd.spec import JobSpec, finished, running
from limitd.supervisor.stats import JobStats

if TYPE_CHECKING:
    from limitd.fetch.basic import UnitOfWork

log = logging.getLogger("limitd.job")

DEFAULT_MAX_RECOVERIES = 3


# What ``execute`` returns for an async job it gave to the event loop.
HANDED_OFF = "handed_off"

# (unit, its decoded payload, its async spec): starts the job on the capsule's loop.
HandOff = Callable[["UnitOfWork", Payload, JobSpec], None]

INTERRUPTED = "interrupted"

# The outcomes that count as failed in the stats (a job rescheduled or dropped by a
# middleware, ``expired`` for one, did not fail).
FAILURES = ("retry", "dead", "discarded")


class Shutdown(BaseException):
    """Raised inside a processor thread at a hard shutdown, after its job was requeued:
    the job must not be retried or acknowledged, only abandoned."""


class UnknownJob(LookupError):
    """The payload names a class this worker does not know. Retried: the code that
    defines it may not be deployed here yet."""


class JobExecutor:
    """Shared by a capsule's processors; holds no per-job state."""

    def __init__(
        self,
        retry: RetryHandler,
        chain: ServerChain | None = None,
        stats: JobStats | None = None,
        jobs: JobRegistry = registry,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        *,
        hand_off: HandOff | None = None,
    ) -> None:
        self.retry = retry
        self.hand_off = hand_off
        self.chain = chain if chain is not None else ServerChain()
        self.stats = stats if stats is not None else JobStats()
        self.jobs = jobs
        self.max_recoveries = max_recoveries

    def async_job(self, unit: UnitOfWork) -> tuple[Payload, JobSpec] | None:
        """The payload and spec of ``unit`` when it is an async job that may simply start:
        decodable, charged with no crash, of a known async class, with an event loop to
        run it. Else None, and the unit goes the usual way: :meth:`execute`, on a
        processor, buries it, reports it or hands it off as it should. This lets the
        thread that fetched a batch give the loop its async jobs at once
        (``AsyncLane.take_fetched``)."""
        if unit.recoveries or self.hand_off is None:
            return None
        try:
            payload = parse(unit.job)
        except MalformedPayload:
            return None  # buried by the processor that runs it
        if count_in(payload):
            return None  # given back before: the processor decides whether it may run
        spec = self.jobs.resolve(payload["class"])
        if spec is None or not spec.is_async:
            return None
        return payload, spec

    def execute(self, unit: UnitOfWork, *, inline: bool = False) -> str:
        """Run ``unit`` and return its outcome. A job that cannot be decoded, or that was
        given back ``max_recoveries`` times without completing, is buried, not run. An
        async job goes to ``hand_off`` (the capsule's event loop) when there is one, and
        the outcome is ``HANDED_OFF``: the loop runs it and settles it. With ``inline``
        (a drain, whose caller settles every unit itself) it runs here on a loop of its
        own instead."""
        payload, outcome = self._admit(unit)
        if outcome is None:
            spec = self.jobs.resolve(payload["class"])
            if spec is not None and spec.is_async and self.hand_off is not None and not inline:
                self.hand_off(unit, payload, spec)
                return HANDED_OFF
            if unit.recoveries:
                unit.suspect_started()
            outcome = self._execute(unit, payload, spec)
            if unit.recoveries:
                unit.forget_recoveries()
        self.stats.record(failed=outcome in FAILURES)
        return outcome

    async def execute_async(self, unit: UnitOfWork, payload: Payload, spec: JobSpec) -> str:
        """Run a handed-off async job on the running loop, as :meth:`execute` runs a
        sync one. What needs a blocking Redis call off the hot path (recording a
        failure, forgetting recoveries) goes to a worker thread, so no other job on the
        loop waits for it. Cancelled at a hard shutdown after its job was requeued: the
        CancelledError goes on, nothing is recorded."""
        if unit.recoveries:
            await asyncio.to_thread(unit.suspect_started)
        timed = log.isEnabledFor(logging.INFO)
        started = clock.monotonic() if timed else 0.0
        token = running(payload)
        error: BaseException | None = None
        chain = self.chain
        entries = chain.concerned(payload)
        try:
            try:
                await chain.awaitable(spec, payload, unit.queue, lambda: spec.run(payload), entries)
            except BaseException as exc:  # through the middleware that act on failures
                await chain.afailed(exc, spec, payload, unit.queue, entries)
            outcome = "done"
        except ENDED_BY_MIDDLEWARE as ended:
            outcome = _ended_outcome(unit, ended)
        except (Exception, SystemExit) as exc:
            error = exc
            outcome = await asyncio.to_thread(self._failed, spec, payload, unit.queue, exc)
        finally:
            finished(token)
        calls = chain.settle(spec, payload, unit.queue, outcome, error, entries=entries)
        if calls and unit.defer_is_io:
            await asyncio.to_thread(unit.defer, calls)
        elif calls:
            unit.defer(calls)  # kept for the acknowledgement
        if unit.recoveries:
            await asyncio.to_thread(unit.forget_recoveries)
        if timed:
            _log_outcome(payload, unit.queue, outcome, clock.monotonic() - started)
        self.stats.record(failed=outcome in FAILURES)
        return outcome

    def _admit(self, unit: UnitOfWork) -> tuple[Payload, str | None]:
        """Decode the job; bury it (and say so with its outcome) if it must not run: see
        ``limitd/fetch/recoveries.py`` for when a crash counts against a job."""
        try:
            payload = parse(unit.job)
        except MalformedPayload as exc:
            outcome = self._kill(unit, None, exc)
            if unit.recoveries:  # a suspect after all: its charges and hold go with it
                unit.forget_recoveries()
            return {}, outcome
        given_back = count_in(payload)  # basic fetch: every count is the job's own
        recovered = max(unit.recoveries, given_back)
        if recovered < self.max_recoveries or max(unit.alone, given_back) == 0:
            return payload, None
        reason = unit.recovery_reason(payload)
        outcome = self._kill(unit, payload, RecoveredTooOften(recovered, reason))
        if unit.recoveries:
            unit.forget_recoveries()
        return payload, outcome

    def _execute(self, unit: UnitOfWork, payload: Payload, spec: JobSpec | None) -> str:
        # Every job passes here: the clock is read only for the INFO line that uses it.
        timed = log.isEnabledFor(logging.INFO)
        started = clock.monotonic() if timed else 0.0
        outcome, calls = self._run(spec, payload, unit)
        if calls:
            unit.defer(calls)  # made before the acknowledgement, with it if possible
        if timed:
            _log_outcome(payload, unit.queue, outcome, clock.monotonic() - started)
        return outcome

    def _kill(self, unit: UnitOfWork, payload: Payload | None, exc: Exception) -> str:
        """Straight to the dead set with the reason, and the death handlers told."""
        entry = dead_entry(unit.job, unit.queue, error_class_name(exc), str(exc), clock.now())
        self.retry.kill(entry, exc)
        log.error(
            "dead jid=%s class=%s queue=%s error=%s: %s",
            (payload or {}).get("jid"),
            (payload or {}).get("class"),
            unit.queue,
            error_class_name(exc),
            exc,
        )
        return "dead"

    def _run(
        self, spec: JobSpec | None, payload: Payload, unit: UnitOfWork
    ) -> tuple[str, list[ScriptCall]]:
        queue = unit.queue
        token = running(payload)
        error: BaseException | None = None
        entries = self.chain.concerned(payload)
        try:
            if spec is None:
                raise UnknownJob(
                    f"no job named {payload['class']!r} is registered in this "
                    f"worker (registered: {', '.join(self.jobs.names())})"
                )
            self.chain.invoke(
                spec, payload, queue, lambda: _perform(spec, payload), entries=entries
            )
            outcome = "done"
        except ENDED_BY_MIDDLEWARE as ended:
            outcome = _ended_outcome(unit, ended)
        except (Exception, SystemExit) as exc:  # a job calling sys.exit() has failed
            error = exc
            outcome = self._failed(spec, payload, queue, exc)
        finally:
            finished(token)
        return outcome, self.chain.settle(spec, payload, queue, outcome, error, entries=entries)

    def _failed(
        self, spec: JobSpec | None, payload: Payload, queue: str, exc: BaseException
    ) -> str:
        """Record the failure, then log it once, saying where the job went."""
        try:
            fate = self.retry.job_failed(spec, payload, queue, exc)
        except BaseException:
            _log_failure(payload, queue, exc, None)  # the error that lost the job follows
            raise
        _log_failure(payload, queue, exc, fate)
        return fate.outcome


# What a middleware raises to end a job other than as done or failed.
ENDED_BY_MIDDLEWARE = (Rescheduled, Interrupted, Dropped)


def _ended_outcome(unit: UnitOfWork, ended: Exception) -> str:
    """The outcome of a job a middleware ended (one of ``ENDED_BY_MIDDLEWARE``): put
    back in schedule to run again, stopped between steps and back in line, or dropped
    (the middleware decided it must not run: its outcome is the one it names)."""
    if isinstance(ended, Interrupted):
        return _give_back(unit, ended)
    if isinstance(ended, Dropped):
        return ended.outcome
    return "rescheduled"


def _give_back(unit: UnitOfWork, interrupted: Interrupted) -> str:
    """The job stopped between steps: its dispatch puts it back in line rather than
    acknowledging it (see ``Dispatch.finish``)."""
    unit.give_back = BACK if interrupted.back else FRONT
    return INTERRUPTED


def _perform(spec: JobSpec, payload: Payload) -> Any:
    """Run the job in this thread; an async job with no event loop to go to (draining in
    a script or a test) gets a loop of its own for the time it runs."""
    result = spec.run(payload)
    if spec.is_async:
        return asyncio.run(result)
    return result


def _log_failure(payload: Payload, queue: str, exc: BaseException, fate: Fate | None) -> None:
    """One WARNING line with everything an operator asks first, and the traceback of the
    job's own code; the traceback through limitd's middleware is at DEBUG."""
    line = "fail jid=%s class=%s queue=%s retry_count=%s next=%s error=%s: %s"
    count = payload.get("retry_count")
    args: tuple[object, ...] = (payload.get("jid"), payload["class"], queue)
    args += ("-" if count is None else count, _next_step(fate), type(exc).__name__, exc)
    fields = job_fields(payload, queue)
    if isinstance(exc, UnknownJob):  # nothing ran: a traceback would only show limitd
        log.warning(line, *args, extra=fields)
        return
    log.warning(line, *args, exc_info=(type(exc), exc, own_frames(exc.__traceback__)), extra=fields)
    log.debug(line + " (every frame)", *args, exc_info=exc, extra=fields)


def _next_step(fate: Fate | None) -> str:
    if fate is None:
        return "unrecorded"
    if fate.retry_at is None:
        return fate.outcome
    delay = max(0.0, fate.retry_at - clock.now())
    when = dt.datetime.fromtimestamp(fate.retry_at, dt.timezone.utc)
    return f"retry in {delay:.{0 if delay >= 10 else 1}f}s at {when:%Y-%m-%dT%H:%M:%SZ}"


def _log_outcome(payload: Payload, queue: str, outcome: str, elapsed: float) -> None:
    log.info(
        "%s jid=%s class=%s queue=%s elapsed=%.3f",
        outcome,
        payload.get("jid"),
        payload["class"],
        queue,
        elapsed,
        extra=job_fields(payload, queue),
    )
