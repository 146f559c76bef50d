"""The two middleware of tracing: a producer span around each push, a consumer span
around each run, and the trace context carried from one to the other in the payload.

The context travels as top-level payload keys, written and read by OpenTelemetry's
global propagator (W3C ``traceparent`` and ``tracestate``, and ``baggage`` when there
is any, by default). That is where Ruby's OpenTelemetry instrumentation of Sidekiq puts
it too (it injects into the job hash itself), so traces continue across a Ruby app and
a Python one in both directions; Sidekiq keeps keys it does not know, so an
uninstrumented Sidekiq runs such jobs unchanged. A retried job keeps its keys: every
run of it is a child of the push that created it.

Spans follow OpenTelemetry's messaging conventions: ``send <queue>`` (kind PRODUCER)
and ``process <queue>`` (kind CONSUMER), with ``messaging.system``,
``messaging.destination.name`` (the queue), ``messaging.message.id`` (the jid) and
``messaging.operation.type``/``name``, plus ``limitd.job.*`` attributes. The
conventions have no registered system for Sidekiq-style queues; ``messaging.system``
is ``limitd``: the spans describe limitd's work (its limits, its retry decisions), and
the queue names, shared with Sidekiq, are what tie a Ruby service's spans to these.

The consumer span stays open until the job's fate is recorded (``settled``): a failed
run then says whether it will be retried or is dead (``limitd.job.outcome``), which the
run itself cannot know. Imported only when tracing is on: it imports OpenTelemetry.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import Getter
except ImportError as exc:  # the message says what to install
    raise ImportError(
        "limitd's tracing needs OpenTelemetry's API: pip install 'limitd[otel]'"
    ) from exc

from limitd.middleware.chain import Dropped, Interrupted, Rescheduled
from limitd.payload import Payload
from limitd.spec import JobSpec
from limitd.version import __version__

SYSTEM = "limitd"
TRACER_NAME = "limitd"
OUTCOME = "limitd.job.outcome"  # done, retry, dead, discarded, rescheduled, interrupted
HALTED = "limitd.push.halted"  # a client middleware kept the job from being pushed

PushNext = Callable[[Payload], "Payload | None"]
AsyncPushNext = Callable[[Payload], Awaitable["Payload | None"]]


class _PayloadGetter(Getter[Payload]):
    """Reads a propagator's fields from a payload: text values only, so a payload whose
    ``traceparent`` is something else (pushed by hand, by another tool) starts a new
    trace instead of failing the job."""

    def get(self, carrier: Payload, key: str) -> list[str] | None:
        value = carrier.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Payload) -> list[str]:
        return list(carrier)


GETTER = _PayloadGetter()


def job_attributes(payload: Payload, queue: str, operation: str) -> dict[str, Any]:
    """The attributes a push's and a run's spans share."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": queue,
        "limitd.job.class": str(payload.get("class")),
    }
    jid = payload.get("jid")
    if isinstance(jid, str):
        attributes["messaging.message.id"] = jid
    return attributes


class TracingClient:
    """A client middleware (callable form, with ``acall``) that opens ``send <queue>``
    around the rest of the chain and the write, and writes its context into the payload
    for the run to continue. Put it first in the chain (:func:`limitd.tracing.app
    .instrument` does): its span then covers the other middleware, and a push they halt
    (a unique job's duplicate) is marked ``limitd.push.halted``.

    A bulk push gives each job a span of its own: each job passes the chain on its own
    and may be halted or rerouted on its own, and each run needs its own parent."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)

    def __call__(
        self, spec: JobSpec | None, payload: Payload, redis: Any, call_next: PushNext
    ) -> Payload | None:
        queue = str(payload.get("queue"))
        with self._sending(payload, queue) as span:
            pushed = call_next(payload)
            _describe_push(span, queue, pushed)
            return pushed

    async def acall(
        self, spec: JobSpec | None, payload: Payload, redis: Any, call_next: AsyncPushNext
    ) -> Payload | None:
        queue = str(payload.get("queue"))
        with self._sending(payload, queue) as span:
            pushed = await call_next(payload)
            _describe_push(span, queue, pushed)
            return pushed

    @contextmanager
    def _sending(self, payload: Payload, queue: str) -> Iterator[trace.Span]:
        """The producer span, current while the push goes on; its context written into
        the payload. An exception marks it ERROR with the exception as an event."""
        attributes = job_attributes(payload, queue, "send")
        if payload.get("at") is not None:
            attributes["limitd.job.scheduled_at"] = float(payload["at"])
        with self.tracer.start_as_current_span(
            f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        ) as span:
            propagate.inject(payload)
            yield span


def _describe_push(span: trace.Span, asked: str, pushed: Payload | None) -> None:
    """What the chain did with the push: halted it, or sent it to another queue than
    the one ``asked`` (tenant fairness reroutes busy tenants)."""
    if pushed is None:
        span.set_attribute(HALTED, True)
        return
    queue = str(pushed.get("queue"))
    if queue != asked:
        span.set_attribute("messaging.destination.name", queue)
        span.update_name(f"send {queue}")


# The run whose span waits for ``settled``, in the context the run went through: a
# processor thread's, or an async job's task's. (payload, span)
_pending: contextvars.ContextVar[tuple[Payload, trace.Span] | None] = contextvars.ContextVar(
    "limitd_tracing_pending", default=None
)


class TracingServer:
    """A server middleware (callable form, with ``acall`` and ``settled``) that runs
    each job inside ``process <queue>``, a child of the context its payload carries (a
    new trace when it carries none: a job pushed by an untraced client). The span is
    current while the job runs, so the job's own spans, and the pushes it makes, are
    its children. Put it first in the chain (the ``tracing`` service does): its span
    then covers the other middleware, and sees a limiter's reschedule as such."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(TRACER_NAME, __version__, tracer_provider)

    def __call__(
        self, spec: JobSpec, payload: Payload, queue: str, call_next: Callable[[], Any]
    ) -> Any:
        token = self._start(payload, queue)
        try:
            return call_next()
        except BaseException as error:
            self._raised(error)
            raise
        finally:
            otel_context.detach(token)

    async def acall(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        call_next: Callable[[], Awaitable[Any]],
    ) -> Any:
        token = self._start(payload, queue)
        try:
            return await call_next()
        except BaseException as error:
            self._raised(error)
            raise
        finally:
            otel_context.detach(token)

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> None:
        """The job's fate is recorded: say it on the span and end it. No Redis work."""
        pending = _pending.get()
        if pending is None or pending[0] is not payload:
            return  # it never ran (an unknown class): no span was started
        _pending.set(None)
        span = pending[1]
        span.set_attribute(OUTCOME, outcome)
        span.end()

    def _start(self, payload: Payload, queue: str) -> contextvars.Token[otel_context.Context]:
        """Open the run's span and make it current; return the token that restores the
        context before. A span still waiting from a run that never settled (the
        recording of its failure raised) is ended first, so none is held forever."""
        _end_unsettled()
        attributes = job_attributes(payload, queue, "process")
        if isinstance(payload.get("retry_count"), int):
            attributes["limitd.job.retry_count"] = payload["retry_count"]
        span = self.tracer.start_span(
            f"process {queue}",
            context=propagate.extract(payload, getter=GETTER),
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        )
        _pending.set((payload, span))
        return otel_context.attach(trace.set_span_in_context(span))

    def _raised(self, error: BaseException) -> None:
        """The run raised: the exception becomes an event and the status ERROR, unless
        the job was rescheduled, put back in line or dropped (it runs again, or must not
        run: nothing failed). What is not an ``Exception`` (a hard shutdown, a cancelled
        task) ends the run here: it will not be settled."""
        pending = _pending.get()
        if pending is None or isinstance(error, (Rescheduled, Interrupted, Dropped)):
            return
        span = pending[1]
        span.record_exception(error)
        span.set_status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
        if not isinstance(error, (Exception, SystemExit)):
            _pending.set(None)
            span.set_attribute(OUTCOME, "interrupted")
            span.end()


def _end_unsettled() -> None:
    pending = _pending.get()
    if pending is not None:
        _pending.set(None)
        pending[1].set_attribute(OUTCOME, "unsettled")
        pending[1].end()

