"""A Redis out of memory (``maxmemory``, policy ``noeviction``) refuses SET, SADD, HSET
and the other writes that may grow memory: no live process may be reaped for it, and
the refusals must show, once a minute in the log and as metrics.

Each test has a Redis of its own (``own_redis_server``): filling it to ``maxmemory``
must not disturb the other tests' server.
"""

from __future__ import annotations

import logging
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py
from prometheus_client import CollectorRegistry, generate_latest

import limitd
from limitd import clock, keys
from limitd.connection.embedded import RedisServer
from limitd.fetch import liveness
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LIMIT_FETCH
from limitd.metrics.process import RefusalCollector
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.supervisor.refusals import WriteRefusals
from tests.helpers import LimitdProcesses, wait_for

FILLER = "oom:filler"
FILL_BYTES = 8 * 1024 * 1024


@pytest.fixture
def oom_redis(own_redis_server: RedisServer) -> Iterator[redis_py.Redis]:
    conn = own_redis_server.client()
    conn.config_set("maxmemory-policy", "noeviction")
    yield conn
    conn.config_set("maxmemory", 0)
    conn.close()


def refuse_writes(conn: redis_py.Redis) -> None:
    """Fill Redis with a big key, then set ``maxmemory`` under what it uses, as an
    operator's Redis that reached its limit: every write that may grow memory fails."""
    conn.setrange(FILLER, FILL_BYTES - 1, "x")
    used = int(conn.info("memory")["used_memory"])
    conn.config_set("maxmemory", used - FILL_BYTES // 2)
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        conn.set("oom:probe", "1")


def accept_writes(conn: redis_py.Redis) -> None:
    """Free the memory (DEL is allowed when out of memory): writes go through again."""
    conn.delete(FILLER)
    conn.set("oom:probe", "1")


# What Redis allows when out of memory


def test_refreshing_an_expiry_is_allowed_out_of_memory_and_set_is_not(
    oom_redis: redis_py.Redis,
) -> None:
    """The premise of ``liveness.vouch``, checked on the redis-server the suite runs."""
    info = oom_redis.execute_command("COMMAND", "INFO", "expire", "set", "sadd", "srem", "del")
    flags = {name: set(info[name]["flags"]) for name in info}
    assert "denyoom" not in flags["expire"] | flags["srem"] | flags["del"]
    assert "denyoom" in flags["set"] & flags["sadd"]


def test_the_fetch_settles_and_takes_jobs_while_redis_refuses_writes(
    oom_redis: redis_py.Redis,
) -> None:
    """The limit fetch moves queued jobs and settles finished ones out of memory, as a
    Redis 7 function too: Redis refuses a function without the ``allow-oom`` flag as a
    whole, where a script runs (limitd/connection/functions.py)."""
    jobs = [f'{{"class":"X","args":[{i}],"queue":"q"}}' for i in range(6)]
    oom_redis.lpush(keys.of(oom_redis).queue("q"), *jobs)
    fetch = limit_fetch(oom_redis, QueueOrder(["q"]), "c1")
    oom_redis.config_resetstat()
    first = fetch.take(2, [])
    refuse_writes(oom_redis)
    second = fetch.take(2, first)
    fetch.take(0, second)
    assert [len(first), len(second)] == [2, 2]
    assert oom_redis.llen(keys.of(oom_redis).queue("q")) == 2
    assert oom_redis.llen(keys.of(oom_redis).in_progress("c1", "q")) == 0
    stats = oom_redis.info("commandstats")
    assert "cmdstat_evalsha" not in stats, f"called as a function: {LIMIT_FETCH.function}"
    assert stats["cmdstat_fcall"]["calls"] >= 3


def test_vouch_keeps_a_live_key_while_redis_refuses_writes(oom_redis: redis_py.Redis) -> None:
    liveness.vouch(oom_redis, ["alive"], 0.25)
    assert oom_redis.pttl(keys.of(oom_redis).capsule_heartbeat("alive")) <= 1000
    refuse_writes(oom_redis)
    liveness.vouch(oom_redis, ["alive"], 10)
    assert oom_redis.pttl(keys.of(oom_redis).capsule_heartbeat("alive")) > 30_000
    # A capsule never vouched for needs SET: refused, though the other's key is kept.
    oom_redis.expire(keys.of(oom_redis).capsule_heartbeat("alive"), 1)
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        liveness.vouch(oom_redis, ["alive", "new"], 10)
    assert oom_redis.pttl(keys.of(oom_redis).capsule_heartbeat("alive")) > 30_000
    accept_writes(oom_redis)
    liveness.vouch(oom_redis, ["alive", "new"], 10)
    assert oom_redis.smembers(keys.of(oom_redis).CAPSULES) == {b"alive", b"new"}


def test_vouch_registers_again_a_capsule_dropped_from_the_set(oom_redis: redis_py.Redis) -> None:
    """A reaper may drop a capsule from the set while its key is being written again:
    the next vouch, finding the key but not the member, writes both."""
    liveness.vouch(oom_redis, ["alive"], 1)
    oom_redis.srem(keys.of(oom_redis).CAPSULES, "alive")
    liveness.vouch(oom_redis, ["alive"], 1)
    assert oom_redis.sismember(keys.of(oom_redis).CAPSULES, "alive")


# A reaper whose own beat failed


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_capsule_whose_beat_was_refused_reaps_nobody_for_an_expiry_period(
    oom_redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its own beat failed, a capsule judges nobody until it has beaten again for
    a full expiry period: the others, alive, have had the time to beat too."""
    fake = FakeClock()
    monkeypatch.setattr(clock, "monotonic", fake)
    capsule = Capsule(CapsuleConfig(queues=["oom"], heartbeat_period=5), redis=oom_redis)
    oom_redis.sadd(
        keys.of(oom_redis).CAPSULES, "silent"
    )  # registered, no heartbeat key: looks dead
    refuse_writes(oom_redis)
    with pytest.raises(redis_py.exceptions.OutOfMemoryError):
        capsule.beat()
    accept_writes(oom_redis)
    capsule.beat()
    fake.now += liveness.EXPIRY_PERIODS * 5 - 1
    capsule.beat()
    assert oom_redis.sismember(keys.of(oom_redis).CAPSULES, "silent"), (
        "reaped within the grace period"
    )
    fake.now += 1
    capsule.beat()
    assert not oom_redis.sismember(keys.of(oom_redis).CAPSULES, "silent"), "reaped after it"


def test_a_fresh_capsule_reaps_at_its_first_beat(oom_redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(queues=["oom"], heartbeat_period=5), redis=oom_redis)
    oom_redis.sadd(keys.of(oom_redis).CAPSULES, "silent")
    capsule.beat()
    assert not oom_redis.sismember(keys.of(oom_redis).CAPSULES, "silent")


# Telling the operator


def test_refusals_are_logged_once_a_minute_and_their_end_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeClock()
    monkeypatch.setattr(clock, "monotonic", fake)
    refusals = WriteRefusals()
    oom = redis_py.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'."
    )
    caplog.set_level(logging.INFO, logger="limitd.redis")
    for _ in range(100):
        assert refusals.note(oom, "heartbeat")
        fake.now += 0.25
    assert not refusals.note(redis_py.ConnectionError("gone"), "heartbeat")
    assert refusals.note(redis_py.ResponseError("MISCONF Redis is configured to save"), "x")
    assert refusals.note(redis_py.exceptions.ReadOnlyError("READONLY replica"), "x")
    fake.now += 60
    refusals.note(oom, "job counters")
    assert refusals.total == 103 and refusals.refusing
    refusals.accepted()
    refusals.accepted()
    assert not refusals.refusing
    lines = [r.getMessage() for r in caplog.records if r.name == "limitd.redis"]
    assert len(lines) == 3, lines
    assert lines[0].startswith("Redis refuses writes (command not allowed")
    assert "1 refused since the last report; last: heartbeat" in lines[0]
    assert "102 refused since the last report; last: job counters" in lines[1]
    assert lines[2] == "Redis accepts writes again (0 more refused before)"


def test_refusals_are_served_as_process_metrics() -> None:
    refusals = WriteRefusals()
    registry = CollectorRegistry()
    registry.register(RefusalCollector(refusals))
    text = generate_latest(registry).decode()
    assert "limitd_redis_refusing_writes 0.0" in text
    assert "limitd_redis_refused_writes_total 0.0" in text
    refusals.note(redis_py.exceptions.OutOfMemoryError("OOM"), "heartbeat")
    text = generate_latest(registry).decode()
    assert "limitd_redis_refusing_writes 1.0" in text
    assert "limitd_redis_refused_writes_total 1.0" in text


# Under limitd start

APP = textwrap.dedent("""
    import os, time, limitd

    def note(event, n):
        line = f"{event} {n} {os.getpid()} {time.monotonic():.6f}\\n".encode()
        fd = os.open(os.environ["OOM_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    @limitd.job(name="oom_app.Hold", queue="oom")
    def hold(n, seconds):
        note("start", n)
        time.sleep(seconds)
        note("end", n)
""")

JOBS = 16
LIMIT = 2  # over two processes of one job each: both hold a job when Redis fills
PERIOD = 0.25  # heartbeat: a silent capsule's key expires after 4 periods (1 s)
OOM_SECONDS = 3.0  # three expiry periods


def recorded(path: Path) -> list[tuple[str, int, int, float]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(event, int(n), int(pid), float(at)) for event, n, pid, at in rows]


def most_at_once(rows: list[tuple[str, int, int, float]]) -> int:
    running = peak = 0
    for event, *_ in sorted(rows, key=lambda row: (row[3], row[0] == "start")):
        running += 1 if event == "start" else -1
        peak = max(peak, running)
    return peak


def test_redis_out_of_memory_reaps_no_live_process_under_limitd_start(
    tmp_path: Path, own_redis_server: RedisServer, oom_redis: redis_py.Redis
) -> None:
    (tmp_path / "oom_app.py").write_text(APP)
    record = tmp_path / "record.txt"
    processes = LimitdProcesses(tmp_path, own_redis_server.url)
    processes.env["OOM_RECORD"] = str(record)
    try:
        supervisor = processes.start(
            "-r", "oom_app", "-q", "oom", "-c", "3", "-p", "2", "-t", "5",
            "--limit", f"oom={LIMIT}", "--process-limit", "oom=1",
            "--heartbeat-period", str(PERIOD),
        )  # fmt: skip
        wait_for(
            lambda: oom_redis.scard(keys.of(oom_redis).CAPSULES) == 2,
            timeout=20,
            message="2 capsules",
        )
        limitd.Client(oom_redis).push_bulk(
            {"class": "oom_app.Hold", "queue": "oom"}, [[n, 1.0] for n in range(JOBS)]
        )
        wait_for(
            lambda: sum(r[0] == "start" for r in recorded(record)) >= LIMIT,
            timeout=20,
            message="jobs running",
        )
        refuse_writes(oom_redis)
        deadline = time.monotonic() + OOM_SECONDS
        while time.monotonic() < deadline:  # the outage itself: Redis refuses throughout
            with pytest.raises(redis_py.exceptions.OutOfMemoryError):
                oom_redis.sadd("oom:probe:set", "1")
            time.sleep(0.05)
        accept_writes(oom_redis)
        wait_for(
            lambda: sum(r[0] == "end" for r in recorded(record)) >= JOBS,
            timeout=60,
            message="every job to end",
        )
        supervisor.terminate()
        assert supervisor.wait(timeout=20) == 0
    finally:
        processes.kill_all()
    rows = recorded(record)
    starts = sorted(n for event, n, *_ in rows if event == "start")
    assert starts == list(range(JOBS)), "every job ran exactly once"
    assert most_at_once(rows) <= LIMIT
    # Until the stop: capsules that stop on TERM are reaped by design.
    log = (tmp_path / "limitd.log").read_text().partition("received SIGTERM")[0]
    assert "stopped beating" not in log
    assert not re.search(r"requeued \d+ jobs", log), log
    assert 1 <= log.count("Redis refuses writes") <= 2, log  # one line per process
    assert log.count("Redis accepts writes again") == log.count("Redis refuses writes")
