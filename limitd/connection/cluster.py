"""Redis Cluster: ``redis+cluster://`` addresses, the client, and the checks that keep
a cluster and a standalone layout from being mixed.

A URL names some of the cluster's nodes (any will do: the client learns the rest)::

    redis+cluster://[:password@]host:port[,host:port...]

In cluster mode keys follow the cluster layout of ``limitd.keys`` (hash tags, so each
atomic operation stays in one slot). Ruby Sidekiq cannot share that data, and a cluster
that already holds the standalone layout (Sidekiq's or limitd's untagged keys) is
refused rather than silently split in two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from limitd.connection.hosts import split_hosts

SCHEME = "redis+cluster://"
SLOTS = 16384

# Keys of the standalone layout that any running limitd or Sidekiq leaves behind.
STANDALONE_MARKERS = ("queues", "processes", "limitd:capsules", "limitd:limits", "stat:processed")


class LayoutMismatch(RuntimeError):
    """A cluster client found the standalone layout, or a standalone client a cluster."""


@dataclass(frozen=True)
class ClusterAddress:
    nodes: tuple[tuple[str, int], ...]
    password: str | None = None


def parse(url: str) -> ClusterAddress:
    """The parts of a ``redis+cluster://`` URL; ValueError naming what is wrong."""
    nodes, password, path = split_hosts(url, SCHEME, "node")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"{url!r}: a cluster has only database 0")
    return ClusterAddress(nodes, password)


def url_of(nodes: list[str]) -> str:
    """The URL for a config's ``redis: {cluster: true, startup_nodes: [host:port, ...]}``."""
    return SCHEME + ",".join(nodes)


def connect(
    url: str,
    *,
    max_connections: int | None,
    socket_timeout: float,
    connect_timeout: float,
) -> redis.Redis:
    """A cluster client (typed as ``redis.Redis``: it answers the same commands, routed
    by key; what differs is handled where it matters, see :func:`is_cluster`)."""
    where = parse(url)
    client = redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in where.nodes],
        password=where.password,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        max_connections=max_connections or 2**31,
        require_full_coverage=True,
    )
    return cast(redis.Redis, client)


def is_cluster(client: Any) -> bool:
    return isinstance(client, redis.cluster.RedisCluster)


def is_async_cluster(client: Any) -> bool:
    return isinstance(client, redis.asyncio.cluster.RedisCluster)


# redis-py's asyncio cluster client raises rather than wait when a node's connections
# are all in use: it may open one per concurrent call (a loop running a thousand jobs
# that each call Redis opens up to a thousand sockets per node).
ASYNC_MAX_CONNECTIONS = 2**31 - 1


def async_twin(client: Any) -> Any:
    """An asyncio cluster client on the same cluster, with ``client``'s settings."""
    nodes = client.get_nodes()
    settings = nodes[0].redis_connection.connection_pool.connection_kwargs
    return redis.asyncio.cluster.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(node.host, node.port) for node in nodes],
        password=settings.get("password"),
        socket_timeout=settings.get("socket_timeout"),
        socket_connect_timeout=settings.get("socket_connect_timeout"),
        max_connections=ASYNC_MAX_CONNECTIONS,
        require_full_coverage=True,
    )


def one_node(client: Any) -> redis.Redis:
    """A plain client on one node of the cluster, chosen at random (for pub/sub: a
    message published on any node is delivered on every node)."""
    node = client.get_random_node()
    kwargs = node.redis_connection.connection_pool.connection_kwargs
    return redis.Redis(
        host=node.host,
        port=node.port,
        password=kwargs.get("password"),
        socket_timeout=kwargs.get("socket_timeout"),
        socket_connect_timeout=kwargs.get("socket_connect_timeout"),
    )


def unreachable(url: str, timeout: float) -> str | None:
    """None when the cluster ``url`` names answers and serves every slot; else why not,
    naming the nodes tried. One try each: this runs before anything starts."""
    where = parse(url)
    silent: list[str] = []
    for host, port in where.nodes:
        probe = redis.Redis(
            host,
            port,
            password=where.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            info = cast("dict[str, Any]", probe.cluster("info"))
        except redis.RedisError as exc:
            silent.append(f"{host}:{port} ({exc})")
            continue
        finally:
            probe.close()
        covered = int(info.get("cluster_slots_ok", 0))
        if info.get("cluster_state") != "ok" or covered < SLOTS:
            return (
                f"node {host}:{port} says the cluster is {info.get('cluster_state')!r} with "
                f"{covered} of {SLOTS} slots served: every slot must be served"
            )
        return None
    return "none of the cluster nodes answered: " + ", ".join(silent)


def check_layout(client: Any, cluster_mode: bool) -> None:
    """Refuse to mix layouts: a cluster client on a cluster holding the standalone
    layout, or a standalone client on a cluster node. LayoutMismatch says which."""
    if cluster_mode:
        found = [key for key in STANDALONE_MARKERS if client.exists(key)]
        if found:
            raise LayoutMismatch(
                f"this cluster holds keys of the standalone layout ({', '.join(found)}): "
                "limitd's cluster mode keeps its keys under hash tags and would not see "
                "those jobs; move them or use another cluster"
            )
        return
    try:
        enabled = int(client.info("cluster").get("cluster_enabled", 0))
    except redis.RedisError:
        return  # servers that hide INFO: nothing to compare
    if enabled:
        raise LayoutMismatch(
            "this Redis is a cluster node: connect in cluster mode (redis: {cluster: true, "
            "startup_nodes: [...]} or a redis+cluster:// URL)"
        )
