"""Fair queues under ``limitd start``: two processes of ten threads, a flooding tenant
and small ones, a tenant limit, and a child killed with SIGKILL in the middle. Jobs
measure their tenant's concurrency themselves in Redis."""

from __future__ import annotations

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
from limitd.api import fair_queue_status, make_fair
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, children, wait_for

APP = textwrap.dedent('''
    import os, time, limitd
    from limitd.client import default_client

    ENTER = """
    local n = redis.call('INCR', KEYS[1])
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
    """

    @limitd.job(name="fairp.Work", queue="fairq")
    def work(tenant, n, hold):
        r = default_client().redis
        r.eval(ENTER, 2, f"f:running:{tenant}", f"f:peak:{tenant}")
        r.rpush("f:order", tenant)
        time.sleep(hold)
        pipe = r.pipeline()
        pipe.decr(f"f:running:{tenant}")
        pipe.sadd("f:done", f"{tenant}-{n}")
        pipe.execute()
''')


@pytest.fixture
def start(
    tmp_path: Path, redis_server: RedisServer
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    (tmp_path / "fairp_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, redis_server.url)
    yield lambda *flags: processes.start("-r", "fairp_app", "-q", "fairq", "-c", "10", *flags)
    processes.kill_all()


def push(redis: redis_py.Redis, tenant: str, count: int, hold: float) -> None:
    limitd.Client(redis).push_bulk(
        {"class": "fairp.Work", "queue": "fairq", "fair_tenant": tenant},
        [[tenant, n, hold] for n in range(count)],
    )


def done(redis: redis_py.Redis) -> int:
    return int(redis.scard("f:done"))


def test_small_tenants_run_within_the_first_rounds_behind_a_flood(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    make_fair("fairq", redis=redis)
    push(redis, "flood", 2000, 0.001)
    for small in range(20):
        push(redis, f"small{small:02d}", 3, 0.001)
    supervisor = start("-p", "2")  # every job waiting before the first fetch
    wait_for(lambda: done(redis) == 2060, timeout=120, message="every job")
    order = [tenant.decode() for tenant in redis.lrange("f:order", 0, -1)]
    last_small = max(i for i, tenant in enumerate(order) if tenant.startswith("small"))
    # Three rounds of 21 tenants, plus the jobs of calls in flight: far ahead of the
    # 2,000 the flooding tenant had waiting.
    assert last_small < 150, last_small
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0


def test_a_sigkilled_child_strands_no_tenant_slot(
    start: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    """Tenant limit 2 with two processes of ten threads: a child killed while it runs
    jobs of every tenant. Every job still runs, no tenant exceeds 2 before the kill,
    and once the reaper has returned the dead child's jobs, no slot stays counted."""
    make_fair("fairq", tenant_limit=2, redis=redis)
    tenants = [f"t{i}" for i in range(6)]
    for tenant in tenants:
        push(redis, tenant, 60, 0.02)
    supervisor = start("-p", "2", "--heartbeat-period", "1")
    wait_for(lambda: done(redis) >= 60, timeout=60, message="work in progress")
    peaks = {t: int(redis.get(f"f:peak:{t}") or 0) for t in tenants}
    assert max(peaks.values()) <= 2, peaks
    victim = children(supervisor.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: done(redis) == 360, timeout=90, message="every job, at least once")
    state = keys.of(redis).fair_part("fairq", "state")

    def no_slot_counted() -> bool:
        return not [f for f in redis.hkeys(state) if f.startswith((b"b:", b"r:"))]

    wait_for(no_slot_counted, timeout=15, message="every tenant slot freed")
    status = fair_queue_status("fairq", redis=redis)
    assert status is not None and status.jobs_waiting == 0 and status.tenants_waiting == 0
    assert victim not in children(supervisor.pid)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0
