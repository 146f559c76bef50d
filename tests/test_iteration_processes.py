"""Iterable jobs under a real ``limitd start``: SIGTERM in the middle of a 10,000-item
walk stops it after the item on hand, the job goes back to its queue with its cursor,
and the next ``limitd start`` resumes it there: every item is done exactly once across
the restart, for a sync and an async job alike.

To make "in the middle" certain rather than a matter of timing, the first run holds its
item 3,000 until the test lets it go, which the test does only once the capsule has
quieted (the stop's first step), as a deploy's TERM finds a job mid-item."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import Processes, iteration_progress
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

ITEMS = 10_000
HELD = 3_000

APP = textwrap.dedent("""
    import limitd
    from limitd.connection import loop_twin
    from limitd.iteration.job import numbers

    DONE, GATE = "iteration_test:done", "iteration_test:gate"


    class Walk(limitd.IterableJob, name="iteration_app.Walk", queue="walks"):
        def build_items(self, count, *, cursor):
            return numbers(0, count, cursor)

        def each_item(self, item, count):
            redis = limitd.redis_client()
            if item == {held} and self.run_number == 1:
                redis.blpop(GATE, timeout=60)
            redis.rpush(DONE, item)


    class AsyncWalk(limitd.IterableJob, name="iteration_app.AsyncWalk", queue="walks"):
        async def build_items(self, count, *, cursor):
            for pair in numbers(0, count, cursor):
                yield pair

        async def each_item(self, item, count):
            redis = loop_twin(limitd.default_client().redis)
            if item == {held} and self.run_number == 1:
                await redis.blpop(GATE, timeout=60)
            await redis.rpush(DONE, item)
""").format(held=HELD)

CONFIG = textwrap.dedent("""
    require: [iteration_app]
    heartbeat_period: 0.5
    queues: [walks]
    concurrency: 2
    timeout: 30
""")


@pytest.mark.parametrize("job_class", ["iteration_app.Walk", "iteration_app.AsyncWalk"])
def test_sigterm_mid_walk_then_a_restart_does_every_item_exactly_once(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis, job_class: str
) -> None:
    (tmp_path / "iteration_app.py").write_text(APP)
    (tmp_path / "walk.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    layout = keys.of(redis)
    jid = limitd.Client(redis).push({"class": job_class, "args": [ITEMS], "queue": "walks"})
    try:
        first = processes.start("walk.yml")
        wait_for(
            lambda: redis.llen("iteration_test:done") == HELD,
            timeout=60,
            message=f"the first run to reach item {HELD}",
        )
        first.send_signal(signal.SIGTERM)
        wait_for(
            lambda: any(process.quiet for process in Processes(redis)),
            timeout=30,
            message="the capsule to quiet",
        )
        redis.rpush("iteration_test:gate", "go")  # the item on hand may end now
        assert first.wait(timeout=60) == 0

        done = [int(item) for item in redis.lrange("iteration_test:done", 0, -1)]
        assert done == list(range(HELD + 1)), "the item on hand ended, no other started"
        progress = iteration_progress(jid, redis)
        assert progress is not None
        assert (progress.state, progress.items, progress.cursor) == ("interrupted", HELD + 1, HELD)
        [waiting] = redis.lrange(layout.queue("walks"), 0, -1)
        assert json.loads(waiting)["jid"] == jid, "back in its queue, unchanged"
        assert not any(int(count) for count in redis.hvals(layout.BUSY)), "no slot held"

        second = processes.start("walk.yml")
        wait_for(
            lambda: (
                (found := iteration_progress(jid, redis)) is not None and found.state == "completed"
            ),
            timeout=120,
            message="the resumed walk to complete",
        )
        done = [int(item) for item in redis.lrange("iteration_test:done", 0, -1)]
        assert done == list(range(ITEMS)), "every item exactly once, in order"
        progress = iteration_progress(jid, redis)
        assert progress is not None and (progress.items, progress.runs) == (ITEMS, 2)
        log = (tmp_path / "limitd.log").read_text()
        assert f"interrupted jid={jid} class={job_class} after {HELD + 1} items" in log
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    finally:
        processes.kill_all()
