"""Limiters across real processes: ``limitd start`` with 2 capsule processes x 10
threads sharing one concurrent limiter, and a holder killed inside its block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

JOBS = 200

APP = textwrap.dedent("""
    import random, time, limitd

    X = limitd.Limiter.concurrent("x", 3, lock_timeout=30, wait_timeout=0.005)
    # Holders now, and the most seen at once, kept in Redis by one atomic step.
    ENTER = (
        "local n = redis.call('INCR', KEYS[1]) "
        "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end "
        "return n"
    )

    @limitd.job(
        name="limiters_app.Hold",
        max_overlimit=100000,
        limiter_backoff=lambda count, exc, payload: 0.02 + random.random() * 0.05,
    )
    def hold(n):
        redis = limitd.default_client().redis
        with X.within_limit():
            redis.eval(ENTER, 2, "limiters_test:holders", "limiters_test:max")
            time.sleep(0.02)
            redis.decr("limiters_test:holders")
        redis.hincrby("limiters_test:runs", str(n), 1)
""")

CONFIG = textwrap.dedent("""
    require: [limiters_app]
    heartbeat_period: 0.5
    queues: [default]
    concurrency: 10
    processes: 2
""")


def test_a_concurrent_limiter_holds_across_processes_and_every_job_runs_once(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "limiters_app.py").write_text(APP)
    (tmp_path / "limiters.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    supervisor = processes.start("limiters.yml")
    try:
        wait_for(
            lambda: redis.scard(keys.of(redis).CAPSULES) == 2, timeout=30, message="two capsules"
        )
        client = limitd.Client(redis)
        client.push_bulk({"class": "limiters_app.Hold"}, [[n] for n in range(JOBS)])
        wait_for(
            lambda: redis.hlen("limiters_test:runs") == JOBS,
            timeout=120,
            message=f"all {JOBS} jobs to run",
        )
        runs = redis.hgetall("limiters_test:runs")
        assert set(runs.values()) == {b"1"}, "every job ran its block exactly once"
        assert redis.get("limiters_test:max") == b"3", "never more than 3 holders, and 3 reached"
        [status] = limitd.api.limiters(redis)
        assert status.over_limit > 0, "some jobs were turned away and rescheduled"
        assert status.immediate + status.waited == JOBS
        assert redis.zcard(keys.of(redis).RETRY) == 0 and redis.zcard(keys.of(redis).DEAD) == 0
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)
        processes.kill_all()


KILLED_HOLDER = textwrap.dedent("""
    import os, signal, sys, limitd
    limitd.configure(url=sys.argv[1])
    with limitd.Limiter.concurrent("k", 1, lock_timeout=2).within_limit():
        print("holding", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_holder_killed_inside_its_block_frees_its_slot_after_lock_timeout(
    redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_HOLDER, redis_server.url],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL and killed.stdout == "holding\n"
    limiter = limitd.Limiter.concurrent("k", 1, lock_timeout=2, wait_timeout=0)
    assert redis.zcard(keys.of(redis).limiter("holders", "k")) == 1  # the dead holder's lock
    # Waiting: the script says when the dead holder's lock runs out, and the waiter
    # gets in then (the deadline is far beyond the 2 s lock timeout).
    patient = limitd.Limiter.concurrent("k", 1, lock_timeout=2, wait_timeout=30)
    with patient.within_limit():
        with_limit_full = limiter.within_limit()
        try:
            with_limit_full.__enter__()
            raise AssertionError("the slot was given twice")
        except limitd.OverLimit:
            pass
    [status] = limitd.api.limiters(redis)
    assert (status.waited, status.held) == (1, 0)
