"""The job history under ``limitd start``: two capsule processes tally their jobs and
write them when they stop (SIGTERM), not before (a flush interval of an hour)."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import job_history
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

APP = textwrap.dedent("""
    import limitd

    @limitd.job(name="history_app.Work", retry=0)
    def work(n):
        limitd.default_client().redis.incr("history_test:ran")
        if n % 4 == 0:
            raise ValueError(n)
""")

CONFIG = textwrap.dedent("""
    require: [history_app]
    queues: [default]
    concurrency: 3
    processes: 2
    job_history: {enabled: true, flush_interval: 3600}
""")


@limitd.job(name="history_app.Work")
def work(n: int) -> None: ...  # the test's side: pushes the app's job by name


@pytest.mark.timeout(90)
def test_processes_write_their_history_when_they_stop(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "history_app.py").write_text(APP)
    (tmp_path / "history.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    supervisor = processes.start("history.yml")
    try:
        for n in range(40):
            work.perform_async(n)
        wait_for(lambda: int(redis.get("history_test:ran") or 0) == 40, 60, "the 40 jobs to run")
        assert job_history(redis, 5) == [], "written before the stop, not batched"
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
    finally:
        processes.kill_all()
    [row] = job_history(redis, 5)
    assert (row.job_class, row.processed, row.failed) == ("history_app.Work", 40, 10)
    assert sum(row.buckets) == 40
    layout = keys.of(redis)
    assert all(redis.ttl(layout.job_history(m.start // 60)) > 0 for m in row.minutes if m.processed)
