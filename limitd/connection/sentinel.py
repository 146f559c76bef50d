"""Redis behind Sentinel: ``redis+sentinel://`` addresses, and clients that ask the
sentinels where the primary is.

A URL names the sentinels, the service (Sentinel's "master name") and the database::

    redis+sentinel://[:password@]host:port[,host:port...]/service[/db]

The password, if any, is the primary's (sentinels are asked without one). Clients are
redis-py's Sentinel clients: each new connection asks the sentinels for the primary's
address, so after a failover the pool's connections reconnect to the new primary (a
command that hit the old one fails with READONLY or a connection error first; see
``limitd.connection.retry_on_failover``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from limitd.connection.hosts import split_hosts

SCHEME = "redis+sentinel://"


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None


def parse(url: str) -> SentinelAddress:
    """The parts of a ``redis+sentinel://`` URL; ValueError naming what is wrong."""
    sentinels, password, raw_path = split_hosts(url, SCHEME, "sentinel")
    path = [piece for piece in raw_path.split("/") if piece]
    if not path or len(path) > 2:
        raise ValueError(f"{url!r}: expected /service or /service/db after the sentinels")
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"{url!r}: the database must be a number, got {db!r}")
    return SentinelAddress(sentinels, unquote(path[0]), int(db), password)


def url_of(sentinels: list[str], service: str, db: int = 0) -> str:
    """The URL for a config's ``redis: {sentinels: [host:port, ...], service: name}``."""
    return f"{SCHEME}{','.join(sentinels)}/{service}/{db}"


def connect(
    url: str,
    *,
    max_connections: int | None,
    socket_timeout: float,
    connect_timeout: float,
) -> redis.Redis:
    """A client on the primary of the service ``url`` names."""
    where = parse(url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout}
    sentinel = redis.sentinel.Sentinel(list(where.sentinels), sentinel_kwargs=timeouts)
    return sentinel.master_for(
        where.service,
        db=where.db,
        password=where.password,
        max_connections=max_connections,
        health_check_interval=30,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
    )


def unreachable(url: str, timeout: float) -> str | None:
    """None when the sentinels ``url`` names know its service and its primary answers;
    else why not, for the one line ``limitd start`` exits with: which sentinels did not
    answer and why, which services those that did know, or the primary they name that
    does not answer. One try each, no retries: this runs before anything starts."""
    where = parse(url)
    silent: list[str] = []
    known: dict[str, list[str]] = {}
    for host, port in where.sentinels:
        probe = one_try_client(host=host, port=port, timeout=timeout)
        try:
            masters = cast("dict[str, dict[str, Any]]", probe.sentinel_masters())
        except redis.RedisError as exc:
            silent.append(f"{host}:{port} ({exc})")
            continue
        finally:
            probe.close()
        if where.service in masters:
            state = masters[where.service]
            primary = one_try_client(
                host=state["ip"], port=int(state["port"]), timeout=timeout, password=where.password
            )
            try:
                primary.ping()
                return None
            except redis.RedisError as exc:
                return (
                    f"sentinel {host}:{port} names {state['ip']}:{state['port']} as the primary "
                    f"of {where.service!r}, and it does not answer: {exc}"
                )
            finally:
                primary.close()
        known[f"{host}:{port}"] = sorted(masters)
    if not known:
        return "none of the sentinels answered: " + ", ".join(silent)
    services = sorted({name for names in known.values() for name in names})
    return (
        f"the sentinels {', '.join(known)} monitor no service {where.service!r} "
        f"(they monitor {', '.join(map(repr, services)) or 'nothing'})"
        + (f"; no answer from {', '.join(silent)}" if silent else "")
    )


def one_try_client(timeout: float, **address: Any) -> redis.Redis:
    """A client that tries once (redis-py retries connection errors ten times by
    default, with backoff: a check at start must answer in seconds)."""
    return redis.Redis(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        **address,
    )


def is_sentinel_client(client: redis.Redis) -> bool:
    return isinstance(client.connection_pool, redis.sentinel.SentinelConnectionPool)


def async_twin(client: redis.Redis, max_connections: int, skip: frozenset[str], wait: float) -> Any:
    """An asyncio client on the same service, asking the same sentinels (see
    ``limitd.connection.async_twin``); ``skip`` names connection settings asyncio lacks,
    ``wait`` is how long a call waits for one of ``max_connections``."""
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    manager = pool.sentinel_manager
    sentinels = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in manager.sentinels
    ]
    settings = {
        k: v for k, v in pool.connection_kwargs.items() if k not in skip and k != "connection_pool"
    }
    # Without the sync manager's retry policy: redis-py (8.2) gives the sentinels one of
    # its own, which asyncio's Sentinel makes again in its asyncio form when absent.
    sentinel_settings = {k: v for k, v in manager.sentinel_kwargs.items() if k != "retry"}
    twin = redis.asyncio.sentinel.Sentinel(sentinels, sentinel_kwargs=sentinel_settings)
    return twin.master_for(
        pool.service_name,
        connection_pool_class=BlockingSentinelPool,
        max_connections=max_connections,
        timeout=wait,
        **settings,
    )


class BlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """redis-py's asyncio Sentinel pool raises once ``max_connections`` are out; this
    one waits for a free connection, as the plain asyncio twin does (a thousand async
    jobs share a hundred connections)."""
