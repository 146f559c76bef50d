"""Periodic jobs across real processes: three ``limitd start`` supervisors on one Redis
run an every-second entry; over a minute of ticks each one is enqueued exactly once,
with no tick missing between the first and the last."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import redis as redis_py

from limitd import clock, keys
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

SUPERVISORS = 3
QUEUE = keys.STANDALONE.queue("default")  # the supervisors run on a standalone Redis
TICKS = 20

APP = textwrap.dedent("""
    import limitd
    from limitd.spec import current_payload

    @limitd.job(name="periodic_app.Tick")
    def tick():
        payload = current_payload()
        redis = limitd.default_client().redis
        redis.hincrby("periodic_test:runs", str(payload["periodic"]["tick"]), 1)
""")

CONFIG = textwrap.dedent("""
    require: [periodic_app]
    heartbeat_period: 0.5
    queues: [default]
    concurrency: 4
    periodic:
      every-second:
        cron: "* * * * * *"
        job: periodic_app.Tick
""")


def runs(redis: redis_py.Redis) -> Counter[int]:
    found = redis.hgetall("periodic_test:runs")
    return Counter({int(tick): int(count) for tick, count in found.items()})


@pytest.mark.timeout(150)
def test_three_supervisors_enqueue_each_tick_exactly_once(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "periodic_app.py").write_text(APP)
    (tmp_path / "periodic.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    supervisors = [processes.start("periodic.yml") for _ in range(SUPERVISORS)]
    try:
        wait_for(lambda: redis.scard(keys.of(redis).CAPSULES) == SUPERVISORS, 30, "three capsules")
        everyone_up = clock.now()
        wait_for(
            lambda: max(runs(redis), default=0) >= everyone_up + TICKS,
            timeout=TICKS + 20,
            message=f"{TICKS} ticks with every supervisor running",
        )
    finally:
        for supervisor in supervisors:
            supervisor.send_signal(signal.SIGTERM)
        for supervisor in supervisors:
            supervisor.wait(timeout=30)
        processes.kill_all()
    counts = runs(redis)  # ticks that ran, and those enqueued but not run yet
    counts.update(job["periodic"]["tick"] for job in map(json.loads, redis.lrange(QUEUE, 0, -1)))
    ticks = sorted(counts)
    assert len(ticks) >= TICKS
    assert set(counts.values()) == {1}, "no tick enqueued twice"
    assert {b - a for a, b in pairwise(ticks)} == {1}, "no tick missing"
    assert redis.zcard(keys.of(redis).DEAD) == 0 and redis.zcard(keys.of(redis).RETRY) == 0
