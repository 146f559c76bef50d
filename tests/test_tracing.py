"""Tracing in this process: spans of pushes and runs read back from the SDK's in-memory
exporter after a capsule drained the jobs (parents, attributes, outcomes, failures,
scheduled, bulk and async jobs), the ``tracing:`` section and the service it turns on,
and payloads with a trace context through Ruby Sidekiq and back.

The middleware are given a tracer provider of their own: the process-wide one can be
set only once, and other tests share this interpreter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import limitd
from limitd import clock, keys
from limitd.aio.client import AsyncClient
from limitd.config import CapsuleConfig, ConfigError, load_config
from limitd.middleware import ServerChain
from limitd.middleware.chain import Dropped, Interrupted, Rescheduled
from limitd.middleware.client_chain import ClientChain
from limitd.plugins import ProcessContext
from limitd.registry import registry
from limitd.supervisor import Capsule
from limitd.tracing import section as tracing_section
from limitd.tracing.app import instrument, uninstrument
from limitd.tracing.middleware import TracingClient, TracingServer
from limitd.tracing.plug import services
from limitd.tracing.process import TracingService
from limitd.tracing.section import TracingSettings

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
TRACER = PROVIDER.get_tracer("tests")
QUEUE = "traced"


@limitd.job(name="tracing_test.Work", queue=QUEUE)
def work(n: int) -> None:
    with TRACER.start_as_current_span("inside the job"):
        pass


@limitd.job(name="tracing_test.Fails", queue=QUEUE, retry=1)
def fails() -> None:
    raise ValueError("no luck")


@limitd.job(name="tracing_test.Once", queue=QUEUE, unique_for=600)
def once() -> None:
    pass


@limitd.job(name="tracing_test.Later", queue=QUEUE)
def later() -> None:
    pass


@limitd.job(name="tracing_test.Async", queue=QUEUE)
async def async_work() -> None:
    await asyncio.sleep(0)
    with TRACER.start_as_current_span("inside the async job"):
        pass


@pytest.fixture(autouse=True)
def _fresh_spans() -> Iterator[None]:
    EXPORTER.clear()
    yield
    EXPORTER.clear()


@pytest.fixture
def client(redis: redis_py.Redis) -> limitd.Client:
    """A client whose chain starts with the tracing middleware (on this test's provider),
    then the default chain."""
    chain = ClientChain([TracingClient(PROVIDER), *limitd.Client(redis).middleware])
    return limitd.Client(redis, middleware=chain)


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Capsule:
    chain = ServerChain([TracingServer(PROVIDER)])
    return Capsule(CapsuleConfig(queues=[QUEUE]), redis=redis, middleware=chain)


def spans(name: str) -> list[ReadableSpan]:
    return [span for span in EXPORTER.get_finished_spans() if span.name == name]


def one(name: str) -> ReadableSpan:
    [span] = spans(name)
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def queued(redis: redis_py.Redis) -> list[dict[str, object]]:
    return [json.loads(raw) for raw in redis.lrange(keys.of(redis).queue(QUEUE), 0, -1)]


def test_a_run_is_a_child_of_the_push_and_the_push_of_the_caller(
    client: limitd.Client, capsule: Capsule, redis: redis_py.Redis
) -> None:
    with TRACER.start_as_current_span("GET /signup", kind=trace.SpanKind.SERVER) as request:
        jid = work.set(client=client).perform_async(7)
    [payload] = queued(redis)
    assert str(payload["traceparent"]).startswith("00-")  # W3C, top-level like Ruby's
    assert capsule.drain() == {"done": 1}

    send, process = one(f"send {QUEUE}"), one(f"process {QUEUE}")
    trace_id = request.get_span_context().trace_id
    assert {send.context.trace_id, process.context.trace_id} == {trace_id}
    assert parent_of(send) == request.get_span_context().span_id
    assert parent_of(process) == send.context.span_id
    assert parent_of(one("inside the job")) == process.context.span_id
    assert (send.kind, process.kind) == (trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER)
    shared = {
        "messaging.system": "limitd",
        "messaging.destination.name": QUEUE,
        "messaging.message.id": jid,
        "limitd.job.class": "tracing_test.Work",
    }
    assert dict(send.attributes or {}) == {
        **shared,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    assert dict(process.attributes or {}) == {
        **shared,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "limitd.job.outcome": "done",
    }
    assert process.status.status_code == trace.StatusCode.UNSET


def test_a_failed_run_is_an_error_that_says_where_the_job_went(
    client: limitd.Client, capsule: Capsule
) -> None:
    fails.set(client=client).perform_async()
    assert capsule.drain() == {"retry": 1}
    assert capsule.poller.enqueue_due(now=clock.now() + 3600) == 1
    assert capsule.drain() == {"dead": 1}

    first, second = spans(f"process {QUEUE}")
    send = one(f"send {QUEUE}")
    assert parent_of(first) == parent_of(second) == send.context.span_id  # retries too
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["limitd.job.outcome"], second.attributes["limitd.job.outcome"]) == (
        "retry",
        "dead",
    )
    assert "limitd.job.retry_count" not in first.attributes
    assert second.attributes["limitd.job.retry_count"] == 0  # Sidekiq's count: first retry
    for span in (first, second):
        assert span.status.status_code == trace.StatusCode.ERROR
        assert span.status.description == "ValueError: no luck"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"


def test_scheduled_and_bulk_pushes_carry_each_job_to_its_run(
    client: limitd.Client, capsule: Capsule
) -> None:
    at = clock.now() + 600
    later.set(client=client).perform_at(at)
    jids = work.set(client=client).perform_bulk([[1], [2], [3]])
    assert capsule.drain() == {"done": 3}
    assert capsule.poller.enqueue_due(now=at + 1) == 1
    assert capsule.drain() == {"done": 1}

    sends = {str((s.attributes or {})["messaging.message.id"]): s for s in spans(f"send {QUEUE}")}
    runs = {str((s.attributes or {})["messaging.message.id"]): s for s in spans(f"process {QUEUE}")}
    assert sends.keys() == runs.keys() and set(jids) < set(sends)  # one span per bulk job
    for jid, run in runs.items():
        assert parent_of(run) == sends[jid].context.span_id
    [scheduled] = [s for s in sends.values() if "limitd.job.scheduled_at" in (s.attributes or {})]
    assert (scheduled.attributes or {})["limitd.job.scheduled_at"] == at
    assert (scheduled.attributes or {})["limitd.job.class"] == "tracing_test.Later"


def test_a_halted_push_says_so(client: limitd.Client, redis: redis_py.Redis) -> None:
    assert once.set(client=client).perform_async() is not None
    assert once.set(client=client).perform_async() is None  # the unique lock is taken
    first, second = spans(f"send {QUEUE}")
    assert "limitd.push.halted" not in (first.attributes or {})
    assert (second.attributes or {})["limitd.push.halted"] is True
    assert len(queued(redis)) == 1


def test_a_failed_write_marks_the_push_an_error(redis: redis_py.Redis) -> None:
    def refuse(payload: dict[str, object]) -> None:
        raise redis_py.ConnectionError("Redis went away")

    with pytest.raises(redis_py.ConnectionError):
        ClientChain([TracingClient(PROVIDER)]).invoke(None, {"queue": QUEUE}, redis, refuse)
    send = one(f"send {QUEUE}")
    assert send.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in send.events] == ["exception"]


@pytest.mark.parametrize(
    "carried",
    [{}, {"traceparent": 42}, {"traceparent": "00-not-a-trace"}],
    ids=["none", "not text", "malformed"],
)
def test_a_payload_without_a_usable_context_runs_in_a_new_trace(
    carried: dict[str, object], capsule: Capsule, redis: redis_py.Redis
) -> None:
    limitd.Client(redis).push({"class": "tracing_test.Work", "args": [1], **carried})
    assert capsule.drain() == {"done": 1}
    process = one(f"process {QUEUE}")
    assert process.parent is None
    assert parent_of(one("inside the job")) == process.context.span_id


def test_async_pushes_and_runs_on_an_event_loop(client: limitd.Client) -> None:
    chain = ServerChain([TracingServer(PROVIDER)])
    spec = registry.resolve("tracing_test.Async")
    assert spec is not None

    async def push_then_run() -> None:
        pushed: list[dict[str, object]] = []

        async def keep(payload: dict[str, object]) -> dict[str, object]:
            pushed.append(payload)
            return payload

        aclient = AsyncClient.of(client)
        with TRACER.start_as_current_span("async request"):
            await client.middleware.ainvoke(
                spec,
                {"queue": QUEUE, "jid": "a" * 24, "args": []},
                aclient.redis,
                keep,
                sync_redis=lambda: None,
            )
        [payload] = pushed
        # as the capsule's event loop runs a handed-off job: in a task, then settled
        await chain.ainvoke(spec, payload, QUEUE, lambda: spec.run(payload))
        chain.settle(spec, payload, QUEUE, "done", None)

    asyncio.run(push_then_run())
    send, process = one(f"send {QUEUE}"), one(f"process {QUEUE}")
    assert parent_of(send) == one("async request").context.span_id
    assert parent_of(process) == send.context.span_id
    assert parent_of(one("inside the async job")) == process.context.span_id
    assert (process.attributes or {})["limitd.job.outcome"] == "done"


def test_a_rescheduled_run_is_no_error_and_an_interrupted_one_ends_at_once() -> None:
    spec = registry.resolve("tracing_test.Work")
    assert spec is not None
    chain = ServerChain([TracingServer(PROVIDER)])

    def reschedule() -> None:
        raise Rescheduled()

    payload = {"jid": "r" * 24}
    with pytest.raises(Rescheduled):
        chain.invoke(spec, payload, QUEUE, reschedule)
    chain.settle(spec, {"jid": "r" * 24}, QUEUE, "done", None)  # not this run's payload
    assert spans(f"process {QUEUE}") == []
    chain.settle(spec, payload, QUEUE, "rescheduled", None)
    rescheduled = one(f"process {QUEUE}")
    assert rescheduled.status.status_code == trace.StatusCode.UNSET
    assert (rescheduled.attributes or {})["limitd.job.outcome"] == "rescheduled"

    EXPORTER.clear()

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        chain.invoke(spec, {"jid": "i" * 24}, QUEUE, interrupted)
    stopped = one(f"process {QUEUE}")  # ended without a settle
    assert (stopped.attributes or {})["limitd.job.outcome"] == "interrupted"
    assert stopped.status.status_code == trace.StatusCode.ERROR


def test_an_expired_or_put_back_run_is_no_error() -> None:
    spec = registry.resolve("tracing_test.Work")
    assert spec is not None
    chain = ServerChain([TracingServer(PROVIDER)])
    for raised, outcome in (
        (Dropped("expired", "too late"), "expired"),
        (Interrupted("capsule stopping after 3 items"), "interrupted"),
    ):
        EXPORTER.clear()
        payload = {"jid": outcome[0] * 24}

        def run(error: Exception = raised) -> None:
            raise error

        with pytest.raises(type(raised)):
            chain.invoke(spec, payload, QUEUE, run)
        chain.settle(spec, payload, QUEUE, outcome, None)
        span = one(f"process {QUEUE}")
        assert span.status.status_code == trace.StatusCode.UNSET, outcome
        assert not span.events, "no exception recorded"
        assert (span.attributes or {})["limitd.job.outcome"] == outcome


def test_a_run_left_unsettled_is_ended_by_the_next(capsule: Capsule) -> None:
    spec = registry.resolve("tracing_test.Work")
    assert spec is not None
    chain = ServerChain([TracingServer(PROVIDER)])
    chain.invoke(spec, {"jid": "u" * 24, "args": [1]}, QUEUE, lambda: None)  # never settled
    assert spans(f"process {QUEUE}") == []
    payload = {"jid": "n" * 24, "args": [2]}
    chain.invoke(spec, payload, QUEUE, lambda: None)
    chain.settle(spec, payload, QUEUE, "done", None)
    outcomes = [(s.attributes or {})["limitd.job.outcome"] for s in spans(f"process {QUEUE}")]
    assert outcomes == ["unsettled", "done"]


# turning it on: the app's instrument(), the config section and its service


def test_instrument_puts_the_producer_first_once(redis: redis_py.Redis) -> None:
    client = limitd.Client(redis)
    assert instrument(client) is client
    instrument(client)
    entries = list(client.middleware)
    assert isinstance(entries[0], TracingClient)
    assert sum(isinstance(entry, TracingClient) for entry in entries) == 1
    uninstrument(client)
    assert TracingClient not in client.middleware
    instrument()  # the default client
    assert TracingClient in limitd.default_client().middleware


def test_the_section_turns_tracing_on(tmp_path: Path) -> None:
    path = tmp_path / "app.yml"
    path.write_text("tracing: {enabled: true}\n")
    assert load_config([path]).section("tracing") == TracingSettings(enabled=True)
    assert load_config([]).section("tracing") == TracingSettings(enabled=False)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("tracing: {enable: true}", "tracing.enable", "unknown key; did you mean 'enabled'?"),
        ("tracing: {enabled: maybe}", "tracing.enabled", "expected true or false"),
        ("tracing: on", "tracing", "expected a mapping"),
    ],
)
def test_section_mistakes_name_the_file_key_and_expected_value(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = tmp_path / "app.yml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    assert (caught.value.file, caught.value.key) == (str(path), key)
    assert expected in caught.value.message


def test_turning_it_on_without_opentelemetry_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "app.yml"
    path.write_text("tracing:\n  enabled: true\n")
    monkeypatch.setattr(tracing_section, "otel_installed", lambda: False)
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    assert (caught.value.file, caught.value.key) == (str(path), "tracing.enabled")
    assert "pip install 'limitd[otel]'" in caught.value.message
    path.write_text("tracing:\n  enabled: false\n")
    load_config([path])  # off needs nothing installed


def test_the_service_joins_the_chains_only_when_enabled(redis: redis_py.Redis) -> None:
    def context(enabled: bool) -> ProcessContext:
        sections = {"tracing": TracingSettings(enabled=enabled)}
        return ProcessContext(redis, sections, CapsuleConfig(), ServerChain())

    assert services(context(False)) == []
    on = context(True)
    [service] = services(on)
    assert isinstance(service, TracingService)
    service.start()
    service.start()  # once only
    assert [type(entry) for entry in on.chain] == [TracingServer]
    assert isinstance(next(iter(limitd.default_client().middleware)), TracingClient)
    service.stop()  # the API's provider: nothing to flush


def test_import_limitd_loads_no_tracing_middleware() -> None:
    """The section and the plug only: the middleware (and OpenTelemetry through it)
    load when a process turns tracing on or the app instruments."""
    code = textwrap.dedent("""
        import sys, limitd
        print(sorted(m for m in sys.modules if m.startswith("limitd.tracing")))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout.replace("'", '"')) == [
        "limitd.tracing",
        "limitd.tracing.plug",
        "limitd.tracing.section",
    ]
