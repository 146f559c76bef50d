"""A batch over two capsule processes (``limitd start -p 2``, limit fetch with a
limit on the queue), while jobs are still being added: 1,000 jobs, 30% of which fail
on their first run and succeed on the retry. Each callback records, when it runs, how
many jobs had succeeded; each event must fire exactly once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import redis as redis_py

import limitd
from limitd.connection.embedded import RedisServer
from limitd.supervisor.poller import ScheduledPoller
from tests.helpers import LimitdProcesses, wait_for

JOBS = 1_000
APP = textwrap.dedent("""
    import json, limitd
    from limitd.client import default_client

    @limitd.job(name="bp.Work", queue="batch", retry_in=lambda count, exc, payload: 0.2)
    def work(n):
        redis = default_client().redis
        redis.incr("bp:runs")
        if n % 10 < 3 and "retry_count" not in limitd.current_payload():
            raise ValueError("fails on its first run")
        redis.sadd("bp:done", n)

    @limitd.job(name="bp.Callback", queue="callbacks")
    def on_event(status, options):
        redis = default_client().redis
        fired = [status["event"], redis.scard("bp:done"), status["pending"], options]
        redis.rpush("bp:fired", json.dumps(fired))
""")


def fired(redis: redis_py.Redis) -> list[list]:
    return [json.loads(raw) for raw in redis.lrange("bp:fired", 0, -1)]


def settled(redis: redis_py.Redis) -> bool:
    """Every job ran to success and nothing is left to run or retry."""
    return (
        redis.scard("bp:done") == JOBS
        and redis.zcard("retry") == 0
        and redis.llen("queue:batch") == 0
        and redis.llen("queue:callbacks") == 0
        and len(fired(redis)) >= 2
    )


def test_a_thousand_job_batch_fires_each_event_once_over_two_processes(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "bp_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    try:
        processes.start(
            "-r", "bp_app", "-q", "batch", "-q", "callbacks", "-c", "10", "-p", "2",
            "--limit", "batch=12", "-t", "2",
        )  # fmt: skip
        wait_for(lambda: redis.scard("limitd:capsules") == 2, timeout=15, message="capsules")
        batch = limitd.Batch("two processes", callback_queue="callbacks")
        batch.on("complete", "bp.Callback", {"on": "complete"})
        batch.on("success", "bp.Callback", {"on": "success"})
        client = limitd.Client(redis)
        with batch.jobs():  # the workers run the first jobs while the rest are added
            for start in range(0, JOBS, 100):
                client.push_bulk(
                    {"class": "bp.Work", "queue": "batch"},
                    [[n] for n in range(start, start + 100)],
                )
        poller = ScheduledPoller(redis)  # moves due retries without waiting for the capsules'

        def done() -> bool:
            poller.enqueue_due()
            return settled(redis)

        wait_for(done, timeout=60, message="batch finished")
    finally:
        processes.kill_all()
    complete, success = fired(redis)
    assert complete[0] == "complete" and complete[3] == {"on": "complete"}
    assert success == ["success", JOBS, 0, {"on": "success"}]  # after the last job
    assert int(redis.get("bp:runs")) == JOBS + 300  # every failing job retried once
    status = limitd.Batch.status(batch.bid, client=client)
    assert (status.total, status.pending, status.failures) == (JOBS, 0, {})
    assert status.complete and status.success
