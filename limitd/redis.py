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
from redis.exceptions import (
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

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
    url: str | None = None,
    *,
    max_connections: int | None = None,
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
) -> redis.Redis:
    """A client on a fresh pool. Responses stay bytes: payloads are decoded by limitd,
    so one malformed (non UTF-8) job cannot break a fetch and get lost on the way."""
    return redis.Redis.from_url(
        configured_url(url) or DEFAULT_URL,
        max_connections=max_connections,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        health_check_interval=30,
    )


class LuaScript:
    """One atomic operation, kept in a ``.lua`` file beside the module that runs it.

    ``prelude`` names ``.lua`` files of the same package holding local functions that
    several scripts share; they are prepended, so each call is still one script."""

    def __init__(self, package: str, filename: str, prelude: Sequence[str] = ()) -> None:
        files = resources.files(package)
        parts = [files.joinpath(name).read_bytes() for name in (*prelude, filename)]
        self.source = b"\n".join(parts)
        self.name = filename
        self._script = Script(None, self.source)  # type: ignore[arg-type]
        self._sha = self._script.sha.encode()

    def __call__(self, conn: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """Run on ``conn`` (a client or a pipeline)."""
        if isinstance(conn, Pipeline):
            return self._script(keys=list(keys), args=list(args), client=conn)
        command = pack_command(b"EVALSHA", self._sha, len(keys), *keys, *args)
        try:
            return send_packed(conn, command)
        except NoScriptError:
            conn.script_load(self.source)
            return send_packed(conn, command)


def pack_command(*parts: bytes | str | int | float) -> bytes:
    """A command in the Redis protocol (RESP). Scripts run once or twice per job with a
    dozen arguments; encoding them here costs a fraction of redis-py's generic packer."""
    encoded = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    chunks = [b"*%d\r\n" % len(encoded)]
    for part in encoded:
        chunks.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(chunks)


def send_packed(conn: redis.Redis, command: bytes) -> Any:
    """Send a packed command on a pooled connection and read the reply. Not retried on
    a connection error: the caller decides, since a script may have run regardless."""
    pool = conn.connection_pool
    connection = pool.get_connection()
    try:
        connection.send_packed_command([command])
        return connection.read_response()
    except (ConnectionError, TimeoutError, OSError):
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


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
