"""A capsule listing thousands of limited queues, under ``limitd start`` with a child
SIGKILLed mid-drain: every job runs, no queue ever runs more jobs at once than its limit,
and the dead child's slots and in-progress lists are reclaimed.

The ready index (the fetch looks only at queues that may have work) keeps its own state
per capsule in Redis; this is the black-box check that it neither loses a job nor lets a
limit slip when a process dies holding jobs from many queues. The jobs record when they
start and end; the limits are checked on those records, not on limitd's own counts.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, children, in_progress_total, wait_for

APP = textwrap.dedent("""
    import os, time, json, limitd
    from limitd.client import default_client

    @limitd.job(name="scale.Work")
    def work(n, queue, hold):
        r = default_client().redis
        start = time.time()
        time.sleep(hold)
        pipe = r.pipeline()
        pipe.rpush("m:ran", json.dumps([n, queue, os.getpid(), start, time.time()]))
        pipe.sadd("m:done", n)
        pipe.execute()
""")


def queue_names(count: int) -> list[str]:
    return [f"many_{i:05d}" for i in range(count)]


def write_config(path: Path, names: list[str], limit: int) -> Path:
    limits = ", ".join(f"{name}: {limit}" for name in names)
    path.write_text(
        "require: [scale_app]\n"
        f"queues: [{', '.join(names)}]\n"
        "concurrency: 10\n"
        "processes: 2\n"
        "fetch: limit\n"
        "heartbeat_period: 1\n"
        f"limits: {{{limits}}}\n"
    )
    return path


def push(redis: redis_py.Redis, names: list[str], per_queue: int, hold: float) -> int:
    """``per_queue`` jobs in each of ``names``, interleaved (queue 0, 1, ... then again)."""
    client = limitd.Client(redis)
    n = 0
    for _round in range(per_queue):
        for name in names:
            client.push({"class": "scale.Work", "queue": name, "args": [n, name, hold]})
            n += 1
    return n


def overlaps(redis: redis_py.Redis, limit: int) -> dict[str, int]:
    """Per queue, the most of its finished runs that overlapped in time, where that is
    above ``limit``. (A run killed with its process has no record; the limit allowed the
    job's rerun only once the dead process's slot was reaped.)"""
    runs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for raw in redis.lrange("m:ran", 0, -1):
        _n, queue, _pid, start, end = json.loads(raw)
        runs[queue].append((start, end))
    worst = {}
    for queue, spans in runs.items():
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        running = peak = 0
        for _at, step in edges:  # an end sorts before a start at the same instant
            running += step
            peak = max(peak, running)
        if peak > limit:
            worst[queue] = peak
    return worst


def busy_total(redis: redis_py.Redis) -> int:
    """Slots held in every queue (the hash-table marker field reads as 0)."""
    return sum(int(count) for count in redis.hvals(keys.of(redis).BUSY))


@pytest.mark.parametrize(
    "shape",
    [
        (1_000, 1_000, 2),  # every queue holds work
        (10_000, 1_000, 2),  # a tenth of the queues listed hold work
    ],
)
def test_a_sigkill_among_thousands_of_queues_loses_no_job_and_keeps_every_limit(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    shape: tuple[int, int, int],
) -> None:
    queues, with_jobs, per_queue = shape  # queues listed, those given jobs, jobs in each
    (tmp_path / "scale_app.py").write_text(APP)
    names = queue_names(queues)
    config = write_config(tmp_path / "many.yml", names, limit=1)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    try:
        supervisor = processes.start(str(config))
        wait_for(
            lambda: redis.pubsub_numsub(keys.WAKE_CHANNEL)[0][1] >= 2,
            timeout=60,
            message="both capsules listening",
        )
        # Spread over the whole list, so the jobs' queues are scattered through it.
        step = queues // with_jobs
        total = push(redis, names[::step], per_queue, hold=0.01)
        wait_for(lambda: redis.scard("m:done") >= total // 4, timeout=60, message="work running")
        victim = children(supervisor.pid)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: redis.scard("m:done") == total, timeout=120, message="every job, at least once"
        )
        assert overlaps(redis, limit=1) == {}
        wait_for(lambda: busy_total(redis) == 0, timeout=30, message="every slot freed")
        wait_for(lambda: in_progress_total(redis) == 0, timeout=30, message="in progress empty")
        assert victim not in children(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        processes.kill_all()
