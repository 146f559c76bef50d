"""Expiring jobs under a real ``limitd start``: a job pushed with a short ``expires_in``
into a paused queue, left there past its deadline, is dropped (not run, logged, counted
in the process's metrics) once the queue is resumed, while a job without a deadline
pushed after it runs."""

from __future__ import annotations

import os
import signal
import textwrap
import time
import urllib.error
from pathlib import Path

import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.payload import parse
from limitd.queues import limits as queue_limits
from tests.helpers import LimitdProcesses, wait_for
from tests.test_metrics_exporter import Samples, value
from tests.test_metrics_process import free_ports, get_metrics

APP = textwrap.dedent("""
    import limitd

    @limitd.job(name="expiry_app.Note")
    def note(key):
        limitd.default_client().redis.rpush("expiry_test:ran", key)
""")

CONFIG = textwrap.dedent("""
    require: [expiry_app]
    heartbeat_period: 0.5
    queues: [feed]
    concurrency: 2
    metrics: {{port: {port}, bind: 127.0.0.1}}
""")


def scrape(port: int) -> Samples | None:
    try:
        return get_metrics(port)
    except (urllib.error.URLError, ConnectionError):
        return None


def test_a_job_left_in_a_paused_queue_past_its_deadline_is_dropped_when_resumed(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    port = free_ports(1)
    (tmp_path / "expiry_app.py").write_text(APP)
    (tmp_path / "expiry.yml").write_text(CONFIG.format(port=port))
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    queue_limits.pause(redis, "feed")
    supervisor = processes.start("expiry.yml")
    try:
        wait_for(lambda: redis.scard(keys.of(redis).CAPSULES) == 1, timeout=30, message="capsule")
        client = limitd.Client(redis)
        late = client.push(
            {"class": "expiry_app.Note", "args": ["late"], "queue": "feed", "expires_in": 0.5}
        )
        client.push({"class": "expiry_app.Note", "args": ["kept"], "queue": "feed"})
        queue = keys.of(redis).queue("feed")
        [_, first] = [parse(raw) for raw in redis.lrange(queue, 0, -1)]
        assert first["jid"] == late and first["expires_at"] == first["created_at"] + 0.5
        wait_for(lambda: time.time() > first["expires_at"], timeout=5, message="the deadline")
        queue_limits.resume(redis, "feed")

        wait_for(
            lambda: redis.lrange("expiry_test:ran", 0, -1) == [b"kept"],
            timeout=30,
            message="the job without a deadline to run",
        )
        log = tmp_path / "limitd.log"
        wait_for(
            lambda: f"expired jid={late} class=expiry_app.Note" in log.read_text(),
            timeout=10,
            message="the expired job's log line",
        )
        labels = {"job_class": "expiry_app.Note", "queue": "feed"}

        def counted() -> bool:
            samples = scrape(port)
            try:
                return value(samples or {}, "limitd_jobs_expired_total", **labels) == 1
            except KeyError:  # not served yet, or no job expired yet
                return False

        wait_for(counted, timeout=10, message="limitd_jobs_expired_total to count it")
        assert redis.llen(queue) == 0
        assert redis.zcard(keys.of(redis).RETRY) == 0 and redis.zcard(keys.of(redis).DEAD) == 0
        assert redis.lrange("expiry_test:ran", 0, -1) == [b"kept"], "the late job never ran"
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)
        processes.kill_all()
