"""Sending packed commands ourselves: the Redis protocol packed by hiredis, and one
connection a thread keeps outside the pool. The hot path (a capsule's fetch) pays for
neither redis-py's command packing nor its pool checkout."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import hiredis
import redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from limitd import keys
from limitd.connection import cluster, sentinel

_PACKABLE = (bytes, str, int, float)  # exactly these: hiredis refuses a bool


def pack_command(*parts: object) -> bytes:
    """A command in the Redis protocol (RESP). The hot path packs one or two scripts
    with dozens of arguments per fetch; hiredis's C packer does that about three times
    faster than a Python loop, and faster than redis-py's generic packer. It takes only
    str, bytes, int and float; anything else (a bool, a Decimal) is sent as its str()."""
    try:
        return cast(bytes, hiredis.pack_command(cast(Any, parts)))  # its stub wants 1-tuples
    except TypeError:
        plain = tuple(p if type(p) in _PACKABLE else str(p) for p in parts)
        return cast(bytes, hiredis.pack_command(cast(Any, plain)))


# One bulk string: % (its length, its bytes). Hot paths that pack many apply it inline.
BULK = b"$%d\r\n%s\r\n"


def bulk(value: bytes | str | int) -> bytes:
    """One argument of a command as RESP packs it, for :func:`command_from`: a caller
    that sends the same arguments call after call (a fetch's queue keys) packs them once
    and keeps the bytes, where :func:`pack_command` would pack each of them at every call
    again (about 0.2 us an argument; a fetch over many queues passes a hundred)."""
    if type(value) is int and 0 <= value < len(_SMALL_INTS):
        return _SMALL_INTS[value]  # counts and flags: most of a fetch's numbers
    data = value if type(value) is bytes else str(value).encode()
    return BULK % (len(data), data)


_SMALL_INTS = [b"$%d\r\n%d\r\n" % (len(str(n)), n) for n in range(1024)]


def command_from(count: int, parts: Iterable[bytes]) -> bytes:
    """A command of ``count`` arguments from their :func:`bulk` bytes, in order (a part
    may hold several arguments)."""
    return b"*%d\r\n%s" % (count, b"".join(parts))


def kernel_timeouts(sock: Any, seconds: float | None) -> Any:
    """Make a plain TCP or Unix socket blocking, with its timeout kept by the kernel
    (SO_RCVTIMEO, SO_SNDTIMEO) instead of by Python. Python polls a socket that has a
    timeout before every send and receive, and each of those system calls hands the GIL
    over: on a busy capsule that doubled the GIL's trips between threads per Redis call.
    A receive that times out raises OSError (EAGAIN), which redis-py reports as a
    ConnectionError: the connection is dropped, as after a timeout. Other sockets (TLS)
    are left as they are. Returns ``sock``."""
    if type(sock) is not socket.socket or not seconds:
        return sock
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    return sock


def own_connection(client: redis.Redis) -> Conn:
    """An :class:`OwnConnection` for ``client``; a cluster client itself (it routes each
    call to its shard, over its own pools)."""
    return client if cluster.is_cluster(client) else OwnConnection(client)


class OwnConnection:
    """One connection kept by one thread (a capsule's dispatcher) outside the pool. On
    the hottest path the pool's checkout (a pid check, a liveness poll of the socket,
    event hooks) cost about as much as packing the call. Not for sharing."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        keys.attach(self, keys.of(client))
        pool = client.connection_pool
        self.connection = pool.connection_class(**pool.connection_kwargs)
        # A Sentinel-managed connection learns the primary's address only in connect():
        # redis-py's implicit connect on send skips that and dials localhost:6379.
        self.sentinel = sentinel.is_sentinel_client(client)
        self._tuned: Any = None  # the socket kernel_timeouts last set up

    def ready(self) -> Any:
        """The connection, connected to the right server (see ``sentinel``), its socket
        timing out in the kernel (see ``kernel_timeouts``)."""
        connection = self.connection
        if self.sentinel or connection._sock is None:
            connection.connect()  # returns at once when already connected
        if connection._sock is not self._tuned:
            self._tuned = kernel_timeouts(connection._sock, connection.socket_timeout)
        return connection

    def looked_at(self) -> None:
        """redis-py gave the socket its Python timeout back (``can_read`` does): the
        next ``ready`` hands its timeout to the kernel again."""
        self._tuned = None

    def close(self) -> None:
        self.connection.disconnect()


Conn = redis.Redis | OwnConnection


@contextmanager
def _connection(conn: Conn) -> Iterator[Any]:
    """The connection to send on: ``conn``'s own, or one borrowed from its pool. A
    connection that failed is dropped (it reconnects on next use)."""
    if isinstance(conn, OwnConnection):
        yield from _using(conn.ready())
        return
    pool = conn.connection_pool
    connection = pool.get_connection()
    try:
        yield from _using(connection)
    finally:
        pool.release(connection)


def _using(connection: Any) -> Iterator[Any]:
    try:
        yield connection
    except (ConnectionError, TimeoutError, OSError):
        connection.disconnect()
        raise


def client_of(conn: Conn) -> redis.Redis:
    return conn.client if isinstance(conn, OwnConnection) else conn


def send_packed(conn: Conn, command: bytes) -> Any:
    """Send a packed command and read the reply. Not retried on a connection error: the
    caller decides, since a script may have run regardless."""
    if isinstance(conn, OwnConnection):  # the hot path: no pool, no context manager
        return _exchange(conn.ready(), command)
    with _connection(conn) as connection:
        connection.send_packed_command([command], check_health=False)
        return connection.read_response()


def _exchange(connection: Any, command: bytes) -> Any:
    try:
        connection.send_packed_command([command], check_health=False)
        return connection.read_response()
    except (ConnectionError, TimeoutError, OSError):
        connection.disconnect()
        raise


def send_packed_all(client: redis.Redis, commands: list[bytes]) -> list[Any]:
    """Several packed commands in one write and their replies, in order, over a
    connection borrowed from ``client``'s pool: a pipeline without redis-py's command
    stack and reply callbacks (replies come as Redis sent them), which cost a single push
    more than its round trip. Retried on a connection error by the client's retry policy,
    as redis-py retries a pipeline. An error reply is raised once every reply is read,
    so the connection stays in step."""
    with _connection(client) as connection:
        return cast(
            "list[Any]",
            connection.retry.call_with_retry(
                lambda: _exchange_all(connection, commands), lambda _error: None
            ),
        )


def _exchange_all(connection: Any, commands: list[bytes]) -> list[Any]:
    replies: list[Any] = []
    error: ResponseError | None = None
    try:
        # One buffer, one write: redis-py sends each item of a list with a sendall of
        # its own, and Redis, reading a push's commands in separate packets, answered
        # each in a write of its own too (three system calls and wake-ups a side).
        connection.send_packed_command([b"".join(commands)], check_health=False)
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except ResponseError as reply:
                error = error or reply
                replies.append(reply)
    except (ConnectionError, TimeoutError, OSError):
        connection.disconnect()  # half the replies may be in it: never reuse it
        raise
    if error is not None:
        raise error
    return replies
