"""Runs one fetched job: parse -> resolve -> server middleware -> perform -> outcome.

This is where every job's fate is decided and logged, once: ``done``, ``retry``,
``dead`` or ``discarded``. The caller acknowledges the unit of work only after
``execute`` returned, that is after the outcome was recorded in Redis, so a fetch that
keeps jobs until acknowledged never loses one whose retry could not be written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from limitd import clock
from limitd.job import finished, running
from limitd.middleware.chain import ServerChain
from limitd.payload import MalformedPayload, Payload, dead_entry_for_malformed, parse
from limitd.redis import ScriptCall
from limitd.registry import JobRegistry, registry
from limitd.retry import RetryHandler
from limitd.supervisor.stats import JobStats

if TYPE_CHECKING:
    from limitd.fetch.basic import UnitOfWork

log = logging.getLogger("limitd.job")


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
    ) -> None:
        self.retry = retry
        self.chain = chain if chain is not None else ServerChain()
        self.stats = stats if stats is not None else JobStats()
        self.jobs = jobs

    def execute(self, unit: UnitOfWork) -> str:
        """Run ``unit`` and return its outcome."""
        started = clock.monotonic()
        try:
            payload = parse(unit.job)
        except MalformedPayload as exc:
            self.retry.bury(dead_entry_for_malformed(unit.job, unit.queue, str(exc), clock.now()))
            outcome = "dead"
            log.error("dead queue=%s reason=%s", unit.queue, exc)
        else:
            outcome, calls = self._run(payload, unit.queue)
            if calls:
                unit.defer(calls)  # made before the acknowledgement, with it if possible
            _log_outcome(payload, unit.queue, outcome, clock.monotonic() - started)
        self.stats.record(failed=outcome != "done")
        return outcome

    def _run(self, payload: Payload, queue: str) -> tuple[str, list[ScriptCall]]:
        spec = self.jobs.resolve(payload["class"])
        token = running(payload)
        error: BaseException | None = None
        try:
            if spec is None:
                raise UnknownJob(
                    f"no job named {payload['class']!r} is registered in this "
                    f"worker (registered: {', '.join(self.jobs.names())})"
                )
            self.chain.invoke(spec, payload, queue, lambda: spec.run(payload))
            outcome = "done"
        except (Exception, SystemExit) as exc:  # a job calling sys.exit() has failed
            log.warning(
                "fail jid=%s class=%s queue=%s error=%s: %s",
                payload.get("jid"),
                payload["class"],
                queue,
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, UnknownJob),
            )
            error = exc
            outcome = self.retry.job_failed(spec, payload, queue, exc)
        finally:
            finished(token)
        return outcome, self.chain.settle(spec, payload, queue, outcome, error)


def _log_outcome(payload: Payload, queue: str, outcome: str, elapsed: float) -> None:
    log.info(
        "%s jid=%s class=%s queue=%s elapsed=%.3f",
        outcome,
        payload.get("jid"),
        payload["class"],
        queue,
        elapsed,
    )
