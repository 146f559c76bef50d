"""Poison jobs: payloads the worker cannot handle, and jobs that never complete, end in
the dead set with their reason instead of coming back forever (see
``limitd/fetch/recoveries.py``)."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.fetch import liveness, recoveries
from limitd.middleware import ServerChain
from limitd.payload import Payload, new_jid
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, children, wait_for


def take_one(fetch, done=None, **options):  # type: ignore[no-untyped-def]
    """One job (settling ``done`` in the same call), or None."""
    units = fetch.take(1, [done] if done is not None else [], **options)
    return units[0] if units else None


DEPTH = 100_000
ran: list[str] = []


@limitd.job(name="poison_test.Note")
def note(tag: str) -> None:
    ran.append(tag)


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


def deep_array(depth: int = DEPTH) -> str:
    return "[" * depth + "]" * depth


def dead_entries(redis: redis_py.Redis) -> list[Payload]:
    return [json.loads(entry) for entry in redis.zrange(keys.of(redis).DEAD, 0, -1)]


def counts_key(redis: redis_py.Redis) -> str:
    """The recovery counts of the jobs of "default" (in ``redis``'s layout)."""
    return keys.of(redis).recoveries_of("default")


def push_raw(redis: redis_py.Redis, body: str, queue: str = "default") -> None:
    redis.sadd(keys.of(redis).QUEUES, queue)
    redis.lpush(keys.of(redis).queue(queue), body)


@pytest.fixture(params=["limit", "basic"])
def capsule(request: pytest.FixtureRequest, redis: redis_py.Redis) -> Iterator[Capsule]:
    started = Capsule(CapsuleConfig(concurrency=2, fetch=request.param), redis=redis)
    started.start()
    yield started
    started.stop(timeout=2)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(deep_array(), id="whole-payload"),
        pytest.param(
            f'{{"class":"poison_test.Note","args":{deep_array()},"jid":"{"a" * 24}"}}',
            id="inside-args",
        ),
    ],
)
def test_a_payload_nested_too_deep_is_dead_at_once_and_work_goes_on(
    capsule: Capsule, redis: redis_py.Redis, body: str
) -> None:
    push_raw(redis, body)
    wait_for(
        lambda: redis.zcard(keys.of(redis).DEAD) == 1, timeout=5, message="the payload in dead"
    )
    [entry] = dead_entries(redis)
    assert entry["error_class"] == "limitd.MalformedPayload"
    assert "RecursionError" in entry["error_message"]
    assert entry["raw"] == body, "the raw text is kept for the operator"
    assert not redis.exists(counts_key(redis)), "buried at the first fetch, never requeued"
    assert redis.llen(keys.of(redis).queue("default")) == 0
    note.perform_async("after")
    wait_for(lambda: ran == ["after"], message="the capsule to run the next job")


def test_nan_in_a_payload_is_malformed_rather_than_unwritable(
    capsule: Capsule, redis: redis_py.Redis
) -> None:
    """Python's decoder accepts NaN, but a payload holding it could never be written back
    for a retry: it is refused like any other undecodable payload."""
    push_raw(redis, '{"class":"poison_test.Note","args":[NaN],"jid":"%s"}' % ("b" * 24))
    wait_for(lambda: redis.zcard(keys.of(redis).DEAD) == 1, message="the payload in dead")
    [entry] = dead_entries(redis)
    assert "NaN" in entry["error_message"]
    assert ran == []


class BrokenBookkeeping:
    """A server middleware whose bookkeeping always fails: the job runs but its outcome
    can never be recorded, so the processor gives it back."""

    def __call__(self, spec: Any, payload: Payload, queue: str, call_next: Any) -> Any:
        return call_next()

    def settled(self, spec: Any, payload: Payload, queue: str, outcome: str, error: Any) -> None:
        raise RuntimeError("bookkeeping is broken")


@pytest.mark.parametrize("fetch", ["limit", "basic"])
def test_a_job_whose_outcome_cannot_be_recorded_is_dead_after_max_recoveries(
    redis: redis_py.Redis, fetch: str
) -> None:
    deaths: list[tuple[Payload, BaseException]] = []
    config = CapsuleConfig(
        concurrency=1,
        fetch=fetch,
        max_recoveries=2,
        death_handlers=[lambda payload, exc: deaths.append((payload, exc))],
    )
    capsule = Capsule(config, redis=redis, middleware=ServerChain([BrokenBookkeeping()]))
    capsule.start()
    try:
        jid = note.perform_async("loop")
        wait_for(lambda: redis.zcard(keys.of(redis).DEAD) == 1, message="the job in dead")
        wait_for(lambda: len(deaths) == 1, message="the death handler")
    finally:
        capsule.stop(timeout=2)
    assert ran == ["loop", "loop"], "run once, given back twice, then buried unrun"
    [entry] = dead_entries(redis)
    assert entry["jid"] == jid
    assert entry["error_class"] == "limitd.RecoveredTooOften"
    assert entry["error_message"] == (
        "recovered 2 times without completing: RuntimeError: bookkeeping is broken"
    )
    payload, exc = deaths[0]
    assert payload["jid"] == jid
    assert "recovered 2 times" in str(exc)
    assert redis.llen(keys.of(redis).queue("default")) == 0
    assert not redis.hgetall(counts_key(redis)), "counts of a buried job are forgotten"


def test_a_recovered_job_that_completes_forgets_its_count(redis: redis_py.Redis) -> None:
    """One crash is not a poison pill: the job runs again, and once it completes its
    count is gone."""
    capsule_id = "crashed"
    redis.sadd(keys.of(redis).CAPSULES, capsule_id)
    redis.sadd(keys.of(redis).capsule_queues(capsule_id, "default"), "default")
    job = json.dumps({"class": "poison_test.Note", "args": ["again"], "jid": new_jid()})
    redis.lpush(keys.of(redis).in_progress(capsule_id, "default"), job)
    redis.hset(keys.of(redis).busy_of("default"), "default", 1)
    assert liveness.reap(redis, capsule_id, "capsule crashed running it") == 1
    field = recoveries.job_id(job.encode())
    assert redis.hget(counts_key(redis), field) == b"1"
    assert redis.hget(counts_key(redis), field + ":error") == b"capsule crashed running it"
    assert redis.ttl(counts_key(redis)) > 0, "counts of jobs deleted while queued expire"
    Capsule(CapsuleConfig(), redis=redis).drain()
    assert ran == ["again"]
    assert not redis.exists(counts_key(redis))


def test_the_limit_fetch_reports_each_jobs_recoveries(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(), redis=redis)
    jobs = [json.dumps({"class": "poison_test.Note", "args": [n], "jid": new_jid()}) for n in "ab"]
    for job in jobs:
        redis.lpush(keys.of(redis).queue("default"), job)
    redis.hset(counts_key(redis), recoveries.job_id(jobs[1].encode()), 2)
    taken = take_one(capsule.fetch), take_one(capsule.fetch)
    assert [(unit.job.decode(), unit.recoveries) for unit in taken if unit] == [
        (jobs[0], 0),
        (jobs[1], 2),
    ]


def test_give_back_requeues_once_even_racing_the_reaper(redis: redis_py.Redis) -> None:
    """A processor giving a job back and a reaper returning the same capsule's jobs
    count and requeue it once between them."""
    capsule = Capsule(CapsuleConfig(), redis=redis)
    note.perform_async("x")
    unit = take_one(capsule.fetch)
    assert unit is not None
    redis.delete(keys.of(redis).capsule_heartbeat(capsule.id))
    assert liveness.reap(redis, capsule.id, "reaped") == 1
    capsule.fetch.requeue(unit, reason="too late")
    assert redis.llen(keys.of(redis).queue("default")) == 1
    assert redis.hget(counts_key(redis), recoveries.job_id(unit.job)) == b"1"
    assert int(redis.hget(keys.of(redis).busy_of("default"), "default") or 0) == 0


def test_mark_recovered_keeps_undecodable_bytes() -> None:
    assert recoveries.mark_recovered(b"\xff not json", "why") == b"\xff not json"
    marked = json.loads(recoveries.mark_recovered(b'{"class":"X","args":[]}', "why"))
    assert (marked["recoveries"], marked["recovery_error"]) == (1, "why")
    again = json.loads(recoveries.mark_recovered(json.dumps(marked).encode(), "later"))
    assert (again["recoveries"], again["recovery_error"]) == (2, "later")


APP = textwrap.dedent("""
    import os, signal, limitd

    @limitd.job(name="poison_app.Suicide")
    def suicide():
        os.kill(os.getpid(), signal.SIGKILL)

    @limitd.job(name="poison_app.Mark")
    def mark(tag):
        limitd.default_client().redis.rpush("poison_test:marks", tag)
""")

CONFIG = textwrap.dedent("""
    require: [poison_app]
    heartbeat_period: 0.5
    max_recoveries: 3
    queues: [default]
    concurrency: 2
""")


@pytest.fixture
def app_dir(tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis) -> Iterator[Path]:
    (tmp_path / "poison_app.py").write_text(APP)
    (tmp_path / "poison.yml").write_text(CONFIG)
    yield tmp_path


@pytest.mark.standalone_only("limitd start on the session's server")
def test_a_job_that_kills_its_process_is_dead_after_max_recoveries(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    processes = LimitdProcesses(app_dir, redis_server.url)
    processes.env["PYTHONPATH"] = f"{app_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    supervisor = processes.start("poison.yml")
    try:
        wait_for(lambda: redis.scard(keys.of(redis).CAPSULES) == 1, timeout=20, message="a capsule")
        first_child = children(supervisor.pid)
        jid = limitd.Client(redis).push({"class": "poison_app.Suicide", "args": []})
        wait_for(
            lambda: redis.zcard(keys.of(redis).DEAD) == 1, timeout=30, message="the job in dead"
        )
        [entry] = dead_entries(redis)
        assert entry["jid"] == jid
        assert entry["error_message"].startswith("recovered 3 times without completing: ")
        assert "SIGKILL" in entry["error_message"]
        # The supervisor kept a capsule alive throughout: a new child runs the next job.
        limitd.Client(redis).push({"class": "poison_app.Mark", "args": ["after"]})
        wait_for(
            lambda: redis.lrange("poison_test:marks", 0, -1) == [b"after"],
            timeout=20,
            message="the next job to run",
        )
        assert children(supervisor.pid) != first_child, "the killed child was replaced"
        assert supervisor.poll() is None
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=15)
        processes.kill_all()


def test_max_recoveries_is_read_and_checked(tmp_path: Path) -> None:
    from limitd.config import ConfigError, load_config

    good = tmp_path / "good.yml"
    good.write_text(
        "max_recoveries: 5\nqueues: [default]\ncapsules:\n  a: {queues: [a], max_recoveries: 1}\n"
    )
    config = load_config([good])
    assert [spec.config.max_recoveries for spec in config.capsules] == [5, 1]
    bad = tmp_path / "bad.yml"
    bad.write_text("max_recoveries: 0\n")
    with pytest.raises(ConfigError, match=r"bad\.yml: max_recoveries: expected an integer >= 1"):
        load_config([bad])


def test_the_deep_payload_in_a_thread_does_not_take_the_capsule_down(
    redis: redis_py.Redis,
) -> None:
    """Drain mode (one thread, no fetch loop) handles it the same way."""
    push_raw(redis, deep_array())
    note.perform_async("next")
    Capsule(CapsuleConfig(), redis=redis).drain()
    assert ran == ["next"]
    assert redis.zcard(keys.of(redis).DEAD) == 1
