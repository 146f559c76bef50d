"""A Sentinel failover under load, on real processes: a primary, two replicas and three
sentinels; ``limitd start`` drains a limited queue while a client keeps enqueueing;
the primary is SIGKILLed mid-run. With ``wait_replicas=1`` every push the client saw
succeed must run, the limit must hold throughout, and no slot may stay taken.

Jobs record what happened in a separate Redis (the witness), which the failover does
not touch: how often each job ran, and the most jobs that ran at once."""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.connection import connect, replication
from limitd.connection.embedded import RedisServer
from limitd.queues import limits as queue_limits
from tests.helpers import LimitdProcesses, wait_for
from tests.topologies import SentinelGroup

JOBS = 5000
LIMIT = 3
CHUNK = 25
BACKLOG = 400  # jobs the client keeps waiting ahead of the workers
KILL_AFTER = 1500  # jobs run before the primary is killed
MAX_PAUSE = 20.0  # seconds the client may go without a successful push

APP = textwrap.dedent('''
    import os, time, limitd, redis

    WITNESS = redis.Redis.from_url(os.environ["WITNESS_URL"])
    ENTER = WITNESS.register_script("""
    local n = redis.call('INCR', KEYS[1])
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
    """)

    @limitd.job(name="failover.Work", queue="limited")
    def work(n):
        ENTER(keys=["running", "peak"])
        time.sleep(0.001)
        pipe = WITNESS.pipeline()
        pipe.decr("running")
        pipe.hincrby("runs", n, 1)
        pipe.execute()
''')


@dataclass
class Enqueuer:
    """Pushes JOBS jobs in chunks, keeping BACKLOG ahead of what ran; notes which pushes
    were confirmed and the longest time between two successful pushes."""

    client: limitd.Client
    witness: redis_py.Redis
    confirmed: set[int] = field(default_factory=set)
    unconfirmed: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    longest_pause: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        last = time.monotonic()
        for start in range(0, JOBS, CHUNK):
            numbers = list(range(start, min(start + CHUNK, JOBS)))
            wait_for(lambda s=start: s - self.witness.hlen("runs") < BACKLOG, timeout=60)
            while True:
                try:
                    self.client.push_bulk(
                        {"class": "failover.Work", "queue": "limited"}, [[n] for n in numbers]
                    )
                    self.confirmed.update(numbers)
                except replication.NotReplicated:
                    self.unconfirmed.update(numbers)
                except redis_py.RedisError as exc:  # primary gone: try the chunk again
                    self.errors.append(repr(exc))
                    time.sleep(0.05)  # paces retries against a dead primary; not an assertion
                    continue
                break
            now = time.monotonic()
            self.longest_pause = max(self.longest_pause, now - last)
            last = now
        self.done.set()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis")
    group.start()
    yield group
    group.stop()


@pytest.fixture
def witness() -> Iterator[redis_py.Redis]:
    server = RedisServer()
    server.start()
    yield server.client()
    server.stop()


def test_a_killed_primary_fails_over_without_losing_confirmed_jobs(
    group: SentinelGroup, witness: redis_py.Redis, tmp_path: Path
) -> None:
    url = f"{group.url}?wait_replicas=1&wait_timeout=0.5"
    (tmp_path / "failover_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, url)
    processes.env["PYTHONPATH"] = str(tmp_path)
    processes.env["WITNESS_URL"] = witness.connection_pool.connection_kwargs and (
        f"redis://127.0.0.1:{witness.connection_pool.connection_kwargs['port']}/0"
    )
    conn = connect(url, socket_timeout=2, connect_timeout=1)
    enqueuer = Enqueuer(limitd.Client(conn), witness)
    pusher = threading.Thread(target=enqueuer.run, daemon=True)
    processes.start(
        "-r", "failover_app", "-q", "limited", "-p", "2", "-c", "5",
        "--limit", f"limited={LIMIT}", "--heartbeat-period", "1",
    )  # fmt: skip
    try:
        pusher.start()
        wait_for(lambda: witness.hlen("runs") >= KILL_AFTER, timeout=60, message="jobs running")
        old_port = group.primary.port
        group.primary.kill()
        wait_for(lambda: group.primary_port() != old_port, timeout=30, message="a failover")
        assert enqueuer.done.wait(120), "the client stopped enqueueing"
        wait_for(
            lambda: enqueuer.confirmed <= {int(n) for n in witness.hkeys("runs")},
            timeout=60,
            message="every confirmed job run",
        )
        # What the capsules still hold in Redis must drain to nothing: orphaned entries
        # (fetches whose reply the failover cut) are requeued and run within beats.
        wait_for(
            lambda: queue_limits.busy(conn, "limited") == 0 and not _in_progress(conn),
            timeout=30,
            message="no slot left taken",
        )
    finally:
        processes.kill_all()
    runs = {int(n): int(count) for n, count in witness.hgetall("runs").items()}
    duplicates = sum(count - 1 for count in runs.values())
    print(
        f"\nfailover: {len(enqueuer.confirmed)} confirmed pushes, {len(enqueuer.unconfirmed)} "
        f"unconfirmed, {len(runs)} distinct jobs ran, {duplicates} duplicate runs, client "
        f"errors {len(enqueuer.errors)}, longest pause {enqueuer.longest_pause:.1f}s"
    )
    assert int(witness.get("peak")) <= LIMIT, "the limit held across the failover"
    assert enqueuer.longest_pause < MAX_PAUSE
    assert conn.llen(keys.of(conn).queue("limited")) == 0


def _in_progress(conn: redis_py.Redis) -> list[bytes]:
    return list(conn.scan_iter("limitd:capsule:*:inprogress:*"))
