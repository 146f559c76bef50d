"""A trace from a web request into a job, through a real ``limitd start``.

This process plays the web app: a request's span, a push through the tracing
middleware. The capsule process runs the app module its config ``require``s, which
sets up the SDK with a batch span processor and an exporter writing each finished span
as a JSON line to a file; the spans reach it only when the process flushes them at
stop, which checks that a capsule process (leaving by ``os._exit``) loses none. The
test reads the file and follows the trace: request -> push -> run -> the job's own
span -> the push the job makes -> that job's run, sync and async, and a failed run.

And payloads with a trace context through Ruby Sidekiq, and a Ruby push (no context)
run by limitd in a trace of its own.
"""

from __future__ import annotations

import json
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import limitd
from limitd.api import Stats
from limitd.connection.embedded import RedisServer
from limitd.middleware import ServerChain
from limitd.middleware.client_chain import ClientChain
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.tracing.middleware import TracingClient, TracingServer
from tests.helpers import LimitdProcesses, wait_for
from tests.test_sidekiq_interop import HAVE_SIDEKIQ, ruby, ruby_app, sidekiq

__all__ = ["ruby_app", "sidekiq"]  # fixtures used here

APP = textwrap.dedent("""
    import json, os

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import limitd


    class JsonLines(SpanExporter):
        '''Finished spans as JSON lines in $TRACED_SPANS: the test's window on them.'''

        def export(self, spans):
            with open(os.environ["TRACED_SPANS"], "a") as out:
                for span in spans:
                    out.write(json.dumps({
                        "name": span.name,
                        "kind": span.kind.name,
                        "trace_id": format(span.context.trace_id, "032x"),
                        "span_id": format(span.context.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "attributes": dict(span.attributes),
                        "status": span.status.status_code.name,
                    }) + "\\n")
            return SpanExportResult.SUCCESS


    provider = TracerProvider()
    # exported only at the process's flush, never on a timer during the test
    provider.add_span_processor(BatchSpanProcessor(JsonLines(), schedule_delay_millis=600_000))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("traced_app")


    @limitd.job(name="traced.Signup", queue="traced")
    def signup(user):
        with tracer.start_as_current_span("send welcome mail"):
            welcome.perform_async(user)


    @limitd.job(name="traced.Welcome", queue="traced")
    async def welcome(user):
        with tracer.start_as_current_span("render mail"):
            pass


    @limitd.job(name="traced.Fails", queue="traced", retry_in=lambda *_: 3600)
    def fails():
        raise RuntimeError("mail server down")
""")

CONFIG = textwrap.dedent("""
    require: [traced_app]
    queues: [traced]
    concurrency: 2
    tracing:
      enabled: true
""")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "traced_app.py").write_text(APP)
    (tmp_path / "traced.yml").write_text(CONFIG)
    return tmp_path


@pytest.fixture
def processes(app_dir: Path, redis_server: RedisServer) -> Iterator[LimitdProcesses]:
    started = LimitdProcesses(app_dir, redis_server.url)
    started.env["TRACED_SPANS"] = str(app_dir / "spans.jsonl")
    yield started
    started.kill_all()


def read_spans(path: Path) -> dict[str, dict[str, Any]]:
    """The spans by name, a run's by its job class (``process traced.Signup``)."""
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        span = json.loads(line)
        name = span["name"]
        if span["kind"] == "CONSUMER":
            name = f"process {span['attributes']['limitd.job.class']}"
        assert name not in found, f"{name} twice"
        found[name] = span
    return found


def test_a_trace_from_a_web_request_into_a_job(
    app_dir: Path, processes: LimitdProcesses, redis: redis_py.Redis
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = limitd.Client(redis, middleware=ClientChain([TracingClient(provider)]))
    worker = processes.start("traced.yml")

    with provider.get_tracer("web").start_as_current_span(
        "POST /signup", kind=trace.SpanKind.SERVER
    ) as request:
        client.push({"class": "traced.Signup", "args": ["ada"], "queue": "traced"})
        client.push({"class": "traced.Fails", "args": [], "queue": "traced"})
    wait_for(lambda: Stats(redis).processed == 3, timeout=60, message="three runs")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0

    spans = read_spans(app_dir / "spans.jsonl")
    [push_signup, push_fails] = exporter.get_finished_spans()[:2]  # then the request's
    trace_id = format(request.get_span_context().trace_id, "032x")
    assert {span["trace_id"] for span in spans.values()} == {trace_id}  # one trace
    run = spans["process traced.Signup"]
    assert run["kind"] == "CONSUMER"
    assert run["parent_id"] == format(push_signup.context.span_id, "016x")
    assert run["attributes"]["limitd.job.class"] == "traced.Signup"
    assert run["attributes"]["limitd.job.outcome"] == "done"
    mail = spans["send welcome mail"]
    assert mail["parent_id"] == run["span_id"]  # the job's own span
    push = spans["send traced"]  # the push the job made, on the process's default client
    assert (push["kind"], push["parent_id"]) == ("PRODUCER", mail["span_id"])
    welcome = spans["process traced.Welcome"]  # async: on the capsule's loop
    assert welcome["parent_id"] == push["span_id"]
    assert spans["render mail"]["parent_id"] == welcome["span_id"]
    failed = spans["process traced.Fails"]
    assert failed["parent_id"] == format(push_fails.context.span_id, "016x")
    assert (failed["status"], failed["attributes"]["limitd.job.outcome"]) == ("ERROR", "retry")


@pytest.mark.skipif(not HAVE_SIDEKIQ, reason="ruby and sidekiq not installed")
def test_a_traced_payload_runs_in_ruby_sidekiq(sidekiq: Any, redis: redis_py.Redis) -> None:
    """Sidekiq keeps the context keys it does not know, and runs the job unchanged."""
    provider = TracerProvider()
    client = limitd.Client(redis, middleware=ClientChain([TracingClient(provider)]))
    with provider.get_tracer("web").start_as_current_span("POST /echo"):
        client.push({"class": "RubyEcho", "queue": "ruby", "args": [1, "two"]})
    wait_for(lambda: redis.llen("ruby_ran") == 1, timeout=30, message="sidekiq to run it")
    assert json.loads(redis.lindex("ruby_ran", 0) or "null") == [1, "two"]


@pytest.mark.skipif(not HAVE_SIDEKIQ, reason="ruby and sidekiq not installed")
def test_a_ruby_push_without_a_context_runs_in_a_trace_of_its_own(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    ruby(ruby_app, 'puts HardJob.perform_async("bob", 5)', redis_server)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    chain = ServerChain([TracingServer(provider)])
    capsule = Capsule(CapsuleConfig(queues=["critical"]), redis=redis, middleware=chain)
    assert capsule.drain() == {"done": 1}
    [run] = exporter.get_finished_spans()
    assert (run.name, run.parent) == ("process critical", None)
    assert (run.attributes or {})["limitd.job.class"] == "HardJob"
