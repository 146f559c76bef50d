"""The client: middleware chain, argument checks, bulk routing and failover."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis as redis_py

import limitd
from limitd import keys, plugins
from limitd.connection.embedded import RedisServer
from limitd.middleware import ClientChain
from limitd.middleware.base import ClientMiddleware
from tests.failover_proxy import FailoverProxy


@limitd.job(name="client_test.Ping")
def ping(n: int) -> None: ...


class Reroute:
    """Sends odd numbers to the 'odd' queue."""

    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        if payload["args"] and payload["args"][0] % 2:
            payload["queue"] = "odd"
        return call_next(payload)


class HaltNegative:
    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        if payload["args"][0] < 0:
            return None
        return call_next(payload)


class Record:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
        self.log.append(f"{self.name}>")
        result = call_next(payload)
        # Runs after the push: the job is already in Redis.
        self.log.append(f"<{self.name}:{redis.llen(keys.of(redis).queue(payload['queue']))}")
        return result


@pytest.fixture
def client(redis: redis_py.Redis) -> Iterator[limitd.Client]:
    chain = ClientChain()
    client = limitd.Client(redis, middleware=chain)
    limitd.set_default_client(client)
    yield client


def test_middleware_can_change_the_queue(client: limitd.Client, redis: redis_py.Redis) -> None:
    client.middleware.add(Reroute())
    ping.perform_async(1)
    ping.perform_async(2)
    assert json.loads(redis.lindex(keys.of(redis).queue("odd"), 0))["queue"] == "odd"
    assert redis.llen(keys.of(redis).queue("default")) == 1
    assert redis.smembers(keys.of(redis).QUEUES) == {b"odd", b"default"}


def test_halted_push_returns_none_and_writes_nothing(
    client: limitd.Client, redis: redis_py.Redis
) -> None:
    client.middleware.add(HaltNegative())
    assert ping.perform_async(-1) is None
    assert ping.perform_in(60, -1) is None
    assert redis.dbsize() == 0
    assert ping.perform_async(1) is not None


def test_a_push_gate_takes_the_whole_push_and_runs_it_later(
    client: limitd.Client, redis: redis_py.Redis
) -> None:
    """The seam the transactions feature holds pushes through: the client names no
    feature, it offers each push (single, or a bulk chunk) to the gates first."""
    log: list[str] = []
    client.middleware.add(Record("m", log))
    taken: list[plugins.Push] = []

    def gate(push: plugins.Push) -> bool:
        taken.append(push)
        return True

    plugins.add_push_gate(gate)
    try:
        jid = ping.perform_async(1)
        bulk = ping.perform_bulk([[2], [3]])
    finally:
        plugins.remove_push_gate(gate)
    assert [push.payloads[0]["jid"] for push in taken] == [jid, bulk[0]]
    assert (redis.dbsize(), log) == (0, []), "the middleware run when the push does"
    for push in taken:
        push.run()
    assert redis.llen(keys.of(redis).queue("default")) == 3 and log[0] == "m>"
    assert ping.perform_async(4) is not None and len(taken) == 2, "the gate is gone"


def test_chain_order_and_ordering_verbs(client: limitd.Client) -> None:
    log: list[str] = []

    class A(Record): ...

    class B(Record): ...

    class C(Record): ...

    chain = client.middleware
    chain.add(A("a", log))
    chain.add(C("c", log))
    chain.insert_before(C, B("b", log))
    chain.prepend(Record("first", log))
    ping.perform_async(2)
    assert log == ["first>", "a>", "b>", "c>", "<c:1", "<b:1", "<a:1", "<first:1"]
    chain.remove(B)
    chain.insert_after(A, Record("after-a", log))
    log.clear()
    ping.perform_async(2)
    assert [entry for entry in log if entry.endswith(">")] == ["first>", "a>", "after-a>", "c>"]
    assert B not in chain
    with pytest.raises(ValueError, match="no B middleware"):
        chain.insert_before(B, Record("x", log))


def test_bulk_runs_middleware_per_job(client: limitd.Client, redis: redis_py.Redis) -> None:
    client.middleware.add(HaltNegative())
    client.middleware.add(Reroute())
    jids = ping.perform_bulk([[1], [2], [-3], [4], [5]], batch_size=2)
    assert jids[2] is None
    assert all(jids[i] for i in (0, 1, 3, 4))
    assert redis.llen(keys.of(redis).queue("odd")) == 2
    assert redis.llen(keys.of(redis).queue("default")) == 2


class AskedPerJob(ClientMiddleware):
    """Counts the jobs it is asked about; concerned only with jobs of one queue."""

    def __init__(self, queue: str) -> None:
        self.queue, self.asked = queue, 0

    def concerns(self, spec: object, payload: dict) -> bool:  # type: ignore[override]
        return payload.get("queue") == self.queue

    def push_work(self, spec: object, payload: dict) -> None:  # type: ignore[override]
        self.asked += 1
        payload["seen"] = True


def test_bulk_asks_a_middleware_only_about_chunks_it_concerns(
    client: limitd.Client, redis: redis_py.Redis
) -> None:
    """A bulk push judges ``concerns`` once per chunk: jobs of another kind pass the
    middleware by without a call each; jobs it concerns are still asked one by one."""
    asked = AskedPerJob("audited")
    client.middleware.add(asked)
    ping.perform_bulk([[1], [2], [3]], batch_size=2)
    assert asked.asked == 0
    ping.set(queue="audited").perform_bulk([[1], [2], [3]], batch_size=2)
    assert asked.asked == 3
    written = [json.loads(job) for job in redis.lrange(keys.of(redis).queue("audited"), 0, -1)]
    assert [job.get("seen") for job in written] == [True, True, True]


def test_strict_args_modes(redis: redis_py.Redis) -> None:
    with pytest.raises(limitd.UnsafeArgument, match=r"args\[0\] is \(1, 2\)"):
        limitd.Client(redis).push({"class": "client_test.Ping", "args": [(1, 2)]})
    with pytest.warns(UserWarning, match="client_test.Ping"):
        limitd.Client(redis, strict_args="warn").push(
            {"class": "client_test.Ping", "args": [(1, 2)]}
        )
    limitd.Client(redis, strict_args="off").push({"class": "client_test.Ping", "args": [(1, 2)]})
    assert redis.llen(keys.of(redis).queue("default")) == 2
    with pytest.raises(ValueError, match="strict_args"):
        limitd.Client(redis, strict_args="loud")


def test_push_rejects_payloads_no_server_could_run(redis: redis_py.Redis) -> None:
    client = limitd.Client(redis)
    with pytest.raises(ValueError, match="'class'"):
        client.push({"args": []})
    with pytest.raises(ValueError, match="'args' must be a list"):
        client.push({"class": "X", "args": "nope"})


@pytest.fixture
def replica(redis_server: RedisServer) -> Iterator[RedisServer]:
    """A server that answers writes with READONLY, like a demoted primary."""
    server = RedisServer()
    server.start()
    with server.client() as conn:
        conn.replicaof("127.0.0.1", redis_server.port)
    yield server
    server.stop()


@pytest.mark.standalone_only("a proxy between one client and one server")
def test_failover_retry_happens_only_once(redis: redis_py.Redis, replica: RedisServer) -> None:
    proxy = FailoverProxy(lambda n: replica.port)
    client = limitd.Client(redis_py.Redis(port=proxy.port))
    try:
        with pytest.raises(redis_py.ReadOnlyError):
            client.push({"class": "client_test.Ping", "args": [1]})
    finally:
        client.redis.close()
        proxy.close()
    assert proxy.connections == 2


class _CountingSocket:
    """A connected socket that counts its writes and passes everything else through."""

    def __init__(self, sock: object) -> None:
        self._sock = sock
        self.writes = 0

    def sendall(self, data: bytes) -> None:
        self.writes += 1
        self._sock.sendall(data)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def test_a_push_goes_to_redis_in_one_write(redis_server: RedisServer) -> None:
    # A push is several commands (the queue's LPUSH, the queues set, the wake-up); sent
    # as separate writes, Redis reads and answers each apart, a system call and a
    # wake-up more per command on both sides.
    conn = redis_server.client()
    conn.flushdb()
    pool = conn.connection_pool
    connection = pool.get_connection()
    connection.connect()
    counting = _CountingSocket(connection._sock)
    connection._sock = counting
    pool.release(connection)  # the push borrows it back: the pool's only connection
    limitd.Client(conn).push({"class": "client_test.Ping", "args": [1]})
    assert counting.writes == 1
    assert conn.llen(keys.of(conn).queue("default")) == 1
