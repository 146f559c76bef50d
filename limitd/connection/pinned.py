"""A Redis client for the jobs' own Redis work: Sidekiq's ``Sidekiq.redis``, in Python.

A job that counts, caches or locks in Redis makes a round trip or two, and through
redis-py 8 each one costs about 100 us of CPU, of which a quarter is the network: the
rest is the pool's checkout (a pid check, a liveness poll of the socket), the retry
wrapper's closures and the per-command observability records. On a capsule whose jobs
are short that is half the CPU the process spends per job (py-spy, bench/peers).

:class:`PinnedRedis` is a ``redis.Redis`` that sends each command over one connection kept
by the calling thread (made on first use, outside the pool) and reads the reply with
redis-py's own parsers, retry policy and response callbacks, so a command's result and
errors are redis-py's. What needs a connection of its own for a while (pipelines,
transactions, pub/sub) still takes one from the shared pool. A thread holds its
connection until it ends; a forked child makes its own. About 35 us of CPU per command
instead of 100.

The pool looks at a connection before each use (a poll of its socket) to find one the
server closed: idle past its ``timeout``, or restarted. A busy thread's connection was
used a moment ago, so here the look is taken only after ``idle_check_seconds`` without a
command; a restart within that second fails the command in flight, as it would through
the pool, unless the client's retry policy retries it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import hiredis
import redis as redis_py
from redis.exceptions import ConnectionError, TimeoutError

from limitd.connection import OwnConnection, cluster

_generation = 0  # bumped in a forked child: the parent's sockets are not its own


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class PinnedRedis(redis_py.Redis):
    """``redis.Redis`` on one connection per thread; build it with :func:`pinned`."""

    idle_check_seconds = 1.0

    def __init__(self, base: redis_py.Redis) -> None:
        super().__init__(connection_pool=base.connection_pool)
        self._base = base
        self._local = threading.local()
        kwargs = base.connection_pool.connection_kwargs
        # hiredis packs str as UTF-8, strictly: other encodings take redis-py's packer.
        self._fast_pack = (
            kwargs.get("encoding", "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")
            and kwargs.get("encoding_errors", "strict") == "strict"
        )

    def execute_command(self, *args: Any, **options: Any) -> Any:
        own = self._own_connection()
        local, now = self._local, time.monotonic()
        if now - local.used > self.idle_check_seconds:
            _drop_if_closed(own.connection)
            own.looked_at()
        local.used = now
        # ready() inside the retry: a Sentinel-managed connection finds the new primary
        # only in its connect() (see OwnConnection); _exchange drops a failed connection.
        return own.connection.retry.call_with_retry(
            lambda: self._exchange(own.ready(), args, options), _dropped
        )

    def _exchange(self, connection: Any, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        try:
            connection.send_packed_command(self._pack(connection, args), check_health=False)
            return self.parse_response(connection, args[0], **options)
        except (ConnectionError, TimeoutError, OSError):
            connection.disconnect()  # half a reply may be in it: never reuse it
            raise

    def _pack(self, connection: Any, args: tuple[Any, ...]) -> Any:
        """hiredis's C packer where it packs as redis-py would; redis-py's otherwise
        (a two-word command name, a bool or None it must refuse, another encoding)."""
        if self._fast_pack and " " not in args[0]:
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return connection.pack_command(*args)

    def _own_connection(self) -> OwnConnection:
        local = self._local
        own: OwnConnection | None = getattr(local, "own", None)
        if own is None or local.generation != _generation:
            own = local.own = OwnConnection(self._base)
            local.generation = _generation
            local.used = time.monotonic()
        return own

    def close(self) -> None:
        """Close the calling thread's connection; the shared pool is its owner's."""
        own: OwnConnection | None = getattr(self._local, "own", None)
        if own is not None:
            own.close()
            self._local.own = None


def _drop_if_closed(connection: Any) -> None:
    """Disconnect a connection the server closed (or that holds bytes no command asked
    for), as the pool's checkout does; the next send connects again."""
    if connection._sock is None:
        return
    try:
        stale = connection.can_read()
    except (ConnectionError, TimeoutError, OSError):  # how it says the server closed it
        stale = True
    if stale:
        connection.disconnect()


def _dropped(_error: Exception) -> None:
    """The retry policy's failure callback: ``_exchange`` already disconnected."""


def pinned(base: redis_py.Redis) -> redis_py.Redis:
    """A :class:`PinnedRedis` over ``base``'s server and pool; a cluster client as it is
    (it routes each command to its shard over per-node pools of its own)."""
    if cluster.is_cluster(base):
        return base
    return PinnedRedis(base)
