"""``limitd.redis_client()``: the jobs' own Redis client, one connection per thread, with
redis-py's results, errors and retries, against real servers."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

import limitd
from limitd.connection import connect
from limitd.connection.embedded import RedisServer
from limitd.connection.pinned import PinnedRedis, pinned
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, wait_for
from tests.topologies import SentinelGroup


def test_results_are_redis_pys(redis: redis_py.Redis) -> None:
    client = limitd.redis_client()
    assert isinstance(client, PinnedRedis)
    assert client.set("name", "é") is True
    assert client.get("name") == "é".encode()
    assert client.incr("n") == 1 and client.incrbyfloat("f", 0.5) == 0.5
    assert client.hset("h", mapping={"a": 1, "b": "x"}) == 2
    assert client.hgetall("h") == {b"a": b"1", b"b": b"x"}
    client.zadd("z", {"one": 1.5, "two": 2})
    assert client.zrange("z", 0, -1, withscores=True) == [(b"one", 1.5), (b"two", 2.0)]
    assert client.expire("name", 60) is True and 0 < client.ttl("name") <= 60
    assert sorted(client.scan_iter("*")) == sorted(redis.keys("*"))
    assert client.client_setname("job-client") is True  # a two-word command
    assert client.client_getname() == "job-client"
    assert client.get("missing") is None


def test_decoded_responses_and_other_encodings_are_kept(redis: redis_py.Redis) -> None:
    kwargs = _address(redis)
    decoded = pinned(redis_py.Redis(**kwargs, decode_responses=True))  # type: ignore[arg-type]
    decoded.set("s", "é")
    assert decoded.get("s") == "é" and decoded.hgetall("missing") == {}
    plain = redis_py.Redis(**kwargs, encoding="latin-1")  # type: ignore[arg-type]
    plain.set("plain", "é")
    pinned(plain).set("pinned", "é")
    assert redis.get("pinned") == redis.get("plain"), "packed as redis-py packs it"


def test_errors_are_redis_pys_and_the_connection_stays_usable(redis: redis_py.Redis) -> None:
    client = limitd.redis_client()
    client.set("text", "x")
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
        client.lpush("text", 1)
    with pytest.raises(redis_py.DataError):
        client.set("flag", True)  # type: ignore[arg-type]  # redis-py refuses a bool
    with pytest.raises(redis_py.DataError):
        client.set("none", None)  # type: ignore[arg-type]
    assert client.incr("after") == 1


def test_each_thread_has_one_connection_of_its_own(redis: redis_py.Redis) -> None:
    client = limitd.redis_client()
    pool = redis.connection_pool
    created_before = len(pool._available_connections) + len(pool._in_use_connections)
    ids: dict[str, set[int]] = {}

    def work(name: str) -> None:
        ids[name] = {client.client_id() for _ in range(20)}

    threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(len(seen) == 1 for seen in ids.values()), ids  # the same one each time
    assert len(set.union(*ids.values())) == 5  # and not another thread's
    after = len(pool._available_connections) + len(pool._in_use_connections)
    assert after == created_before, "the shared pool lent no connection"
    with client.pipeline() as pipe:  # what needs a pool still has one
        assert pipe.incr("p").incr("p").execute() == [1, 2]


def test_an_idle_connection_the_server_closed_is_made_again(redis: redis_py.Redis) -> None:
    client = limitd.redis_client()
    assert isinstance(client, PinnedRedis)
    first = client.client_id()
    assert redis.client_kill_filter(_id=first) == 1
    client.idle_check_seconds = 0.0  # as if it had been idle past the check
    assert client.incr("after-kill") == 1, "sent on a new connection"
    assert client.client_id() != first


def test_a_busy_connection_the_server_closed_follows_the_retry_policy(
    redis: redis_py.Redis,
) -> None:
    kwargs = _address(redis)
    once = pinned(redis_py.Redis(**kwargs, retry=Retry(NoBackoff(), 1)))  # type: ignore[arg-type]
    never = pinned(redis_py.Redis(**kwargs, retry=Retry(NoBackoff(), 0)))  # type: ignore[arg-type]
    for client in (once, never):
        redis.client_kill_filter(_id=client.client_id())
    assert once.incr("retried") == 1
    with pytest.raises(redis_py.ConnectionError):
        never.incr("not-retried")
    assert never.incr("not-retried") == 1, "the failed connection was dropped"


def test_a_forked_child_does_not_share_its_parents_socket(redis: redis_py.Redis) -> None:
    client = limitd.redis_client()
    parent = client.client_id()
    pid = os.fork()
    if pid == 0:  # the child: record its connection's id and leave at once
        try:
            redis_py.Redis(**_address(redis)).set("child", client.client_id())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert int(redis.get("child") or 0) not in (0, parent)
    assert client.client_id() == parent, "the parent's connection is untouched"


def _address(redis: redis_py.Redis) -> dict[str, object]:
    kwargs = redis.connection_pool.connection_kwargs
    return {"host": kwargs["host"], "port": kwargs["port"], "db": kwargs.get("db", 0)}


@limitd.job(name="pinned_test.Count")
def count(page: str) -> None:
    limitd.redis_client().incr(f"visits:{page}")


def test_a_capsule_job_counts_through_it(redis: redis_py.Redis) -> None:
    for page in ["a", "b", "a"]:
        count.perform_async(page)
    capsule = Capsule(CapsuleConfig(concurrency=2), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: redis.get("visits:a") == b"2" and redis.get("visits:b") == b"1")
    finally:
        capsule.stop(timeout=2)


def test_on_a_cluster_it_is_the_cluster_client(clustered: redis_py.Redis) -> None:
    client = limitd.redis_client()
    assert client is clustered
    assert client.incr("visits:{x}") == 1


def test_on_sentinel_it_follows_a_failover(tmp_path: Path) -> None:
    group = SentinelGroup(tmp_path / "redis", replicas=1)
    group.start()
    try:
        client = pinned(connect(group.url))
        assert client.incr("n") == 1
        group.primary.kill()  # SIGKILL: the sentinels promote the replica
        wait_for(lambda: _incr_works(client), timeout=30, message="a write to the new primary")
        assert client.get("n") is not None
        new = group.replicas[0].client()
        assert new.info("replication")["role"] == "master"
    finally:
        group.stop()


def _incr_works(client: redis_py.Redis) -> bool:
    try:
        client.incr("n")
        return True
    except (redis_py.ConnectionError, redis_py.ReadOnlyError):
        return False


APP = """
import os
import threading

import limitd


@limitd.job(name="pinned_app.Touch")
def touch(i):
    client = limitd.redis_client()
    where = f"{os.getpid()}:{threading.get_ident()}"
    client.sadd("threads", where)
    client.sadd(f"connections:{where}", client.client_id())
    client.incr("done")
"""


def test_under_limitd_start_each_processor_thread_keeps_one_connection(
    tmp_path: Path, own_redis_server: RedisServer
) -> None:
    (tmp_path / "pinned_app.py").write_text(APP)
    redis = own_redis_server.client()
    client = limitd.Client(redis)
    for i in range(200):
        client.push({"class": "pinned_app.Touch", "args": [i]})
    processes = LimitdProcesses(tmp_path, own_redis_server.url)
    processes.start("-r", "pinned_app", "-p", "2", "-c", "3")
    try:
        wait_for(lambda: redis.get("done") == b"200", timeout=30, message="200 jobs")
    finally:
        processes.kill_all()
    threads = [where.decode() for where in redis.smembers("threads")]
    assert 1 <= len(threads) <= 6, "no more threads than 2 x 3 processors"
    connections = [redis.smembers(f"connections:{where}") for where in threads]
    assert all(len(ids) == 1 for ids in connections), "one connection per thread, kept"
    assert len(set.union(*connections)) == len(threads), "none shared between threads"


def test_a_server_that_stops_answering_times_out_in_the_kernel(tmp_path: Path) -> None:
    """The socket is blocking with SO_RCVTIMEO (no poll before each receive), and a
    server that stops answering (SIGSTOP) still fails the command after socket_timeout,
    the connection dropped."""
    import signal
    import socket
    import struct
    import time

    server = RedisServer(data_dir=str(tmp_path))
    server.start()
    try:
        base = redis_py.Redis(port=server.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
        client = pinned(base)
        assert client.incr("before") == 1
        sock = client._local.own.connection._sock  # type: ignore[attr-defined]
        assert sock.gettimeout() is None
        timeout = struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
        assert timeout == (0, 300_000)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(redis_py.ConnectionError):
                client.incr("while-stopped")
            assert time.monotonic() - started < 5.0
            assert client._local.own.connection._sock is None, "dropped"  # type: ignore[attr-defined]
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert client.incr("after") == 1
    finally:
        server.stop()


def test_an_idle_check_hands_the_timeout_back_to_the_kernel(redis: redis_py.Redis) -> None:
    client = pinned(redis_py.Redis(**_address(redis), socket_timeout=5))  # type: ignore[arg-type]
    assert isinstance(client, PinnedRedis)
    client.ping()
    client.idle_check_seconds = 0.0  # the next command looks at the socket first
    assert client.incr("looked-at") == 1
    sock = client._local.own.connection._sock  # type: ignore[attr-defined]
    assert sock.gettimeout() is None, "can_read gave it a Python timeout; taken back"
