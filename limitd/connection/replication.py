"""Waiting for replicas: the ``WAIT`` option for Redis behind Sentinel.

Redis replicates asynchronously: a write the primary acknowledged may not have reached
any replica when the primary dies, and the replica promoted in its place has never seen
it. With ``wait_replicas: N`` a client sends ``WAIT N timeout`` in the same round trip
as the writes that matter, so they are known to be on N replicas (and, Sentinel
promoting the most up-to-date replica, on the next primary) before they count:

- a push: the client raises :class:`NotReplicated` when fewer replicas confirmed it in
  time (the job is on the primary and will run unless the primary fails first);
- a limit fetch: a worker runs the jobs it took only once their fetch is replicated, so
  after a failover the new primary counts every job still running against its limits.
  When fewer replicas confirm in time (a replica down, not a failover), the jobs run
  anyway and the shortfall is logged: work does not stop for a missing replica.

The setting travels with the client: ``connect`` reads it from the config (``redis:
{wait_replicas, wait_timeout}``) or from the URL's query (``?wait_replicas=1&
wait_timeout=0.5``), removes it from what redis-py sees, and records it here for
whatever later uses that client.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

log = logging.getLogger("limitd.replication")

REPLICAS_PARAM = "wait_replicas"
TIMEOUT_PARAM = "wait_timeout"
DEFAULT_TIMEOUT = 1.0  # seconds


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must confirm a write, and how long to wait for them."""

    replicas: int
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"{REPLICAS_PARAM} must be at least 1, got {self.replicas}")
        if self.timeout <= 0:
            raise ValueError(f"{TIMEOUT_PARAM} must be above 0 seconds, got {self.timeout}")

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout * 1000))


class NotReplicated(redis.RedisError):
    """Fewer replicas confirmed a write than ``wait_replicas`` asked for, in time. The
    write is on the primary; a failover before it replicates would lose it."""


def split_url(url: str) -> tuple[str, ReplicaWait | None]:
    """``url`` without the ``wait_*`` query parameters, and the setting they make (None
    without ``wait_replicas``). ValueError names a bad value."""
    parts = urlsplit(url)
    if not parts.query:
        return url, None
    params = parse_qsl(parts.query, keep_blank_values=True)
    ours = {name: value for name, value in params if name in (REPLICAS_PARAM, TIMEOUT_PARAM)}
    if not ours:
        return url, None
    rest = urlencode([(name, value) for name, value in params if name not in ours])
    bare = urlunsplit(parts._replace(query=rest))
    if REPLICAS_PARAM not in ours:
        raise ValueError(f"{url!r}: {TIMEOUT_PARAM} is set without {REPLICAS_PARAM}")
    try:
        replicas = int(ours[REPLICAS_PARAM])
        timeout = float(ours.get(TIMEOUT_PARAM, DEFAULT_TIMEOUT))
    except ValueError:
        raise ValueError(
            f"{url!r}: expected {REPLICAS_PARAM}=<whole number> and {TIMEOUT_PARAM}=<seconds>"
        ) from None
    return bare, ReplicaWait(replicas, timeout)


_settings: weakref.WeakKeyDictionary[Any, ReplicaWait] = weakref.WeakKeyDictionary()


def attach(client: Any, wait: ReplicaWait | None) -> None:
    """Record that writes through ``client`` (sync or asyncio) wait for replicas
    (``connect`` and ``async_twin`` do this)."""
    if wait is not None:
        _settings[client] = wait


def of(client: Any) -> ReplicaWait | None:
    """The replica wait of ``client``, or None (the default: no waiting)."""
    return _settings.get(client)


def confirmed(replies: list[Any], wait: ReplicaWait) -> bool:
    """Whether the ``WAIT`` reply at the end of a pipeline's ``replies`` is enough."""
    return int(replies[-1]) >= wait.replicas


def shortfall(wait: ReplicaWait, got: int, what: str) -> str:
    return (
        f"{what}: {got} of {wait.replicas} replicas confirmed within {wait.timeout:g}s "
        f"({REPLICAS_PARAM}); it is on the primary but a failover now would lose it"
    )
