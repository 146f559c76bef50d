"""Limits and crash recovery across real processes: ``limitd start`` forks capsule
children; tests send real signals. Jobs measure concurrency themselves in Redis (a
counter per process and in total, with the peak kept by an atomic script)."""

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
from limitd.queues import limits as queue_limits
from tests.helpers import LimitdProcesses, children, in_progress_total, running, wait_for

APP = textwrap.dedent('''
    import os, time, limitd
    from limitd.client import default_client

    ENTER = """
    local n = redis.call('INCR', KEYS[1])
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
    local p = redis.call('INCR', KEYS[3])
    if p > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], p) end
    """

    @limitd.job(name="meter.Work", queue="limited")
    def work(n, hold=0.002):
        r = default_client().redis
        pid = os.getpid()
        r.eval(ENTER, 4, "m:running", "m:peak", f"m:running:{pid}", f"m:peak:{pid}")
        time.sleep(hold)
        pipe = r.pipeline()
        pipe.decr("m:running")
        pipe.decr(f"m:running:{pid}")
        pipe.sadd("m:done", n)
        pipe.execute()
''')


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "meter_app.py").write_text(APP)
    return tmp_path


@pytest.fixture
def start(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts ``limitd start`` on the meter app with extra flags."""
    processes = LimitdProcesses(app_dir, redis_server.url)
    yield lambda *flags: processes.start(
        "-r", "meter_app", "-q", "limited", "-c", "10", "-t", "2", *flags
    )
    processes.kill_all()


def wait_capsules(redis: redis_py.Redis, count: int) -> None:
    wait_for(
        lambda: redis.scard(keys.of(redis).CAPSULES) == count,
        timeout=15,
        message=f"{count} capsules registered",
    )


def beat_counter(redis: redis_py.Redis, other_than: int) -> Callable[[], int]:
    """Counts the heartbeats of the capsule process that is not ``other_than``, seen as
    changes of the ``beat`` time in its Sidekiq process record."""
    identity = next(
        i
        for i in redis.smembers(keys.of(redis).PROCESSES)
        if json.loads(redis.hget(i, "info"))["pid"] != other_than
    )
    seen: set[bytes] = set()

    def count() -> int:
        seen.add(redis.hget(identity, "beat"))
        return len(seen) - 1

    return count


def push_work(redis: redis_py.Redis, count: int, hold: float = 0.002) -> None:
    """``count`` jobs that each run ``hold`` seconds, pushed by the name the app defines."""
    limitd.Client(redis).push_bulk(
        {"class": "meter.Work", "queue": "limited"}, [[i, hold] for i in range(count)]
    )


def peaks(redis: redis_py.Redis) -> dict[str, int]:
    return {k.decode(): int(redis.get(k)) for k in redis.scan_iter("m:peak*")}


def done(redis: redis_py.Redis) -> int:
    return int(redis.scard("m:done"))


@pytest.mark.parametrize(
    ("flags", "global_peak", "process_peak"),
    [
        # A thread that settles a job takes the next in the same call, so under a
        # global limit one process may keep every slot while the backlog lasts.
        (["--limit", "limited=3"], 3, None),
        (["--process-limit", "limited=2"], 4, 2),
        # 3 slots, 2 per process: both processes must run jobs, one may stay at 1.
        (["--limit", "limited=3", "--process-limit", "limited=2"], 3, 2),
    ],
)
def test_limits_hold_across_two_processes(
    start: Callable[..., subprocess.Popen[bytes]],
    redis: redis_py.Redis,
    flags: list[str],
    global_peak: int,
    process_peak: int | None,
) -> None:
    supervisor = start("-p", "2", *flags)
    wait_capsules(redis, 2)
    push_work(redis, 2000)
    wait_for(lambda: done(redis) == 2000, timeout=120, message="2000 jobs")
    found = peaks(redis)
    assert found.pop("m:peak") == global_peak
    if process_peak is not None:
        assert max(found.values()) == process_peak
        assert sum(found.values()) >= global_peak, "every process kept to its limit"
    # The last jobs counted themselves done in perform; their slots are freed by the
    # settle their processors send with their next take, a moment later.
    wait_for(lambda: queue_limits.busy(redis, "limited") == 0, timeout=15, message="slots freed")
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0


def test_sigkill_of_a_child_loses_no_job(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    supervisor = start("-p", "2", "--limit", "limited=6", "--heartbeat-period", "1")
    wait_capsules(redis, 2)
    push_work(redis, 500, hold=0.02)
    wait_for(lambda: done(redis) >= 100, timeout=30, message="work in progress")
    victim = children(supervisor.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: done(redis) == 500, timeout=60, message="every job, at least once")
    wait_for(lambda: queue_limits.busy(redis, "limited") == 0, message="slots freed")
    assert in_progress_total(redis) == 0
    wait_capsules(redis, 2)  # the child was restarted
    assert victim not in children(supervisor.pid)


def test_crash_of_a_whole_host_is_recovered_by_the_other(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    """Supervisor and child die together (SIGKILL to the process group): nobody reaps
    on their behalf, so the other host's heartbeat must, once the key has expired."""
    period = 0.5
    doomed = start("--limit", "limited=4", "--heartbeat-period", str(period))
    wait_capsules(redis, 1)
    doomed_id = redis.smembers(keys.of(redis).CAPSULES).pop().decode()
    push_work(redis, 40, hold=0.5)
    wait_for(lambda: queue_limits.busy(redis, "limited") == 4, message="slots held")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    start("--limit", "limited=4", "--heartbeat-period", str(period))
    # 4 periods for the key to expire, then at most one period to the next reaper run;
    # the extra 3 s absorb the survivor's start-up.
    wait_for(
        lambda: not redis.sismember(keys.of(redis).CAPSULES, doomed_id),
        timeout=4 * period + period + 3,
        message="the dead capsule reaped",
    )
    wait_for(lambda: done(redis) == 40, timeout=60, message="every job, at least once")
    wait_for(lambda: queue_limits.busy(redis, "limited") == 0, message="slots freed")


def test_a_stopped_child_is_vouched_for_and_the_limit_holds(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    period = 0.5
    supervisor = start("-p", "2", "--limit", "limited=3", "--heartbeat-period", str(period))
    wait_capsules(redis, 2)
    push_work(redis, 300, hold=0.05)
    wait_for(lambda: done(redis) >= 30, timeout=30, message="work in progress")
    frozen = children(supervisor.pid)[0]
    os.kill(frozen, signal.SIGSTOP)
    try:
        # The other child beats (and reaps) every period: six of its beats are well
        # past the 4 periods after which a silent capsule is reaped.
        beats = beat_counter(redis, other_than=frozen)
        wait_for(lambda: beats() >= 6, timeout=30, message="six beats of the other child")
        assert redis.scard(keys.of(redis).CAPSULES) == 2, "the stopped child was not reaped"
        assert queue_limits.busy(redis, "limited") <= 3
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_for(lambda: done(redis) == 300, timeout=60, message="every job")
    assert peaks(redis)["m:peak"] == 3
    wait_for(lambda: queue_limits.busy(redis, "limited") == 0, message="slots freed")
    assert in_progress_total(redis) == 0


def test_children_do_not_outlive_a_killed_supervisor(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    supervisor = start("-p", "2")
    wait_capsules(redis, 2)
    pids = children(supervisor.pid)
    push_work(redis, 4, hold=5)
    wait_for(lambda: queue_limits.busy(redis, "limited") == 4, message="jobs running")
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait()

    def gone() -> bool:
        return not any(running(pid) for pid in pids)

    wait_for(gone, timeout=10, message="children to exit")
    assert redis.llen(keys.of(redis).queue("limited")) == 4, "their jobs were requeued"
    assert queue_limits.busy(redis, "limited") == 0
