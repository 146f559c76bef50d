"""Redis behind Sentinel, on real processes: a redis-server and a ``redis-server
--sentinel`` watching it, both on free ports. limitd connects through the sentinel by
URL or by the config's ``sentinels`` / ``service``, and everything that talks to Redis
(the client, a capsule, the async client, ``limitd start``) works through it.
A Redis that cannot be reached at start is named in the one line `limitd start` exits
with (status 69). Failover under load: ``test_sentinel_failover``."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.config import ConfigError, load_config
from limitd.connection import connect, loop_twin, sentinel
from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, wait_for
from tests.web import free_port

SERVICE = "mymaster"
done: list[int] = []


@limitd.job(name="sentinel_test.Mark")
def mark(n: int) -> None:
    done.append(n)


@pytest.fixture
def sentinel_url(tmp_path: Path) -> Iterator[str]:
    """A primary and one sentinel (quorum 1) watching it; the URL that names them."""
    primary = RedisServer()
    primary.start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
    )
    server = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen(
        [server, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        probe = redis_py.Redis(port=port, socket_timeout=1)
        wait_for(lambda: _answers(probe), message="the sentinel knows the primary")
        yield f"{sentinel.SCHEME}127.0.0.1:{port}/{SERVICE}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        primary.stop()


def _answers(probe: redis_py.Redis) -> bool:
    try:
        return probe.sentinel_get_master_addr_by_name(SERVICE) is not None
    except redis_py.ConnectionError:
        return False


def test_the_url_parses_and_bad_ones_say_why() -> None:
    where = sentinel.parse("redis+sentinel://:pw@a:26379,b:26380/svc/2")
    assert where == sentinel.SentinelAddress((("a", 26379), ("b", 26380)), "svc", 2, "pw")
    for bad, words in [
        ("redis+sentinel:///svc", "at least one sentinel"),
        ("redis+sentinel://a/svc", "host:port"),
        ("redis+sentinel://a:1", "/service"),
        ("redis+sentinel://a:1/svc/x", "database must be a number"),
    ]:
        with pytest.raises(ValueError, match=words):
            sentinel.parse(bad)


def test_the_config_names_sentinels_and_service(tmp_path: Path) -> None:
    conf = tmp_path / "app.yml"
    conf.write_text("redis: {sentinels: ['10.0.0.1:26379', '10.0.0.2:26379'], service: jobs}\n")
    assert load_config([str(conf)]).redis.url == (
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/jobs/0"
    )
    conf.write_text("redis: {sentinels: ['10.0.0.1:26379']}\n")
    with pytest.raises(ConfigError, match=r"redis\.service"):
        load_config([str(conf)])
    conf.write_text("redis: {url: 'redis+sentinel://nohost/jobs'}\n")
    with pytest.raises(ConfigError, match=r"redis\.url.*host:port"):
        load_config([str(conf)])


def test_a_client_and_a_capsule_work_through_the_sentinel(sentinel_url: str) -> None:
    conn = connect(sentinel_url)
    limitd.set_default_client(limitd.Client(conn))
    done.clear()
    try:
        mark.perform_bulk([[n] for n in range(5)])
        outcomes = Capsule(CapsuleConfig(), redis=conn).drain()
        assert outcomes == {"done": 5} and sorted(done) == list(range(5))
        assert conn.llen(keys.of(conn).queue("default")) == 0
    finally:
        limitd.set_default_client(None)


def test_the_async_client_asks_the_same_sentinel(sentinel_url: str) -> None:
    conn = connect(sentinel_url)
    conn.flushall()
    limitd.set_default_client(limitd.Client(conn))

    async def push() -> str | None:
        jid = await mark.aio.perform_async(7)
        await loop_twin(conn).aclose()
        return jid

    try:
        assert asyncio.run(push()) is not None
        assert conn.llen(keys.of(conn).queue("default")) == 1
    finally:
        limitd.set_default_client(None)


def test_limitd_start_drains_through_the_sentinel(sentinel_url: str, tmp_path: Path) -> None:
    conn = connect(sentinel_url)
    conn.flushall()
    app = tmp_path / "sentinel_app.py"
    app.write_text(
        "import limitd\n\n@limitd.job(name='sentinel_app.Count')\n"
        "def count():\n    limitd.default_client().redis.incr('sentinel:count')\n"
    )
    limitd.set_default_client(limitd.Client(conn))
    try:
        for _ in range(20):
            limitd.default_client().push({"class": "sentinel_app.Count", "args": []})
    finally:
        limitd.set_default_client(None)
    processes = LimitdProcesses(tmp_path, sentinel_url)
    processes.env["PYTHONPATH"] = str(tmp_path)
    supervisor = processes.start("-r", "sentinel_app", "-c", "4")
    try:
        wait_for(lambda: conn.get("sentinel:count") == b"20", timeout=30, message="20 jobs")
    finally:
        processes.kill_all()
    assert supervisor.returncode is not None


def _start_fails(url: str, tmp_path: Path) -> str:
    """``limitd start`` against ``url``: it must exit 69 at once; returns its last line."""
    processes = LimitdProcesses(tmp_path, url)
    proc = processes.start("-r", "json")
    try:
        assert proc.wait(30) == 69
    finally:
        processes.kill_all()
    return (tmp_path / "limitd.log").read_text().strip().splitlines()[-1]


def test_start_names_the_service_the_sentinels_do_not_know(
    sentinel_url: str, tmp_path: Path
) -> None:
    line = _start_fails(sentinel_url.replace(f"/{SERVICE}/", "/nosuch/"), tmp_path)
    assert "monitor no service 'nosuch' (they monitor 'mymaster')" in line


def test_start_names_each_silent_sentinel(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    url = f"{sentinel.SCHEME}127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/{SERVICE}"
    line = _start_fails(url, tmp_path)
    assert "none of the sentinels answered" in line
    assert all(f"127.0.0.1:{port} (" in line for port in ports)


def test_start_names_a_plain_redis_that_does_not_answer(tmp_path: Path) -> None:
    port = free_port()
    line = _start_fails(f"redis://:secret@127.0.0.1:{port}/0", tmp_path)
    assert f"cannot reach Redis: redis://:***@127.0.0.1:{port}/0 does not answer" in line


def test_the_async_twin_waits_for_a_connection_past_its_cap(sentinel_url: str) -> None:
    """150 calls at once on a twin of 100 connections: all answered, none refused."""
    conn = connect(sentinel_url)

    async def many() -> list[object]:
        twin = loop_twin(conn)
        try:
            return await asyncio.gather(*(twin.blpop(["nothing"], 0.2) for _ in range(150)))
        finally:
            await twin.aclose()

    assert asyncio.run(many()) == [None] * 150
