"""The job history (issue 30 §6): capsules tally jobs per class and minute in memory and
write them in batches; the admin API and the dashboard's Metrics page read them back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import job_history
from limitd.config import CapsuleConfig, ConfigError, load_config
from limitd.job_history.process import HistoryWriter, process_services
from limitd.job_history.section import HistorySettings
from limitd.job_history.store import BUCKETS, Tally, bucket_bounds, bucket_of, flush
from limitd.middleware.defaults import default_server_chain
from limitd.plugins import ProcessContext
from limitd.supervisor import Capsule
from tests.helpers import wait_for

QUEUE = "job_history_test"
OK = "job_history_test.Resize"
BAD = "job_history_test.Charge"


@limitd.job(name=OK, queue=QUEUE)
def resize(n: int) -> None: ...


@limitd.job(name=BAD, queue=QUEUE, retry=0)
def charge(n: int) -> None:
    raise RuntimeError(f"card {n} declined")


def test_buckets_double_from_one_millisecond_and_cap_at_the_last() -> None:
    assert [bucket_of(ms) for ms in (0, 0.9, 1, 1.9, 2, 3, 4, 1000)] == [0, 0, 1, 1, 2, 2, 3, 10]
    assert bucket_of(10**12) == BUCKETS - 1
    assert bucket_bounds(0) == (0.0, 1.0) and bucket_bounds(3) == (4.0, 8.0)
    assert bucket_bounds(BUCKETS - 1)[1] == float("inf")
    for b in range(BUCKETS - 1):
        low, high = bucket_bounds(b)
        assert bucket_of(low) == b and bucket_of(high - 0.001) == b


def settings(**given: Any) -> HistorySettings:
    return HistorySettings(enabled=True, **{"flush_interval": 3600.0, **given})


@pytest.fixture
def writer_and_capsule(redis: redis_py.Redis) -> Iterator[tuple[HistoryWriter, Capsule]]:
    """A capsule whose chain has the history writer of a process, as ``limitd start``
    sets it up (its thread flushes once an hour unless a test says otherwise)."""
    chain = default_server_chain(redis)
    context = ProcessContext(redis, {"job_history": settings()}, CapsuleConfig(), chain)
    [writer] = process_services(context)
    assert isinstance(writer, HistoryWriter)
    capsule = Capsule(CapsuleConfig(queues=(QUEUE,)), redis=redis, middleware=chain)
    writer.start()
    yield writer, capsule
    writer.stop()


def hincrby_calls(redis: redis_py.Redis) -> int:
    stats = redis.info("commandstats")
    return int(stats.get("cmdstat_hincrby", {}).get("calls", 0))


def test_a_drain_is_counted_per_class_with_one_write_for_all_its_jobs(
    redis: redis_py.Redis, writer_and_capsule: tuple[HistoryWriter, Capsule]
) -> None:
    """The 200 jobs leave no trace in Redis until the write, which is a handful of
    commands (the core's own per-job writes are not counted: only the write's)."""
    writer, capsule = writer_and_capsule
    for n in range(150):
        resize.perform_async(n)
    for n in range(50):
        charge.perform_async(n)
    assert capsule.drain() == {"done": 150, "dead": 50}
    layout = keys.of(redis)
    assert not any(redis.exists(layout.job_history(m)) for m in _recent_minutes())
    before = hincrby_calls(redis)
    sent = writer.write()
    written = hincrby_calls(redis) - before
    assert 0 < written < 20 and sent >= written  # a handful of fields, not one per job
    rows = {row.job_class: row for row in job_history(redis, minutes=5)}
    assert (rows[OK].processed, rows[OK].failed) == (150, 0)
    assert (rows[BAD].processed, rows[BAD].failed) == (50, 50)
    assert sum(rows[OK].buckets) == 150 and sum(rows[BAD].buckets) == 50
    assert rows[OK].minutes[-1].start <= limitd.clock.now() < rows[OK].minutes[-1].start + 60
    assert list(rows) == [OK, BAD]  # busiest first


def test_every_minute_hash_expires_after_the_retention(
    redis: redis_py.Redis, writer_and_capsule: tuple[HistoryWriter, Capsule]
) -> None:
    writer, capsule = writer_and_capsule
    resize.perform_async(1)
    capsule.drain()
    writer.write()
    layout = keys.of(redis)
    found = [key for key in map(layout.job_history, _recent_minutes()) if redis.exists(key)]
    assert found
    for key in found:
        assert 8 * 3600 - 60 < redis.ttl(key) <= 8 * 3600


def _recent_minutes() -> range:
    now = int(limitd.clock.now() // 60)
    return range(now - 2, now + 1)


def test_the_writer_thread_flushes_every_interval_and_at_stop(redis: redis_py.Redis) -> None:
    chain = default_server_chain(redis)
    writer = HistoryWriter(redis, chain, settings(flush_interval=0.05))
    capsule = Capsule(CapsuleConfig(queues=(QUEUE,)), redis=redis, middleware=chain)
    writer.start()
    try:
        resize.perform_async(1)
        capsule.drain()
        wait_for(lambda: job_history(redis, 5), message="the history thread's first write")
        writer._stop.set()  # the thread stops; what runs after waits for ``stop``
        assert writer._thread is not None
        writer._thread.join(5)
        charge.perform_async(2)
        capsule.drain()
        assert {row.job_class for row in job_history(redis, 5)} == {OK}
    finally:
        writer.stop()
    assert {row.job_class for row in job_history(redis, 5)} == {OK, BAD}


def test_a_refused_write_keeps_the_counts_for_the_next() -> None:
    down = redis_py.Redis(port=1, socket_connect_timeout=0.5)
    writer = HistoryWriter(down, default_server_chain(down), settings())
    writer.tally.record(1000, OK, 12.0, failed=False)
    assert writer.write() == 0
    assert len(writer.tally) == 1
    [counts] = writer.tally.take().values()
    assert (counts.processed, counts.milliseconds, counts.buckets) == (1, 12, {4: 1})


def test_a_tally_merges_counts_given_back() -> None:
    tally = Tally()
    tally.record(7, OK, 3.0, failed=True)
    taken = tally.take()
    tally.record(7, OK, None, failed=False)
    tally.give_back(taken)
    [counts] = tally.take().values()
    assert (counts.processed, counts.failed, counts.milliseconds) == (2, 1, 3)
    assert counts.buckets == {2: 1}


def test_disabled_by_default(redis: redis_py.Redis) -> None:
    context = ProcessContext(redis, {}, CapsuleConfig(), default_server_chain(redis))
    assert process_services(context) == []


def test_the_section_is_read_and_its_mistakes_named(tmp_path: Path) -> None:
    conf = tmp_path / "app.yml"
    conf.write_text("job_history: {enabled: true, flush_interval: 2, retention: 3600}\n")
    read = load_config([str(conf)]).section("job_history")
    assert read == HistorySettings(enabled=True, flush_interval=2.0, retention=3600)
    conf.write_text("job_history: {enabled: true, retention: 10}\n")
    with pytest.raises(ConfigError, match=r"app\.yml.*job_history\.retention.*>= 60"):
        load_config([str(conf)])
    conf.write_text("job_history: {enable: true}\n")
    with pytest.raises(ConfigError, match=r"app\.yml.*job_history\.enable"):
        load_config([str(conf)])


def test_the_metrics_pages_list_classes_chart_and_map_durations(
    redis: redis_py.Redis, writer_and_capsule: tuple[HistoryWriter, Capsule]
) -> None:
    from starlette.testclient import TestClient

    from limitd.web import app

    writer, capsule = writer_and_capsule
    for n in range(5):
        resize.perform_async(n)
    charge.perform_async(1)
    capsule.drain()
    writer.write()
    with TestClient(app(redis)) as client:
        index = client.get("/job-metrics")
        detail = client.get(f"/job-metrics/{OK}?minutes=180")
        empty = client.get("/job-metrics/nobody.Ran")
    assert index.status_code == 200 and OK in index.text and BAD in index.text
    assert 'href="/job-metrics"' in index.text or "/job-metrics" in index.text
    assert detail.status_code == 200
    assert detail.text.count('class="cell"') >= 1 and 'id="chart-class"' in detail.text
    assert "No timed job" not in detail.text
    assert empty.status_code == 200 and "No timed job" in empty.text


def test_the_history_command_prints_the_classes(
    redis: redis_py.Redis,
    writer_and_capsule: tuple[HistoryWriter, Capsule],
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse
    import json

    from limitd.job_history.commands import add_history_command

    writer, capsule = writer_and_capsule
    resize.perform_async(1)
    charge.perform_async(2)
    capsule.drain()
    writer.write()

    def run(*argv: str) -> str:
        parser = argparse.ArgumentParser(prog="limitd")
        add_history_command(parser.add_subparsers(required=True), lambda args: redis)
        args = parser.parse_args(["history", *argv])
        capsys.readouterr()
        assert args.command(args) == 0
        return capsys.readouterr().out

    table = run("--minutes", "10").splitlines()
    assert table[0].split() == ["CLASS", "PROCESSED", "FAILED", "TOTAL_MS", "AVERAGE_MS"]
    assert {line.split()[0]: line.split()[1:3] for line in table[1:]} == {
        OK: ["1", "0"],
        BAD: ["1", "1"],
    }
    [first, second] = json.loads(run("--json"))
    assert {first["job_class"], second["job_class"]} == {OK, BAD}
    assert len(first["minutes"]) == 60 and len(first["buckets"]) == BUCKETS


def test_on_a_cluster_every_minute_is_under_the_limitd_tag(clustered: Any) -> None:
    """Cluster mode: the minute hashes carry ``{limitd}``, so a flush of many minutes is
    one pipeline to one shard, and the reads find them."""
    tally = Tally()
    now_minute = int(limitd.clock.now() // 60)
    for back in range(3):
        tally.record(now_minute - back, OK, 5.0, failed=back == 0)
    flush(clustered, tally.take())
    assert keys.of(clustered).job_history(now_minute).startswith("{limitd}")
    [row] = job_history(clustered, 5)
    assert (row.processed, row.failed, row.buckets[bucket_of(5.0)]) == (3, 1, 3)


@limitd.job(name="job_history_test.Fetch", queue=QUEUE)
async def fetch(n: int) -> None:
    await asyncio.sleep(0.01)


def test_async_jobs_are_timed_on_the_event_loop(
    redis: redis_py.Redis, writer_and_capsule: tuple[HistoryWriter, Capsule]
) -> None:
    writer, capsule = writer_and_capsule
    for n in range(4):
        fetch.perform_async(n)
    capsule.start()
    try:

        def written() -> bool:
            writer.write()
            return _processed(redis, "job_history_test.Fetch") == 4

        wait_for(written, message="the 4 async jobs in the history")
    finally:
        capsule.stop(timeout=5)
    [row] = job_history(redis, 5)
    assert sum(row.buckets) == 4 and row.milliseconds >= 40  # each slept 10 ms


def _processed(redis: redis_py.Redis, job_class: str) -> int:
    return sum(row.processed for row in job_history(redis, 5) if row.job_class == job_class)


@limitd.job(name="job_history_test.Warm", queue=QUEUE)
def warm(n: int) -> None: ...


def test_jobs_that_did_not_run_are_not_counted(
    redis: redis_py.Redis, writer_and_capsule: tuple[HistoryWriter, Capsule]
) -> None:
    """An expired job was dropped before it ran; processed counts jobs that ran."""
    writer, capsule = writer_and_capsule
    resize.perform_async(1)
    limitd.Client(redis).push(
        {"class": "job_history_test.Warm", "args": [1], "queue": QUEUE, "expires_at": 1.0}
    )
    assert capsule.drain() == {"done": 1, "expired": 1}
    writer.write()
    rows = {row.job_class: row for row in job_history(redis, minutes=5)}
    assert set(rows) == {OK}
