"""Redis connections and Lua scripts.

One connection pool per process (a forked child must build its own), and one
:class:`LuaScript` per ``.lua`` file: the script text is read once, called with EVALSHA,
and loaded into the server only when the server says NOSCRIPT (after a restart or a
SCRIPT FLUSH), which redis-py's ``Script`` already handles.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TypeVar, cast

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_ENV_VARS = ("LIMITD_REDIS_URL", "REDIS_URL")

T = TypeVar("T")


def configured_url(url: str | None = None) -> str | None:
    """The Redis URL to use: explicit argument first, then the environment, else None."""
    if url:
        return url
    for var in URL_ENV_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return None


def connect(
    url: str | None = None, *, max_connections: int | None = None, socket_timeout: float = 10.0
) -> redis.Redis:
    """A client on a fresh pool. Responses stay bytes: payloads are decoded by limitd,
    so one malformed (non UTF-8) job cannot break a fetch and get lost on the way."""
    return redis.Redis.from_url(
        configured_url(url) or DEFAULT_URL,
        max_connections=max_connections,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=30,
    )


class LuaScript:
    """One atomic operation, kept in a ``.lua`` file beside the module that runs it."""

    def __init__(self, package: str, filename: str) -> None:
        self.source = resources.files(package).joinpath(filename).read_bytes()
        self.name = filename
        self._script = Script(None, self.source)  # type: ignore[arg-type]

    def __call__(self, conn: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """Run on ``conn`` (a client or a pipeline). A client calls EVALSHA directly:
        scripts sit on the hot path of every job, and redis-py's generic wrapper costs
        more than the call itself."""
        if isinstance(conn, Pipeline):
            return self._script(keys=list(keys), args=list(args), client=conn)
        try:
            return conn.evalsha(self._script.sha, len(keys), *keys, *args)
        except NoScriptError:
            conn.script_load(self.source)
            return conn.evalsha(self._script.sha, len(keys), *keys, *args)


def set_members(conn: redis.Redis, key: str) -> list[str]:
    """A set of names (queues, capsule ids), decoded and sorted."""
    members = cast("set[bytes]", conn.smembers(key))
    return sorted(member.decode("utf-8", "replace") for member in members)


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
