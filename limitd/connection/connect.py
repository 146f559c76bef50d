"""Connecting to Redis: one pool per process (a forked child builds its own), the URL
kinds limitd understands (plain, ``redis+sentinel://``, ``redis+cluster://``), and the
asyncio twins async code uses beside a sync client."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, cast

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from limitd import keys
from limitd.connection import cluster, replication, sentinel

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_ENV_VARS = ("LIMITD_REDIS_URL", "REDIS_URL")


def connect(
    url: str = DEFAULT_URL,
    *,
    max_connections: int | None = None,
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    wait: replication.ReplicaWait | None = None,
) -> redis.Redis:
    """A client on a fresh pool. Responses stay bytes: payloads are decoded by limitd,
    so one malformed (non UTF-8) job cannot break a fetch and get lost on the way.
    (Which URL to use is decided above this layer: see ``limitd.locate``.) A
    ``redis+sentinel://`` URL gives a client on the primary Sentinel names (see
    ``limitd.sentinel``); a ``redis+cluster://`` URL, a Redis Cluster client (see
    ``limitd.cluster``). The client carries its key layout (``limitd.keys.of``). ``wait``
    (or the URL's ``wait_replicas`` / ``wait_timeout``, which win) makes the client's
    pushes and fetches wait for replicas (see ``limitd.replication``)."""
    url, from_url = replication.split_url(url)
    if url.startswith(cluster.SCHEME) and (from_url or wait):
        raise ValueError(
            "wait_replicas is not available in cluster mode: WAIT must follow the writes "
            "on their own connection, and a cluster client spreads them over shards"
        )
    special = {cluster.SCHEME: cluster.connect, sentinel.SCHEME: sentinel.connect}
    scheme = next((name for name in special if url.startswith(name)), None)
    if scheme is not None:
        client = special[scheme](
            url,
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
        )
    else:
        client = redis.Redis.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=30,
        )
    replication.attach(client, from_url or wait)
    keys.attach(client, keys.CLUSTER if scheme == cluster.SCHEME else keys.STANDALONE)
    return client


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """None when the Redis ``url`` names answers a PING, else why not, in words that
    name what was tried (the URL without its password; through Sentinel, each
    sentinel). Tried once, without redis-py's retries: a check at start."""
    bare = replication.split_url(url)[0]
    if bare.startswith(sentinel.SCHEME):
        return sentinel.unreachable(bare, timeout)
    if bare.startswith(cluster.SCHEME):
        return cluster.unreachable(bare, timeout)
    probe = redis.Redis.from_url(
        bare, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    try:
        probe.ping()
    except redis.RedisError as exc:
        return f"{masked(bare)} does not answer: {exc}"
    finally:
        probe.close()
    return None


def masked(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: for logs and messages."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


_ASYNC_CONNECTIONS = {
    redis.Connection: redis.asyncio.Connection,
    redis.UnixDomainSocketConnection: redis.asyncio.UnixDomainSocketConnection,
    redis.SSLConnection: redis.asyncio.SSLConnection,
}


def register_async_connection(
    sync_class: type[redis.Connection], async_class: type[redis.asyncio.Connection]
) -> None:
    """Teach :func:`async_twin` the asyncio counterpart of a connection class of its own
    (``limitd.testing``'s in-memory connection), so clients built on it get async twins."""
    _ASYNC_CONNECTIONS[sync_class] = async_class


def async_twin(client: redis.Redis, max_connections: int = 100) -> redis.asyncio.Redis:
    """An asyncio client for the server ``client`` talks to, with its settings (address,
    database, password, timeouts). Async code must not share a sync client's sockets, and
    building from the client rather than a URL keeps the two on the same server whatever
    located it. Asyncio clients belong to the event loop that first uses them: build one
    per loop.

    Its pool blocks: a thousand async jobs on one loop, each with a Redis call to make,
    wait their turn for one of ``max_connections`` instead of failing (redis-py's plain
    asyncio pool raises past its cap) or opening a thousand sockets."""
    twin = _bare_async_twin(client, max_connections)
    replication.attach(twin, replication.of(client))
    keys.attach(twin, keys.of(client))
    return twin


def _bare_async_twin(client: redis.Redis, max_connections: int) -> redis.asyncio.Redis:
    if cluster.is_cluster(client):
        return cast(redis.asyncio.Redis, cluster.async_twin(client))
    if sentinel.is_sentinel_client(client):
        return cast(
            redis.asyncio.Redis, sentinel.async_twin(client, max_connections, _SYNC_ONLY, TWIN_WAIT)
        )
    pool = client.connection_pool
    kind = _ASYNC_CONNECTIONS.get(pool.connection_class)
    if kind is None:
        raise TypeError(f"no asyncio connection for {pool.connection_class.__name__}")
    settings = {k: v for k, v in pool.connection_kwargs.items() if k not in _SYNC_ONLY}
    async_pool = redis.asyncio.BlockingConnectionPool(
        connection_class=kind, max_connections=max_connections, timeout=TWIN_WAIT, **settings
    )
    return redis.asyncio.Redis(connection_pool=async_pool)


TWIN_WAIT = 20.0  # seconds a call waits for a free connection of a twin's pool


# loop -> id(sync client) -> (the client, weakly; its twin). The loop is held weakly: a
# closed loop takes its twins with it. The client is checked on use, so a new client that
# got a dropped one's id never finds the dropped one's twin.
_twins: weakref.WeakKeyDictionary[Any, dict[int, tuple[weakref.ref[Any], redis.asyncio.Redis]]] = (
    weakref.WeakKeyDictionary()
)


def loop_twin(client: redis.Redis) -> redis.asyncio.Redis:
    """The running event loop's asyncio twin of ``client``, built on first use and kept
    as long as the loop lives: async job code and the async client share it, and a new
    loop (each ``asyncio.run``) gets its own."""
    per_loop = _twins.setdefault(asyncio.get_running_loop(), {})
    known = per_loop.get(id(client))
    if known is not None and known[0]() is client:
        return known[1]
    twin = async_twin(client)
    per_loop[id(client)] = (weakref.ref(client), twin)
    return twin


# Connection settings the asyncio connections do not take.
_SYNC_ONLY = frozenset({"socket_keepalive_options", "ssl_min_version", "ssl_ciphers"})
