"""The process list and the stats tell the truth: a reaped capsule's Sidekiq process
record goes with it (not 60 s later), and the job counters reach Redis within about a
second of the jobs, whatever the heartbeat period."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection.embedded import RedisServer
from limitd.fetch import liveness
from limitd.supervisor import Capsule, CapsuleConfig, cpu_affinity
from limitd.supervisor.heartbeat import ProcessRecord, WorkItem, new_identity
from tests.helpers import LimitdProcesses, children, wait_for

STATS_DEADLINE = 3.0  # "within about a second", with room for a busy 2-core machine

ran: list[int] = []


@limitd.job(name="record_test.Quick")
def quick(n: int) -> None:
    ran.append(n)


def write_record(redis: redis_py.Redis, capsule_id: str) -> str:
    """A process record as a capsule ``capsule_id`` writes it, running one job, with a
    signal waiting for it."""
    identity = new_identity(capsule_id, keys.of(redis))
    work = [WorkItem("t1", "default", b'{"jid":"x"}', 0.0)]
    ProcessRecord(identity, {"capsule_id": capsule_id}, lambda: work).write(redis)
    redis.lpush(keys.process_signals(identity), "TSTP")
    return identity


def record_keys(identity: str) -> list[str]:
    return [
        identity,
        keys.process_work(identity),
        keys.process_workers(identity),
        keys.process_signals(identity),
    ]


@pytest.fixture(params=["standalone", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> Iterator[redis_py.Redis]:
    """The suite's Redis in both key layouts (the identity carries the cluster tag)."""
    name = "redis" if request.param == "standalone" else "clustered"
    yield request.getfixturevalue(name)


def test_retire_removes_the_capsules_process_record(any_redis: redis_py.Redis) -> None:
    dead = write_record(any_redis, "c0ffee")
    alive = write_record(any_redis, "beef")
    assert any_redis.exists(*record_keys(dead)) == 4
    liveness.retire(any_redis, "c0ffee", "killed")
    assert any_redis.smembers(keys.of(any_redis).PROCESSES) == {alive.encode()}
    assert any_redis.exists(*record_keys(dead)) == 0
    assert any_redis.exists(*record_keys(alive)) == 4


def test_the_heartbeat_reaper_removes_the_record_too(any_redis: redis_py.Redis) -> None:
    liveness.vouch(any_redis, ["gone", "here"], 1)
    dead = write_record(any_redis, "gone")
    alive = write_record(any_redis, "here")
    any_redis.delete(keys.of(any_redis).capsule_heartbeat("gone"))  # as if it expired
    assert liveness.reap_dead(any_redis) == {"gone": 0}
    assert any_redis.smembers(keys.of(any_redis).PROCESSES) == {alive.encode()}
    assert any_redis.exists(*record_keys(dead)) == 0


def test_forget_matches_the_whole_capsule_id(redis: redis_py.Redis) -> None:
    """An id that ends another's is not mistaken for it; Ruby's records are left alone."""
    kept = write_record(redis, "abc123")
    redis.sadd(keys.of(redis).PROCESSES, "ruby-host:42:0123456789ab")
    liveness.forget_process(redis, "123")
    assert redis.smembers(keys.of(redis).PROCESSES) == {kept.encode(), b"ruby-host:42:0123456789ab"}


def test_counters_reach_redis_within_a_second_not_a_heartbeat(redis: redis_py.Redis) -> None:
    ran.clear()
    capsule = Capsule(CapsuleConfig(concurrency=2, heartbeat_period=30), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: redis.exists(keys.of(redis).PROCESSES), message="the first beat")
        for n in range(20):
            quick.perform_async(n)
        wait_for(lambda: len(ran) == 20, message="20 jobs")
        wait_for(
            lambda: redis.get(keys.of(redis).STAT_PROCESSED) == b"20",
            timeout=STATS_DEADLINE,
            message="stat:processed at 20",
        )
        assert redis.get(keys.of(redis).STAT_FAILED) is None
    finally:
        capsule.stop(timeout=2)


# Under limitd start

APP = textwrap.dedent("""
    import limitd
    from limitd.client import default_client

    @limitd.job(name="record_app.Done", queue="work")
    def done(n):
        default_client().redis.sadd("done", n)
""")


@pytest.fixture
def start(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    (tmp_path / "record_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    yield lambda *flags: processes.start("-r", "record_app", "-q", "work", "-t", "2", *flags)
    processes.kill_all()


def pids_listed(redis: redis_py.Redis) -> list[int]:
    """Pids of the processes in ``processes``, from their records."""
    infos = [redis.hget(identity, "info") for identity in redis.smembers(keys.of(redis).PROCESSES)]
    return sorted(json.loads(info)["pid"] for info in infos if info)


def test_a_killed_childs_record_goes_at_once_and_its_replacement_shows(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    supervisor = start("-p", "2", "--heartbeat-period", "30")
    supervisor_pid = supervisor.pid
    wait_for(lambda: len(pids_listed(redis)) == 2, timeout=20, message="2 process records")
    victim = children(supervisor_pid)[0]
    [identity] = [
        i for i in redis.smembers(keys.of(redis).PROCESSES) if f":{victim}:".encode() in i
    ]
    os.kill(victim, signal.SIGKILL)
    # The supervisor reaps the child at once: far under the record's 60 s expiry.
    wait_for(
        lambda: victim not in pids_listed(redis), timeout=10, message="the dead record removed"
    )
    assert redis.exists(identity, *record_keys(identity.decode())[1:]) == 0
    wait_for(lambda: len(pids_listed(redis)) == 2, timeout=20, message="the replacement's record")
    assert victim not in pids_listed(redis)


def test_counters_are_current_within_a_second_under_limitd_start(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    start("-c", "4", "--heartbeat-period", "30")
    wait_for(lambda: len(pids_listed(redis)) == 1, timeout=20, message="the process record")
    limitd.Client(redis).push_bulk(
        {"class": "record_app.Done", "queue": "work"}, [[n] for n in range(50)]
    )
    wait_for(lambda: redis.scard("done") == 50, timeout=30, message="50 jobs")
    wait_for(
        lambda: redis.get(keys.of(redis).STAT_PROCESSED) == b"50",
        timeout=STATS_DEADLINE,
        message="stat:processed at 50",
    )


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU sets")
def test_a_process_record_tells_the_cpus_its_process_runs_on_now(
    redis: redis_py.Redis,
) -> None:
    """``cpu_affinity: auto`` moves a process, or lets it go, after its record was made:
    each refresh says where it runs now. A record written for another process (an
    admin tool, a test) keeps what it was given."""
    mine = ProcessRecord("host:1:own", {"pid": os.getpid(), "cpus": "99"}, lambda: [])
    other = ProcessRecord("host:2:other", {"pid": os.getpid() + 1, "cpus": "99"}, lambda: [])
    mine.write(redis)
    other.write(redis)
    now = cpu_affinity.current()
    assert json.loads(redis.hget("host:1:own", "info") or b"{}")["cpus"] == now
    assert json.loads(redis.hget("host:2:other", "info") or b"{}")["cpus"] == "99"
