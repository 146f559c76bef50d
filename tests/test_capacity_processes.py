"""Limited-capacity jobs across real processes: ``limitd start`` with 2 capsule
processes x 10 threads draining 200 rows of a PostgreSQL table with
``max_running_jobs`` 3, one copy SIGKILLed mid-work and one failing."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis as redis_py

import limitd
import limitd.api  # limitd.api.DeadSet below; import limitd alone does not load it
from limitd import keys
from limitd.capacity.metrics import capacity_metrics
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

ROWS = 200
KILL_ROW, FAIL_ROW = 60, 120
NAME = "capacity_app.ImportRows"

APP = textwrap.dedent("""
    import os, signal, threading, time
    import psycopg
    import limitd

    URL, TABLE = os.environ["CAPACITY_PG_URL"], os.environ["CAPACITY_TABLE"]
    KILL_ROW, FAIL_ROW = {kill}, {fail}
    # Copies doing work now (a set of jids), the most at once, and the most at once
    # after the kill, kept in Redis by one atomic step.
    ENTER = (
        "redis.call('SADD', KEYS[1], ARGV[1]) "
        "local n = redis.call('SCARD', KEYS[1]) "
        "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end "
        "if redis.call('EXISTS', KEYS[4]) == 1 and "
        "   n > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], n) end "
        "return n"
    )
    _local = threading.local()

    def db():
        conn = getattr(_local, "conn", None)
        if conn is None or conn.closed:
            conn = _local.conn = psycopg.connect(URL, autocommit=True)
        return conn

    class ImportRows(limitd.LimitedCapacityJob, name="{name}", queue="imports"):
        lease = 3

        def perform_work(self):
            redis = limitd.default_client().redis
            conn = db()
            with conn.transaction():
                row = conn.execute(
                    f"SELECT id FROM {{TABLE}} WHERE processed = 0 ORDER BY id "
                    "LIMIT 1 FOR UPDATE SKIP LOCKED"
                ).fetchone()
                if row is None:
                    return
                holders = ("capacity_test:holders", "capacity_test:max",
                           "capacity_test:max_after_kill", "capacity_test:killed")
                redis.eval(ENTER, 4, *holders, self.jid)
                try:
                    time.sleep(0.02)
                    if redis.exists("capacity_test:killed") and (
                        redis.get("capacity_test:max_after_kill") != b"3"
                    ):
                        # After the kill, hold the row until three copies hold one at
                        # once (2 s at most): on a loaded machine their 20 ms windows may
                        # never overlap, and a place that is back could not be told from
                        # one that is not.
                        until = time.monotonic() + 2
                        while redis.scard(holders[0]) < 3 and time.monotonic() < until:
                            time.sleep(0.01)
                    if row[0] == KILL_ROW and redis.set("capacity_test:killed", self.jid, nx=True):
                        redis.srem("capacity_test:holders", self.jid)
                        os.kill(os.getpid(), signal.SIGKILL)  # mid-transaction: rolled back
                    if row[0] == FAIL_ROW and redis.set("capacity_test:failed", self.jid, nx=True):
                        raise RuntimeError(f"row {{row[0]}} could not be imported")
                    conn.execute(
                        f"UPDATE {{TABLE}} SET processed = processed + 1 WHERE id = %s", (row[0],)
                    )
                finally:
                    redis.srem("capacity_test:holders", self.jid)

        def remaining_work_count(self):
            return db().execute(f"SELECT count(*) FROM {{TABLE}} WHERE processed = 0").fetchone()[0]

        def max_running_jobs(self):
            return 3
""").format(kill=KILL_ROW, fail=FAIL_ROW, name=NAME)

CONFIG = textwrap.dedent("""
    require: [capacity_app]
    heartbeat_period: 0.5
    queues: [imports]
    concurrency: 10
    processes: 2
""")


@pytest.fixture
def app(
    tmp_path: Path, postgres_table: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The app module, imported here too (the test is its refill), and its table."""
    import psycopg

    url, table = postgres_table
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, processed int NOT NULL)")
        conn.execute(f"INSERT INTO {table} SELECT n, 0 FROM generate_series(1, {ROWS}) n")
    (tmp_path / "capacity_app.py").write_text(APP)
    (tmp_path / "capacity.yml").write_text(CONFIG)
    monkeypatch.setenv("CAPACITY_PG_URL", url)
    monkeypatch.setenv("CAPACITY_TABLE", table)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("capacity_app")
    yield module
    sys.modules.pop("capacity_app", None)


def gauges(redis: redis_py.Redis) -> dict[str, float]:
    return {
        family.name.removeprefix("limitd_limited_capacity_"): sample.value
        for family in capacity_metrics(redis)
        for sample in family.samples
        if sample.labels.get("job_class") == NAME  # limitd's names (GitLab's: "worker")
    }


def unprocessed(url: str, table: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table} WHERE processed = 0").fetchone()[0])


def test_three_copies_drain_a_table_through_a_kill_and_a_failure(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    app: ModuleType,
    postgres_table: tuple[str, str],
) -> None:
    url, table = postgres_table
    processes = LimitdProcesses(tmp_path, redis_server.url)
    processes.env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    supervisor = processes.start("capacity.yml")
    most_queued, gauge_full = 0, False
    try:
        wait_for(
            lambda: redis.scard(keys.of(redis).CAPSULES) == 2, timeout=30, message="two capsules"
        )
        deadline = time.monotonic() + 90
        while unprocessed(url, table) > 0:
            assert time.monotonic() < deadline, "the backlog was not drained in 90 s"
            app.ImportRows.perform_with_capacity()  # the refill a periodic entry would do
            for _ in range(20):
                most_queued = max(most_queued, int(redis.llen("queue:imports")))
                shown = gauges(redis)
                left = unprocessed(url, table)
                assert shown["running_jobs"] <= 3 and shown["max_running_jobs"] == 3
                assert shown["remaining_work_count"] >= left  # as last read: never behind
                gauge_full = gauge_full or shown["running_jobs"] == 3
                time.sleep(0.01)
        wait_for(
            lambda: gauges(redis)["running_jobs"] == 0 and redis.llen("queue:imports") == 0,
            timeout=30,
            message="the last copies to finish",
        )
        import psycopg

        with psycopg.connect(url) as conn:
            counts = conn.execute(f"SELECT processed, count(*) FROM {table} GROUP BY 1").fetchall()
        assert counts == [(1, ROWS)], "every row processed exactly once"
        assert redis.exists("capacity_test:killed"), "a copy was SIGKILLed mid-work"
        assert redis.get("capacity_test:max") == b"3", "3 copies at once, never more"
        assert redis.get("capacity_test:max_after_kill") == b"3", "the killed copy's place is back"
        assert most_queued <= 3, "the queue never held more copies than places"
        assert gauge_full, "the running gauge showed the 3 copies"
        [dead] = limitd.api.DeadSet()
        assert dead.jid == redis.get("capacity_test:failed").decode()
        assert dead.error_class == "RuntimeError" and dead.retry_count == 0  # failed once
        assert redis.zcard(keys.of(redis).RETRY) == 0, "a failed copy is not retried"
        assert gauges(redis)["remaining_work_count"] == 0
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=30)
        processes.kill_all()
