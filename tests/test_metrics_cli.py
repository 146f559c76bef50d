"""Metrics across real processes: ``limitd metrics`` scraped over HTTP while ``limitd
start`` works through jobs, compared with ``limitd queues --json`` read at the same
moment; and ``limitd start`` with a ``metrics:`` section, each of its processes serving
its own job counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import Processes, Queue, Stats
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for
from tests.test_metrics_exporter import Samples, value
from tests.test_metrics_process import free_ports, get_metrics

APP = textwrap.dedent("""
    import limitd
    from limitd.client import default_client

    @limitd.job(name="mx.Ok", queue="work")
    def ok(n):
        pass

    @limitd.job(name="mx.Discarded", queue="work", retry=False)
    def discarded(n):
        raise RuntimeError("not kept")

    @limitd.job(name="mx.Dies", queue="work", retry=0)
    def dies(n):
        raise RuntimeError("no retries")

    @limitd.job(name="mx.Retried", queue="work", retry_in=lambda count, exc, payload: 3600)
    def retried(n):
        raise RuntimeError("retried in an hour")

    @limitd.job(name="mx.Hold", queue="hold")
    def hold():
        default_client().redis.blpop("mx:release", 60)  # until the test releases it
""")

QUEUE_FIELDS = ("size", "busy", "limit", "process_limit", "paused")


@pytest.fixture
def app_dir(tmp_path: Path, redis_server: RedisServer) -> Path:
    (tmp_path / "mx_app.py").write_text(APP)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "redis.yml").write_text(f"redis: {{url: '{redis_server.url}'}}\n")
    return tmp_path


@pytest.fixture
def processes(app_dir: Path, redis_server: RedisServer) -> Iterator[LimitdProcesses]:
    started = LimitdProcesses(app_dir, redis_server.url)
    yield started
    started.kill_all()


@pytest.fixture
def exporter(app_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``limitd metrics conf/redis.yml --port P``: Redis named by the positional config
    alone (no URL in its environment)."""
    port = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMITD_")}
    with (app_dir / "metrics.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "limitd.cli", "metrics", "conf/redis.yml", "--port", str(port)],
            cwd=app_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def answering(port: int) -> bool:
    try:
        get_metrics(port)
    except (urllib.error.URLError, ConnectionError):
        return False
    return True


# what the payloads of the app's jobs carry (pushed by name, the app not imported here)
RETRY = {"mx.Ok": True, "mx.Discarded": False, "mx.Dies": 0, "mx.Retried": True}


def push(redis: redis_py.Redis, job: str, count: int) -> None:
    item = {"class": job, "queue": "work", "retry": RETRY[job]}
    limitd.Client(redis).push_bulk(item, [[n] for n in range(count)])


def queues_json(cwd: Path, redis_server: RedisServer) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "--redis", redis_server.url, "queues", "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def test_the_exporter_serves_what_limitd_queues_shows_during_a_run(
    app_dir: Path,
    redis: redis_py.Redis,
    redis_server: RedisServer,
    processes: LimitdProcesses,
    exporter: tuple[subprocess.Popen[bytes], int],
) -> None:
    worker = processes.start(
        "-r", "mx_app", "-q", "work", "-q", "hold", "-c", "3", "-t", "2",
        "--limit", "work=5", "--process-limit", "hold=1",
    )  # fmt: skip
    push(redis, "mx.Ok", 10)
    push(redis, "mx.Discarded", 4)
    push(redis, "mx.Dies", 2)
    push(redis, "mx.Retried", 1)
    wait_for(lambda: Stats(redis).processed == 17, timeout=30, message="17 jobs counted")
    # freeze: a running job that waits for us, a paused queue nobody fetches
    limitd.Client(redis).push({"class": "mx.Hold", "queue": "hold", "args": []})
    limitd.Client(redis).push({"class": "mx.Ok", "queue": "parked", "args": [0]})
    limitd.Client(redis).push({"class": "mx.Ok", "queue": "parked", "args": [1], "at": 2e9})
    Queue("parked", redis).pause()
    Queue("parked", redis).limit = 7
    wait_for(lambda: Processes(redis).busy == 1, timeout=30, message="the hold job running")
    proc, port = exporter
    wait_for(lambda: answering(port), timeout=30, message="limitd metrics answering")

    started = time.monotonic()
    samples = get_metrics(port)
    rows = queues_json(app_dir, redis_server)
    elapsed = time.monotonic() - started
    stats = Stats(redis)

    assert {row["name"] for row in rows} == {"work", "hold", "parked"}
    for row in rows:
        compare_queue(samples, row, elapsed)
    assert value(samples, "limitd_queue_busy", queue="hold") == 1
    assert value(samples, "limitd_queue_size", queue="parked") == 1
    assert value(samples, "limitd_processed_total") == stats.processed == 17
    assert value(samples, "limitd_failed_total") == stats.failed == 7
    assert value(samples, "limitd_retry_set_size") == stats.retry_size == 1
    assert value(samples, "limitd_dead_set_size") == stats.dead_size == 2
    assert value(samples, "limitd_scheduled_set_size") == stats.scheduled_size == 1
    assert value(samples, "limitd_processes", capsule="default") == 1
    assert value(samples, "limitd_threads", capsule="default") == 3
    assert value(samples, "limitd_busy_threads", capsule="default") == 1
    assert value(samples, "limitd_exporter_up", part="core") == 1

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    redis.rpush("mx:release", 1)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def compare_queue(samples: Samples, row: dict[str, object], elapsed: float) -> None:
    """One row of ``limitd queues --json`` against the scrape read just before it."""
    name = str(row["name"])
    for field in QUEUE_FIELDS:
        metric = f"limitd_queue_{field}"
        key = (metric, (("queue", name),))
        if row[field] is None:  # unlimited: no series
            assert key not in samples, (name, field)
        else:
            assert samples[key] == float(row[field]), (name, field)  # type: ignore[arg-type]
    # latency moves with the clock: read later, by at most the time between the reads
    scraped = value(samples, "limitd_queue_latency_seconds", queue=name)
    listed = float(row["latency"])  # type: ignore[arg-type]
    assert scraped - 0.001 <= listed <= scraped + elapsed + 0.001, (name, scraped, listed)


def test_the_exporter_rejects_a_bad_port_and_a_missing_redis(app_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIMITD_")}
    for argv, code, message in (
        (["metrics", "--port", "70000"], 64, "--port must be a TCP port from 1 to 65535"),
        (["metrics", "--port", "x"], 64, "--port must be an integer >= 1"),
        (["--redis", "redis://127.0.0.1:1/0", "metrics"], 69, "cannot reach Redis"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "limitd.cli", *argv],
            cwd=app_dir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert out.returncode == code, out.stderr
        assert message in out.stderr


def job_counts(ports: list[int]) -> dict[str, float]:
    """``limitd_jobs_total`` by outcome, summed over the processes' endpoints."""
    counts: dict[str, float] = {}
    for port in ports:
        for (name, labels), count in get_metrics(port).items():
            if name == "limitd_jobs_total":
                outcome = dict(labels)["outcome"]
                counts[outcome] = counts.get(outcome, 0) + count
    return counts


def durations(ports: list[int]) -> float:
    return sum(
        count
        for port in ports
        for (name, _), count in get_metrics(port).items()
        if name == "limitd_job_duration_seconds_count"
    )


def test_each_process_serves_its_job_metrics_on_port_plus_its_number(
    app_dir: Path, redis: redis_py.Redis, processes: LimitdProcesses
) -> None:
    first = free_ports(2)
    (app_dir / "conf" / "app.yml").write_text(
        "require: [mx_app]\nqueues: [work]\nconcurrency: 2\nprocesses: 2\ntimeout: 2\n"
        f"metrics: {{port: {first}}}\n"
    )
    worker = processes.start("conf/app.yml")
    ports = [first, first + 1]
    wait_for(lambda: all(answering(p) for p in ports), timeout=30, message="both endpoints")
    for number, port in enumerate(ports):
        info = get_metrics(port)
        assert value(info, "limitd_process_info", capsule="default", process_number=str(number))
    push(redis, "mx.Ok", 12)
    push(redis, "mx.Discarded", 3)
    push(redis, "mx.Dies", 2)
    push(redis, "mx.Retried", 1)
    expected = {"done": 12, "discarded": 3, "dead": 2, "retry": 1}
    wait_for(lambda: job_counts(ports) == expected, timeout=30, message=f"counts {expected}")
    assert durations(ports) == 18
    assert redis.zcard(keys.of(redis).RETRY) == 1 and redis.zcard(keys.of(redis).DEAD) == 2
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert not any(answering(p) for p in ports)
