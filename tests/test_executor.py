"""Running one job: malformed payloads, classes that are not registered, server
middleware, statistics, and the per-job log line."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from pathlib import Path

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd.middleware import ServerChain
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for

ran: list[object] = []


@limitd.job(name="executor_test.Note")
def note(value: object) -> None:
    ran.append(value)


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\x00garbage", "not valid JSON"),
        (b"[1,2,3]", "JSON list"),
        (b'{"args": [1], "jid": "abc"}', "no 'class'"),
        (b'{"class": "executor_test.Note"}', "no 'args' list"),
    ],
)
def test_malformed_payload_goes_to_dead_with_its_reason(
    redis: redis_py.Redis, raw: bytes, reason: str
) -> None:
    redis.lpush("queue:default", raw)
    note.perform_async("after")
    outcomes = Capsule(CapsuleConfig(), redis=redis).drain()
    assert outcomes == {"dead": 1, "done": 1}
    assert ran == ["after"]
    [entry] = [json.loads(m) for m in redis.zrange("dead", 0, -1)]
    assert reason in entry["error_message"]
    assert entry["error_class"] == "limitd.MalformedPayload"
    assert entry["queue"] == "default"


def test_processor_threads_survive_malformed_payloads(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(concurrency=2), redis=redis)
    capsule.start()
    try:
        for bad in (b"nope", b"{}", b"[]"):
            redis.lpush("queue:default", bad)
        note.perform_async("still running")
        wait_for(lambda: ran == ["still running"], message="the good job")
        wait_for(lambda: redis.zcard("dead") == 3, message="three dead entries")
    finally:
        capsule.stop(timeout=2)


def test_payload_naming_a_module_function_runs_and_imports_nothing(
    redis: redis_py.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    evil_module = "limitd_test_never_imported_module"
    client = limitd.Client(redis)
    client.push({"class": "os.system", "args": [f"touch {marker}"]})
    client.push({"class": f"{evil_module}.Thing", "args": []})
    client.push({"class": "builtins.eval", "args": ["__import__('os')"]})
    outcomes = Capsule(CapsuleConfig(), redis=redis).drain()
    assert outcomes == {"retry": 3}
    assert not marker.exists()
    assert evil_module not in sys.modules
    errors = {json.loads(m)["error_class"] for m in redis.zrange("retry", 0, -1)}
    assert errors == {"limitd.supervisor.executor.UnknownJob"}


class Around:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __call__(self, spec, payload, queue, call_next):  # type: ignore[no-untyped-def]
        self.log.append(f"before {spec.name} {queue}")
        result = call_next()
        self.log.append("after")
        return result


class SkipAll:
    def __call__(self, spec, payload, queue, call_next):  # type: ignore[no-untyped-def]
        return None


def test_server_middleware_wraps_perform(redis: redis_py.Redis) -> None:
    log: list[str] = []
    chain = ServerChain([Around(log)])
    note.perform_async(1)
    Capsule(CapsuleConfig(), redis=redis, middleware=chain).drain()
    assert log == ["before executor_test.Note default", "after"]
    assert ran == [1]


def test_server_middleware_can_skip_the_job(redis: redis_py.Redis) -> None:
    note.perform_async(1)
    outcomes = Capsule(CapsuleConfig(), redis=redis, middleware=ServerChain([SkipAll()])).drain()
    assert outcomes == {"done": 1}
    assert ran == []


class OddOnly(Around):
    """Wants only jobs with an odd argument: the others skip it, around perform and at
    settle alike."""

    def concerns(self, payload):  # type: ignore[no-untyped-def]
        return payload["args"][0] % 2 == 1

    def settled(self, spec, payload, queue, outcome, error):  # type: ignore[no-untyped-def]
        self.log.append(f"settled {payload['args'][0]} {outcome}")


def test_a_middleware_sees_only_the_jobs_it_concerns(redis: redis_py.Redis) -> None:
    log: list[str] = []
    chain = ServerChain([OddOnly(log)])
    note.perform_async(2)
    note.perform_async(3)
    Capsule(CapsuleConfig(), redis=redis, middleware=chain).drain()
    assert sorted(ran) == [2, 3]
    assert log == ["before executor_test.Note default", "after", "settled 3 done"]


class AskedOnce(Around):
    """Counts how often it is asked whether it wants a job, and would say no after the
    first time: a middleware that saw the job start must still be told how it ended."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.asked = 0

    def concerns(self, payload):  # type: ignore[no-untyped-def]
        self.asked += 1
        return self.asked == 1

    def settled(self, spec, payload, queue, outcome, error):  # type: ignore[no-untyped-def]
        self.log.append(f"settled {outcome}")


def test_a_middleware_is_asked_once_per_job_and_told_how_the_job_it_saw_ended(
    redis: redis_py.Redis,
) -> None:
    log: list[str] = []
    middleware = AskedOnce(log)
    note.perform_async(1)
    Capsule(CapsuleConfig(), redis=redis, middleware=ServerChain([middleware])).drain()
    assert middleware.asked == 1
    assert log == ["before executor_test.Note default", "after", "settled done"]


def test_a_chain_changed_after_use_is_followed(redis: redis_py.Redis) -> None:
    log: list[str] = []
    chain = ServerChain()
    note.perform_async(1)
    Capsule(CapsuleConfig(), redis=redis, middleware=chain).drain()
    chain.add(Around(log))
    note.perform_async(2)
    Capsule(CapsuleConfig(), redis=redis, middleware=chain).drain()
    assert log == ["before executor_test.Note default", "after"]


@freeze_time("2026-11-21 08:00:00")
def test_stats_counters_and_daily_keys(redis: redis_py.Redis) -> None:
    note.perform_async(1)
    note.perform_async(2)
    limitd.Client(redis).push({"class": "executor_test.Missing", "args": []})
    Capsule(CapsuleConfig(), redis=redis).drain()
    assert redis.mget("stat:processed", "stat:failed") == [b"3", b"1"]
    day = dt.date(2026, 11, 21).isoformat()
    assert redis.mget(f"stat:processed:{day}", f"stat:failed:{day}") == [b"3", b"1"]


def test_one_log_line_per_job(redis: redis_py.Redis, caplog: pytest.LogCaptureFixture) -> None:
    jid = note.perform_async(1)
    Capsule(CapsuleConfig(), redis=redis).drain()
    lines = [r.getMessage() for r in caplog.records if r.name == "limitd.job"]
    assert len(lines) == 1
    assert lines[0].startswith(f"done jid={jid} class=executor_test.Note queue=default elapsed=")


@limitd.job(name="executor_test.Exits", retry=0)
def exits() -> None:
    sys.exit(3)


def test_a_job_calling_sys_exit_fails_like_any_error(redis: redis_py.Redis) -> None:
    exits.perform_async()
    assert Capsule(CapsuleConfig(), redis=redis).drain() == {"dead": 1}
    assert json.loads(redis.zrange("dead", 0, 0)[0])["error_class"] == "SystemExit"


def test_failures_are_logged_with_jid_and_class(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    jid = exits.perform_async()
    Capsule(CapsuleConfig(), redis=redis).drain()
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"jid={jid} class=executor_test.Exits" in failures[0].getMessage()
