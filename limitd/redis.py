"""Redis connections and Lua scripts.

One connection pool per process (a forked child must build its own), and one
:class:`LuaScript` per ``.lua`` file: the script text is read once, called with EVALSHA,
and loaded into the server only when the server says NOSCRIPT (after a restart or a
SCRIPT FLUSH), which redis-py's ``Script`` already handles.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, TypeVar, cast

import hiredis
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.cluster import ClusterPipeline
from redis.commands.core import Script
from redis.exceptions import (
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry

from limitd import cluster, keys, replication, sentinel

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_ENV_VARS = ("LIMITD_REDIS_URL", "REDIS_URL")

T = TypeVar("T")


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
    ``limitd.sentinel``); a ``redis+cluster://`` URL, a Redis Cluster client, and
    switches ``limitd.keys`` to the cluster layout (see ``limitd.cluster``). ``wait``
    (or the URL's ``wait_replicas`` / ``wait_timeout``, which win) makes the client's
    pushes and fetches wait for replicas (see ``limitd.replication``)."""
    url, from_url = replication.split_url(url)
    keys.use_cluster_layout(url.startswith(cluster.SCHEME))
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


class ScriptCall:
    """A script call prepared now and made later: server middleware return these from
    ``settled`` so a job's bookkeeping travels with its acknowledgement, in the same
    round trip. ``on_reply`` (optional) receives the script's reply.

    A call with ``shared`` arguments is *mergeable*: its script takes those arguments
    first, then any number of groups like ``args``, one per job, and returns one reply
    per group. Calls of the same script with the same keys and shared arguments are sent
    as one call (see :func:`merge_calls`): ten jobs of one batch finishing together cost
    the batch one script run, not ten.

    A plain class with slots, not a dataclass: one is built for every batch job run, and
    a frozen dataclass's constructor cost four times as much."""

    __slots__ = ("args", "keys", "on_reply", "script", "shared")

    def __init__(
        self,
        script: LuaScript,
        keys: Sequence[Any],
        args: Sequence[Any],
        on_reply: Callable[[Any], None] | None = None,
        shared: tuple[Any, ...] | None = None,
    ) -> None:
        self.script = script
        self.keys = tuple(keys)  # hashable: part of the merge key
        self.args = args
        self.on_reply = on_reply
        self.shared = shared

    def __repr__(self) -> str:
        return f"ScriptCall({self.script.name}, keys={self.keys!r}, args={self.all_args()!r})"

    def all_args(self) -> Sequence[Any]:
        return self.args if self.shared is None else (*self.shared, *self.args)

    def run(self, conn: Any) -> Any:
        reply = self.script(conn, self.keys, self.all_args())
        if self.shared is not None:
            reply = reply[0]
        if self.on_reply is not None:
            self.on_reply(reply)
        return reply

    async def arun(self, conn: redis.asyncio.Redis) -> Any:
        """:meth:`run` on an asyncio client."""
        reply = await self.script.acall(conn, self.keys, self.all_args())
        if self.shared is not None:
            reply = reply[0]
        if self.on_reply is not None:
            self.on_reply(reply)
        return reply

    def packed(self) -> bytes:
        return self.script.packed(self.keys, self.all_args())


class MergedCall:
    """Mergeable calls sent as one; ``parts`` receive their own replies."""

    __slots__ = ("call", "parts")

    def __init__(self, call: ScriptCall, parts: list[ScriptCall]) -> None:
        self.call = call
        self.parts = parts

    def deliver(self, conn: Any, reply: Any) -> None:
        if isinstance(reply, NoScriptError):
            reply = self.call.script(conn, self.call.keys, self.call.all_args())
        elif isinstance(reply, Exception):
            raise reply
        replies = reply if self.call.shared is not None else [reply]
        for part, part_reply in zip(self.parts, replies, strict=False):
            if part.on_reply is not None:
                part.on_reply(part_reply)


def merge_calls(calls: Sequence[ScriptCall]) -> list[MergedCall]:
    """Group mergeable calls (same script, keys and shared arguments), keeping the order
    in which each group first appears; other calls stay as they are."""
    groups: dict[Any, list[ScriptCall]] = {}
    for index, call in enumerate(calls):
        # The same keys and shared arguments are usually the same tuples, so the key
        # compares by identity first and costs little.
        key = index if call.shared is None else (call.script, call.keys, call.shared)
        group = groups.get(key)
        if group is None:
            groups[key] = [call]
        else:
            group.append(call)
    return [MergedCall(_merged(parts), parts) for parts in groups.values()]


def _merged(parts: list[ScriptCall]) -> ScriptCall:
    first = parts[0]
    if len(parts) == 1:
        return first
    args = [arg for part in parts for arg in part.args]
    return ScriptCall(first.script, first.keys, args, None, first.shared)


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
        self.sha: str = self._script.sha  # what EVALSHA names it by
        self._sha = self.sha.encode()

    def __call__(self, conn: Any, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        """Run on ``conn`` (a client, a pipeline or an own connection)."""
        # Pipeline is a typing Protocol to isinstance(), which makes the check cost a
        # microsecond: the dispatcher's own connection, called for every fetch, skips it.
        if not isinstance(conn, OwnConnection):
            if isinstance(conn, Pipeline):
                return self._script(keys=list(keys), args=list(args), client=conn)
            if isinstance(conn, _PublishAfter):
                conn = conn.wrapped
            if cluster.is_cluster(conn):  # routed by its keys' slot
                return self._on_cluster(conn, keys, args)
        command = self.packed(keys, args)
        try:
            return send_packed(conn, command)
        except NoScriptError:
            client_of(conn).script_load(self.source)
            return send_packed(conn, command)

    def _on_cluster(self, conn: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if isinstance(conn, ClusterPipeline):
            # redis-py's cluster pipeline has no script cache to fill on NOSCRIPT, and a
            # failed-over primary may not have the script: send it whole (EVAL).
            return conn.execute_command("EVAL", self.source, len(keys), *keys, *args)
        try:
            return conn.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            conn.script_load(self.source)  # on every primary
            return conn.evalsha(self.sha, len(keys), *keys, *args)

    async def acall(
        self, conn: redis.asyncio.Redis, keys: Sequence[Any] = (), args: Sequence[Any] = ()
    ) -> Any:
        """The same call on an asyncio client (see :func:`async_twin`)."""
        try:
            return await conn.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await conn.script_load(self.source)
            return await conn.evalsha(self.sha, len(keys), *keys, *args)

    def packed(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        return pack_command(b"EVALSHA", self._sha, len(keys), *keys, *args)

    def later(
        self,
        keys: Sequence[Any],
        args: Sequence[Any],
        on_reply: Callable[[Any], None] | None = None,
        shared: tuple[Any, ...] | None = None,
    ) -> ScriptCall:
        """This call, to be made later (see :class:`ScriptCall`)."""
        return ScriptCall(self, keys, args, on_reply, shared)


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
        pool = client.connection_pool
        self.connection = pool.connection_class(**pool.connection_kwargs)
        # A Sentinel-managed connection learns the primary's address only in connect():
        # redis-py's implicit connect on send skips that and dials localhost:6379.
        self.sentinel = sentinel.is_sentinel_client(client)

    def ready(self) -> Any:
        """The connection, connected to the right server (see ``sentinel``)."""
        if self.sentinel:
            self.connection.connect()  # returns at once when already connected
        return self.connection

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


def send_calls_then(conn: Conn, calls: Sequence[ScriptCall], *commands: bytes) -> list[Any]:
    """Send ``calls`` (merged where they can be) and then ``commands`` in one write, read
    every reply, and return the replies to ``commands``. A call whose script the server
    lost (NOSCRIPT, after a restart) is loaded and made again; another call's error is
    re-raised once every reply was read, so the connection stays in step."""
    merged = merge_calls(calls)
    replies: list[Any] = []
    with _connection(conn) as connection:
        # One buffer, so one write: redis-py sends each list item with its own sendall,
        # and Redis could read, run and answer the first before the second arrived.
        packed = b"".join([*(group.call.packed() for group in merged), *commands])
        connection.send_packed_command([packed], check_health=False)
        for _ in range(len(merged) + len(commands)):
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
    for group, reply in zip(merged, replies, strict=False):
        group.deliver(conn, reply)
    tail = replies[len(merged) :]
    for reply in tail:
        if isinstance(reply, Exception):
            raise reply
    return tail


def run_calls(conn: Conn, calls: Sequence[ScriptCall]) -> None:
    """Make ``calls`` (merged where they can be) one by one: in cluster mode, where
    their keys may live on other shards than what follows them."""
    for group in merge_calls(calls):
        call = group.call
        group.deliver(conn, call.script(conn, call.keys, call.all_args()))


def pipeline(client: redis.Redis, *, transaction: bool = False) -> Any:
    """``client.pipeline(transaction=...)``, that also takes PUBLISH in cluster mode
    (redis-py's cluster pipeline refuses it: a channel has no slot). There the messages
    are published after the pipeline's commands, in order."""
    pipe = client.pipeline(transaction=transaction)
    return _PublishAfter(client, pipe) if cluster.is_cluster(client) else pipe


def apipeline(client: redis.asyncio.Redis) -> Any:
    """:func:`pipeline` for an asyncio client."""
    pipe = client.pipeline(transaction=False)
    return _AsyncPublishAfter(client, pipe) if cluster.is_async_cluster(client) else pipe


class _PublishLater:
    """A cluster pipeline whose PUBLISH calls wait for its ``execute``."""

    def __init__(self, client: Any, pipe: Any) -> None:
        self._client = client
        self._pipe = pipe
        self._messages: list[tuple[Any, Any]] = []

    def publish(self, channel: Any, message: Any) -> _PublishLater:
        self._messages.append((channel, message))
        return self

    @property
    def wrapped(self) -> Any:
        return self._pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


class _PublishAfter(_PublishLater):
    def execute(self) -> list[Any]:
        replies = list(self._pipe.execute())
        replies += [self._client.publish(channel, message) for channel, message in self._messages]
        self._messages.clear()
        return replies


class _AsyncPublishAfter(_PublishLater):
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        replies = list(await self._pipe.execute(raise_on_error=raise_on_error))
        for channel, message in self._messages:
            replies.append(await self._client.publish(channel, message))
        self._messages.clear()
        return replies


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
