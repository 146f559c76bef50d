"""Time limits under ``limitd start``: real capsule processes, real threads and signals.

A sync job looping in Python past its limit and an async job awaiting past its limit
fail with ``TimeLimitExceeded`` and go to the retry set; a job under its limit is
untouched; a job stuck in a C call (``time.sleep``, which the thread's async exception
cannot interrupt) is warned about, its process is recycled after the grace, it comes
back and fails unrun into the retry set, and the job beside it completes."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, children, wait_for

pytestmark = pytest.mark.standalone_only("limitd start on the session's server")

APP = textwrap.dedent("""
    import asyncio, time, limitd

    def _redis():
        return limitd.default_client().redis

    @limitd.job(name="tl_app.Spin")  # the config's default limit: 1s
    def spin(tag):
        _redis().rpush("t:started", tag)
        while True:
            time.sleep(0.02)  # Python between short C calls: interruptible

    @limitd.job(name="tl_app.Quick", time_limit=20)
    def quick(tag):
        _redis().rpush("t:started", tag)
        time.sleep(0.2)
        _redis().sadd("t:done", tag)

    @limitd.job(name="tl_app.Forever", time_limit=1)
    async def forever(tag):
        _redis().rpush("t:started", tag)
        await asyncio.sleep(600)

    @limitd.job(name="tl_app.Stuck", time_limit=1)
    def stuck(tag):
        _redis().rpush("t:started", tag)
        time.sleep(600)  # one C call: the async exception waits for it to return

    @limitd.job(name="tl_app.Work", time_limit=60)
    def work(tag, seconds):
        _redis().rpush("t:started", tag)
        time.sleep(seconds)
        _redis().sadd("t:done", tag)
""")

CONFIG = textwrap.dedent("""
    require: [tl_app]
    heartbeat_period: 0.5
    timeout: 2
    queues: [default]
    processes: 1
    concurrency: 3
    time_limits:
      default: 1
      grace: 3
""")


@pytest.fixture
def workers(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[Callable[[], object]]:
    (tmp_path / "tl_app.py").write_text(APP)
    (tmp_path / "tl.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    started = []

    def start() -> object:
        supervisor = processes.start("tl.yml")
        started.append(supervisor)
        wait_for(lambda: redis.scard(keys.of(redis).CAPSULES) == 1, timeout=30, message="capsule")
        return supervisor

    yield start
    for supervisor in started:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(timeout=30)
    processes.kill_all()


def push(redis: redis_py.Redis, job_class: str, *args: object) -> str:
    return limitd.Client(redis).push({"class": f"tl_app.{job_class}", "args": list(args)})


def retries(redis: redis_py.Redis) -> dict[str, dict]:
    entries = (json.loads(raw) for raw in redis.zrange(keys.of(redis).RETRY, 0, -1))
    return {entry["jid"]: entry for entry in entries}


def started(redis: redis_py.Redis) -> list[str]:
    return [tag.decode() for tag in redis.lrange("t:started", 0, -1)]


def test_jobs_past_their_limit_fail_into_the_retry_set(workers, redis: redis_py.Redis) -> None:
    workers()
    spin = push(redis, "Spin", "spin")
    forever = push(redis, "Forever", "forever")
    quick = push(redis, "Quick", "quick")
    wait_for(lambda: len(retries(redis)) == 2, timeout=30, message="two jobs in retry")
    wait_for(lambda: redis.sismember("t:done", "quick"), timeout=30, message="the quick job")
    found = retries(redis)
    assert set(found) == {spin, forever}, f"the quick job {quick} was cut short"
    for jid, limit in ((spin, 1), (forever, 1)):
        assert found[jid]["error_class"] == "limitd.TimeLimitExceeded"
        assert found[jid]["error_message"] == f"ran past its time limit of {limit}s"
        assert found[jid]["retry_count"] == 0
    assert sorted(started(redis)) == ["forever", "quick", "spin"]


def test_a_job_stuck_in_c_recycles_its_process_and_fails_unrun(
    workers, redis: redis_py.Redis, tmp_path: Path
) -> None:
    supervisor = workers()
    [first] = children(supervisor.pid)
    beside = push(redis, "Work", "beside", 4)
    wait_for(lambda: started(redis) == ["beside"], timeout=30, message="the job beside")
    stuck = push(redis, "Stuck", "stuck")
    wait_for(lambda: stuck in retries(redis), timeout=60, message="the stuck job in retry")
    entry = retries(redis)[stuck]
    assert entry["error_class"] == "limitd.TimeLimitExceeded"
    assert "stuck in C code" in entry["error_message"]
    wait_for(lambda: redis.sismember("t:done", "beside"), timeout=30, message="the job beside")
    assert beside not in retries(redis)
    assert started(redis).count("stuck") == 1, "the stuck job must not run again"
    now = children(supervisor.pid)
    assert now and first not in now, "the process was recycled"
    log = (tmp_path / "limitd.log").read_text()
    assert "still runs past its time limit of 1s: blocked in C code" in log
    assert "recycling this process" in log
    assert redis.zcard(keys.of(redis).DEAD) == 0
