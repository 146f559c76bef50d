"""What app code declares with ``limitd.configure_server`` / ``configure_client``, in
one process on real Redis: error handlers hear every failed attempt (retried, dead, of
an async job on the capsule's loop) with the job's context, a raising handler is
logged and harms nothing, death handlers hear deaths, the app's middleware wrap the
features' on both sides (a plain sync one runs async jobs on a thread without a
warning), lifecycle hooks run in order, and a declaration made twice counts once."""

from __future__ import annotations

import importlib.util
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd import app_hooks
from limitd.middleware.base import ServerMiddleware
from limitd.middleware.chain import ServerChain
from limitd.payload import Payload
from limitd.retry import Failure
from limitd.spec import JobSpec
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for

QUEUE = "app_hooks"
attempts: dict[str, int] = {}
seen_async = threading.Event()


def quick_retry(count: int, exc: BaseException, payload: Payload) -> float:
    return 0.01


@limitd.job(name="app_hooks.FailsTwice", queue=QUEUE, retry_in=quick_retry)
def fails_twice(key: str) -> None:
    attempts[key] = attempts.get(key, 0) + 1
    if attempts[key] <= 2:
        raise ValueError(f"attempt {attempts[key]}")


@limitd.job(name="app_hooks.Doomed", queue=QUEUE, retry=1, retry_in=quick_retry)
def doomed(secret: str) -> None:
    raise RuntimeError("always")


@limitd.job(name="app_hooks.AsyncFails", queue=QUEUE, retry=0)
async def async_fails() -> None:
    raise KeyError("async")


@limitd.job(name="app_hooks.AsyncOk", queue=QUEUE)
async def async_ok() -> None:
    seen_async.set()


@pytest.fixture(autouse=True)
def declarations() -> Iterator[None]:
    """Declarations are per process: each test starts and ends with none."""
    app_hooks.clear()
    attempts.clear()
    seen_async.clear()
    yield
    app_hooks.clear()


class Recorder:
    """An error handler, a death handler and lifecycle hooks that write down calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.failures: list[tuple[BaseException, Failure]] = []
        self.deaths: list[tuple[Payload, BaseException]] = []
        self.events: list[str] = []

    def error(self, exc: BaseException, failure: Failure) -> None:
        with self.lock:
            self.failures.append((exc, failure))

    def death(self, payload: Payload, exc: BaseException) -> None:
        with self.lock:
            self.deaths.append((payload, exc))

    def hook(self, name: str) -> app_hooks.LifecycleHook:
        return lambda: self.events.append(name)


def capsule(redis: redis_py.Redis, **settings: Any) -> Capsule:
    config = CapsuleConfig(queues=[QUEUE], poll_range=(0.05, 0.1), **settings)
    return Capsule(config, redis=redis)


def drain_until(box: Capsule, condition: Any) -> None:
    """Run due retries in this thread until ``condition`` (their delay is 10 ms)."""

    def step() -> bool:
        box.drain(scheduled=True)
        return bool(condition())

    wait_for(step, message="the retries to run")


def test_error_handlers_hear_every_failure_with_the_jobs_context(
    redis: redis_py.Redis,
) -> None:
    recorder = Recorder()

    @limitd.configure_server
    def reporting(config: limitd.ServerConfig) -> None:
        config.error_handlers.append(recorder.error)
        config.death_handlers.append(recorder.death)

    flaky_jid = fails_twice.perform_async("a")
    doomed_jid = doomed.perform_async("s3cret")
    box = capsule(redis)
    drain_until(box, lambda: attempts.get("a") == 3 and len(recorder.deaths) == 1)

    seen = [(f.job_class, f.jid, f.queue, f.retry_count, f.outcome) for _, f in recorder.failures]
    assert sorted(seen) == sorted(
        [
            ("app_hooks.FailsTwice", flaky_jid, QUEUE, 0, "retry"),
            ("app_hooks.FailsTwice", flaky_jid, QUEUE, 1, "retry"),
            ("app_hooks.Doomed", doomed_jid, QUEUE, 0, "retry"),
            ("app_hooks.Doomed", doomed_jid, QUEUE, 1, "dead"),
        ]
    )
    for exc, failure in recorder.failures:
        assert str(exc) in ("attempt 1", "attempt 2", "always")
        assert failure.will_retry == (failure.outcome == "retry")
        assert (failure.retry_at is not None) == failure.will_retry
        assert failure.payload["error_class"] in ("ValueError", "RuntimeError")
    dead = next(f for _, f in recorder.failures if f.outcome == "dead")
    assert dead.args == ["s3cret"]  # the handler may read them...
    assert "args" not in dead.as_dict()  # ...but the summary leaves them out
    assert dead.as_dict(include_args=True)["args"] == ["s3cret"]
    payload, exc = recorder.deaths[0]
    assert payload["jid"] == doomed_jid and str(exc) == "always"
    assert redis.zcard("dead") == 1


def test_a_raising_handler_is_logged_and_harms_nothing(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()

    def broken(exc: BaseException, failure: Failure) -> None:
        raise OSError("the reporting service is down")

    @limitd.configure_server
    def reporting(config: limitd.ServerConfig) -> None:
        config.error_handlers += [broken, recorder.error]

    jid = fails_twice.perform_async("b")
    assert capsule(redis).drain() == {"retry": 1}
    assert [f.jid for _, f in recorder.failures] == [jid]  # the next handler still ran
    assert redis.zcard("retry") == 1  # and the job's retry is recorded
    logged = [r.getMessage() for r in caplog.records if r.exc_info]
    named = f"jid={jid} class=app_hooks.FailsTwice"
    assert any("broken failed" in m and named in m for m in logged)


def test_async_jobs_failures_and_lifecycle_on_a_started_capsule(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    calls: list[str] = []

    def plain_sync(spec: JobSpec, payload: Payload, queue: str, call_next: Any) -> Any:
        calls.append(payload["class"])
        return call_next()

    def broken_hook() -> None:
        raise RuntimeError("hook failed")

    @limitd.configure_server
    def setup(config: limitd.ServerConfig) -> None:
        config.error_handlers.append(recorder.error)
        config.server_middleware.add(plain_sync)
        config.on("startup", recorder.hook("startup 1"))
        config.on("startup", broken_hook)
        config.on("startup", recorder.hook("startup 2"))
        config.on("quiet", recorder.hook("quiet 1"))
        config.on("quiet", recorder.hook("quiet 2"))
        config.on("shutdown", recorder.hook("shutdown 1"))
        config.on("shutdown", recorder.hook("shutdown 2"))

    box = capsule(redis, concurrency=2)
    assert box.lane.size > 0  # the app has async jobs: they run on the capsule's loop
    box.start()
    try:
        assert recorder.events == ["startup 1", "startup 2"]
        jid = async_fails.perform_async()
        async_ok.perform_async()
        wait_for(lambda: recorder.failures and seen_async.is_set(), message="async jobs")
        box.quiet()
    finally:
        box.stop(timeout=5)
    ((exc, failure),) = recorder.failures
    assert isinstance(exc, KeyError) and failure.jid == jid and failure.outcome == "dead"
    assert sorted(calls) == ["app_hooks.AsyncFails", "app_hooks.AsyncOk"]
    assert recorder.events[2:] == ["quiet 2", "quiet 1", "shutdown 2", "shutdown 1"]
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "without acall" in m]
    assert any("startup hook" in m and "broken_hook" in m for m in messages)


class Outer(ServerMiddleware):
    """A typed app middleware: sees each job before the features do."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> None:
        self.log.append(f"typed {payload['class']}")


def test_app_middleware_wrap_the_features_on_both_sides(redis: redis_py.Redis) -> None:
    log: list[str] = []

    def request_id(spec: Any, payload: Payload, redis: Any, call_next: Any) -> Any:
        payload["request_id"] = "req-1"
        return call_next(payload)

    def timing(spec: JobSpec, payload: Payload, queue: str, call_next: Any) -> Any:
        log.append(f"timing {payload.get('request_id')}")
        return call_next()

    @limitd.configure_client
    def client_side(config: limitd.ClientConfig) -> None:
        config.client_middleware.add(request_id)

    @limitd.configure_server
    def server_side(config: limitd.ServerConfig) -> None:
        config.server_middleware.add(timing)
        config.server_middleware.prepend(Outer(log))

    client = limitd.Client(redis)
    assert next(iter(client.middleware)) is request_id  # before the features'
    client.push({"class": "app_hooks.FailsTwice", "args": ["c"], "queue": QUEUE})
    box = capsule(redis)
    entries = list(box.executor.chain)
    assert isinstance(entries[0], Outer) and len(entries) > 2
    box.drain()
    assert log == ["typed app_hooks.FailsTwice", "timing req-1"]


def test_a_declaration_counts_once_however_often_its_module_runs(tmp_path: Path) -> None:
    source = tmp_path / "declares.py"
    source.write_text(
        textwrap.dedent("""
            import limitd
            RUNS = []

            def handler(exc, failure):
                pass

            @limitd.configure_server
            def setup(config):
                RUNS.append(1)
                config.error_handlers.append(handler)
        """)
    )
    modules = []
    for name in ("declares", "app.declares"):  # the same file under two names
        spec = importlib.util.spec_from_file_location(name, source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    assert len(app_hooks.server_config().error_handlers) == 1
    assert app_hooks.server_config() is app_hooks.server_config()  # run once per process
    assert len(modules[0].RUNS) + len(modules[1].RUNS) == 1


def test_misdeclarations_say_what_is_expected() -> None:
    config = limitd.ServerConfig()
    with pytest.raises(ValueError, match=r"unknown event 'stop'.*startup, quiet, shutdown"):
        config.on("stop", lambda: None)  # type: ignore[arg-type]

    @limitd.configure_server
    def broken(config: limitd.ServerConfig) -> None:
        raise LookupError("no DSN")

    with pytest.raises(RuntimeError, match=r"configure_server function .*broken raised: .*DSN"):
        app_hooks.server_config()


def test_a_chain_given_to_a_capsule_is_kept_as_given(redis: redis_py.Redis) -> None:
    """An explicit chain is the caller's choice; the handlers still apply."""
    recorder = Recorder()

    @limitd.configure_server
    def setup(config: limitd.ServerConfig) -> None:
        config.server_middleware.add(lambda *args: pytest.fail("not in this chain"))
        config.error_handlers.append(recorder.error)

    box = Capsule(CapsuleConfig(queues=[QUEUE]), redis=redis, middleware=ServerChain())
    fails_twice.perform_async("d")
    assert box.drain() == {"retry": 1}
    assert len(recorder.failures) == 1
