"""Poison jobs under ``limitd start``, with real SIGKILLs: the job that takes its process
down reaches the dead set after ``max_recoveries`` crashes, and the jobs that happened to
run beside it, or in a process killed from outside, never do (see
``limitd/fetch/recoveries.py``). What ran is measured from what the jobs recorded."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, children, wait_for

pytestmark = pytest.mark.standalone_only("limitd start on the session's server")

APP = textwrap.dedent("""
    import os, signal, time, limitd

    def _redis():
        return limitd.default_client().redis

    @limitd.job(name="suspects_app.Poison")
    def poison():
        _redis().rpush("t:poison_starts", os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)

    @limitd.job(name="suspects_app.Work")
    def work(tag, seconds):
        _redis().rpush("t:started", tag)
        time.sleep(seconds)
        _redis().sadd("t:done", tag)
""")


def config(processes: int, threads: int) -> str:
    return textwrap.dedent(f"""
        require: [suspects_app]
        heartbeat_period: 0.5
        max_recoveries: 3
        queues: [default]
        processes: {processes}
        concurrency: {threads}
    """)


@pytest.fixture
def workers(tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis) -> Iterator:
    """Starts ``limitd start`` with N processes x M threads on the app above."""
    (tmp_path / "suspects_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    started = []

    def start(count: int, threads: int):
        (tmp_path / "suspects.yml").write_text(config(count, threads))
        supervisor = processes.start("suspects.yml")
        started.append(supervisor)
        wait_for(
            lambda: redis.scard(keys.of(redis).CAPSULES) == count, timeout=30, message="capsules"
        )
        return supervisor

    yield start
    for supervisor in started:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=30)
    processes.kill_all()


def push_work(redis: redis_py.Redis, tags: list[str], seconds: float) -> None:
    limitd.Client(redis).push_bulk({"class": "suspects_app.Work"}, [[tag, seconds] for tag in tags])


def push_poison(redis: redis_py.Redis) -> str:
    return limitd.Client(redis).push({"class": "suspects_app.Poison", "args": []})


def dead(redis: redis_py.Redis) -> list[dict]:
    return [json.loads(raw) for raw in redis.zrange(keys.of(redis).DEAD, 0, -1)]


def assert_only_the_poison_is_dead(redis: redis_py.Redis, jid: str) -> None:
    [entry] = dead(redis)
    assert entry["jid"] == jid, f"an innocent job was buried: {entry}"
    assert entry["error_class"] == "limitd.RecoveredTooOften"
    assert entry["error_message"].startswith("recovered 3 times without completing: ")
    assert "SIGKILL" in entry["error_message"]
    assert redis.llen("t:poison_starts") == 3, "three crashes, then buried unrun"


def test_a_long_job_started_before_a_poison_job_is_not_buried_with_it(
    workers, redis: redis_py.Redis
) -> None:
    """1 process x 4 threads: the long job runs when the poison job first kills the
    process; it runs again, completes, and only the poison job goes to the dead set."""
    workers(1, 4)
    push_work(redis, ["long"], 3.0)
    wait_for(lambda: redis.lrange("t:started", 0, -1) == [b"long"], message="the long job")
    jid = push_poison(redis)
    wait_for(lambda: redis.zcard(keys.of(redis).DEAD) == 1, timeout=60, message="a job in dead")
    wait_for(lambda: redis.sismember("t:done", "long"), timeout=30, message="the long job")
    assert_only_the_poison_is_dead(redis, jid)
    assert redis.lrange("t:started", 0, -1) == [b"long", b"long"], "interrupted once, then done"


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((2, 5, 200, 0.3), id="200 slow jobs, 2x5"),
        pytest.param((2, 10, 1_000, 0.005), id="1000 short jobs, 2x10"),
    ],
)
def test_a_poison_job_among_many_goes_to_the_dead_set_alone(
    workers, redis: redis_py.Redis, shape: tuple[int, int, int, float]
) -> None:
    """(processes, threads, ordinary jobs, seconds each): the poison job is pushed once
    a fifth of them are under way, the rest after it."""
    processes, threads, count, seconds = shape
    workers(processes, threads)
    tags = [str(n) for n in range(count)]
    push_work(redis, tags[: count // 5], seconds)
    wait_for(lambda: redis.llen("t:started") >= threads, message="work under way")
    jid = push_poison(redis)
    push_work(redis, tags[count // 5 :], seconds)
    wait_for(lambda: redis.scard("t:done") == count, timeout=120, message="every job done")
    wait_for(
        lambda: redis.zcard(keys.of(redis).DEAD) >= 1, timeout=60, message="the poison in dead"
    )
    assert_only_the_poison_is_dead(redis, jid)
    assert redis.llen(keys.of(redis).queue("default")) == 0


def test_processes_killed_from_outside_bury_no_job(workers, redis: redis_py.Redis) -> None:
    """10 SIGKILLs of capsule children half a second apart while 5,000 short jobs run
    (at least 7.5 s of work for 20 threads): every job runs, none is buried (no job
    killed anything)."""
    supervisor = workers(2, 10)
    tags = [str(n) for n in range(5_000)]
    push_work(redis, tags, 0.03)
    kills = 0
    while kills < 10 and redis.scard("t:done") < len(tags):
        live = children(supervisor.pid)
        if live:
            os.kill(live[kills % len(live)], signal.SIGKILL)
            kills += 1
        time.sleep(0.5)  # the pace of the outside killer, not a wait for a result
    wait_for(lambda: redis.scard("t:done") == len(tags), timeout=120, message="every job")
    assert kills == 10, "the work outran the killer: the test proved nothing"
    assert dead(redis) == []
    assert supervisor.poll() is None
