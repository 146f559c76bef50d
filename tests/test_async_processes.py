"""Async jobs across real processes: ``limitd start`` with a YAML config forks capsule
children whose event loops run the jobs. The jobs measure themselves in Redis (how many
run at once, by an atomic script; which finished): a global limit holds on the loops of
two processes, a SIGKILLed child loses no job, and a TERM past the timeout requeues the
jobs still on the loop."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.queues import limits as queue_limits
from tests.helpers import LimitdProcesses, children, in_progress_total, wait_for

APP = textwrap.dedent('''
    import asyncio, os
    import limitd
    from limitd.client import default_client

    # Counts the job in (overall and in this process) and keeps the peak, atomically.
    ENTER = """
    local n = redis.call('INCR', KEYS[1])
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
    redis.call('INCR', KEYS[3])
    return n
    """

    @limitd.job(name="async_app.Metered", queue="q")
    async def metered(n, hold):
        redis = default_client().redis
        mine = f"a:running:{os.getpid()}"
        redis.eval(ENTER, 3, "a:running", "a:peak", mine)
        await asyncio.sleep(hold)
        pipe = redis.pipeline()
        pipe.decr("a:running")
        pipe.decr(mine)
        pipe.sadd("a:done", n)
        pipe.rpush("a:runs", n)
        pipe.execute()

    @limitd.job(name="async_app.Collector", queue="q")
    async def collector(n):
        import gc
        default_client().redis.hset(
            "a:gc", mapping={"young": gc.get_threshold()[0], "frozen": gc.get_freeze_count()}
        )

    @limitd.job(name="async_app.Forever", queue="q")
    async def forever(n):
        redis = default_client().redis
        redis.sadd("a:started", n)
        try:
            await asyncio.Event().wait()  # past any stop timeout
        except asyncio.CancelledError:
            redis.sadd("a:cancelled", n)
            raise
''')

LIMITED = """
    require: [async_app]
    heartbeat_period: 0.5
    timeout: 2
    queues: [q]
    processes: 2
    concurrency: 5
    async_concurrency: 50
    limits: {q: 3}
"""

UNLIMITED = """
    require: [async_app]
    heartbeat_period: 0.5
    timeout: 1
    queues: [q]
    processes: 2
    concurrency: 2
    async_concurrency: 20
"""


@pytest.fixture
def processes(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[LimitdProcesses]:
    (tmp_path / "async_app.py").write_text(APP)
    (tmp_path / "limited.yml").write_text(textwrap.dedent(LIMITED))
    (tmp_path / "unlimited.yml").write_text(textwrap.dedent(UNLIMITED))
    started = LimitdProcesses(tmp_path, redis_server.url)
    started.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    yield started
    started.kill_all()


def wait_capsules(redis: redis_py.Redis, count: int) -> None:
    wait_for(
        lambda: redis.scard(keys.of(redis).CAPSULES) == count,
        timeout=20,
        message=f"{count} capsules",
    )


def push(redis: redis_py.Redis, job: str, args: list[list[object]]) -> None:
    """Pushed by the name the app defines (this process does not import the app)."""
    limitd.Client(redis).push_bulk({"class": job, "queue": "q"}, args)


def done(redis: redis_py.Redis) -> set[int]:
    return {int(n) for n in redis.smembers("a:done")}


def running_in(redis: redis_py.Redis, pid: int) -> int:
    return int(redis.get(f"a:running:{pid}") or 0)


def test_a_global_limit_holds_on_the_loops_of_two_processes(
    processes: LimitdProcesses, redis: redis_py.Redis
) -> None:
    supervisor = processes.start("limited.yml")
    wait_capsules(redis, 2)
    push(redis, "async_app.Metered", [[n, 0.05] for n in range(60)])
    wait_for(lambda: len(done(redis)) == 60, timeout=30, message="all sixty jobs")
    assert redis.get("a:peak") == b"3", "three at once, never more"
    assert redis.llen("a:runs") == 60, "each ran once"
    wait_for(lambda: queue_limits.busy(redis, "q") == 0, message="the slots freed")
    wait_for(lambda: in_progress_total(redis) == 0, message="every job settled")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0


def test_a_capsule_freezes_what_it_started_with_and_collects_the_young_less_often(
    processes: LimitdProcesses, redis: redis_py.Redis
) -> None:
    supervisor = processes.start("unlimited.yml")
    wait_capsules(redis, 2)
    push(redis, "async_app.Collector", [[1]])
    wait_for(lambda: redis.exists("a:gc"), timeout=20, message="the job's report")
    report = {k.decode(): int(v) for k, v in redis.hgetall("a:gc").items()}
    assert report["young"] == 10_000
    assert report["frozen"] > 1000  # the app, limitd and the capsule, out of the collector's sight
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0


def test_sigkill_of_a_child_with_async_jobs_in_flight_loses_none(
    processes: LimitdProcesses, redis: redis_py.Redis
) -> None:
    supervisor = processes.start("unlimited.yml")
    wait_capsules(redis, 2)
    total = 300
    push(redis, "async_app.Metered", [[n, 0.2] for n in range(total)])
    wait_for(lambda: len(done(redis)) >= 40, timeout=30, message="work in progress")
    pids = children(supervisor.pid)
    wait_for(lambda: any(running_in(redis, p) for p in pids), message="jobs on a loop")
    victim = next(p for p in pids if running_in(redis, p) > 0)
    os.kill(victim, signal.SIGKILL)
    assert running_in(redis, victim) > 0, "it died with async jobs in flight"
    assert len(done(redis)) < total, "killed before the backlog was done"
    wait_for(lambda: done(redis) == set(range(total)), timeout=60, message="every job")
    assert redis.llen("a:runs") >= total  # at least once: the victim's jobs ran again
    wait_for(lambda: in_progress_total(redis) == 0, message="nothing left in progress")
    wait_capsules(redis, 2)  # the child was restarted, the dead capsule reaped
    assert victim not in children(supervisor.pid)
    assert redis.llen(keys.of(redis).queue("q")) == 0
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0


def test_term_past_the_timeout_requeues_the_async_jobs(
    processes: LimitdProcesses, redis: redis_py.Redis
) -> None:
    supervisor = processes.start("unlimited.yml")
    wait_capsules(redis, 2)
    push(redis, "async_app.Forever", [[n] for n in range(6)])
    wait_for(lambda: redis.scard("a:started") == 6, timeout=15, message="six jobs on loops")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=20) == 0
    assert redis.llen(keys.of(redis).queue("q")) == 6, "every job back in its queue"
    assert in_progress_total(redis) == 0
    assert redis.zcard(keys.of(redis).RETRY) == redis.zcard(keys.of(redis).DEAD) == 0
    assert redis.scard("a:cancelled") == 6, "their tasks were cancelled"
    assert redis.scard(keys.of(redis).CAPSULES) == 0
