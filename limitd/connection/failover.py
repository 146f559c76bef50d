"""Telling a failover's errors apart, and trying once more on the new primary."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import redis
from redis.exceptions import ReadOnlyError, ResponseError

T = TypeVar("T")


_FAILOVER_MARKERS = ("READONLY", "NOREPLICAS", "UNBLOCKED")


def is_failover_error(exc: BaseException) -> bool:
    """True for the errors a Redis failover produces: the old primary became a replica
    (READONLY), lost its replicas (NOREPLICAS), or unblocked our blocking call."""
    if isinstance(exc, ReadOnlyError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_FAILOVER_MARKERS)


def retry_on_failover(conn: redis.Redis, operation: Callable[[], T]) -> T:
    """Run ``operation``; after a failover error, drop the pool's sockets (they point at
    the old primary) and try exactly once more."""
    try:
        return operation()
    except ResponseError as exc:
        if not is_failover_error(exc):
            raise
        conn.connection_pool.disconnect()
        return operation()
