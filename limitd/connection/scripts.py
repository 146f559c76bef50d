"""Lua scripts: one :class:`LuaScript` per ``.lua`` file, whose text is read once and
called with EVALSHA, loaded into the server only when it answers NOSCRIPT (after a
restart or a SCRIPT FLUSH); and :class:`ScriptCall`, a call prepared now and made later,
so a job's bookkeeping can travel with its acknowledgement in one round trip."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.client import Pipeline
from redis.cluster import ClusterPipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from limitd.connection import cluster
from limitd.connection.pipelines import _PublishAfter
from limitd.connection.wire import (
    Conn,
    OwnConnection,
    _connection,
    bulk,
    client_of,
    command_from,
    pack_command,
    send_packed,
)


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
        return self.delivered(self.script(conn, self.keys, self.all_args()))

    async def arun(self, conn: redis.asyncio.Redis) -> Any:
        """:meth:`run` on an asyncio client."""
        return self.delivered(await self.script.acall(conn, self.keys, self.all_args()))

    def delivered(self, reply: Any) -> Any:
        """The script's raw reply (however it was sent) as this call's: a mergeable
        call's own group, handed to ``on_reply`` too."""
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

    ``prelude`` names ``.lua`` files holding local functions that several scripts share
    (of the same package, or ``(package, file)`` of another); they are prepended, so
    each call is still one script."""

    def __init__(
        self, package: str, filename: str, prelude: Sequence[str | tuple[str, str]] = ()
    ) -> None:
        parts = [
            resources.files(part[0] if isinstance(part, tuple) else package)
            .joinpath(part[1] if isinstance(part, tuple) else part)
            .read_bytes()
            for part in (*prelude, filename)
        ]
        self.name = filename
        self.set_source(b"\n".join(parts))

    def set_source(self, source: bytes) -> None:
        """The text the script runs (a subclass may add to the file's)."""
        self.source = source
        self._script = Script(None, self.source)  # type: ignore[arg-type]
        self.sha: str = self._script.sha  # what EVALSHA names it by
        self._sha = self.sha.encode()
        self._evalsha = bulk(b"EVALSHA") + bulk(self._sha)

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
        return self.send(conn, self.packed(keys, args))

    def send(self, conn: Any, command: bytes) -> Any:
        """Send this script's packed call (``packed`` or ``packed_from``) on ``conn``, a
        client or an own connection, loading the script first if Redis lacks it."""
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

    def packed_from(
        self, keys: int, key_parts: list[bytes], args: int, arg_parts: list[bytes]
    ) -> bytes:
        """The call of ``packed`` from arguments already in RESP (``bulk``): ``keys``
        keys in ``key_parts``, then ``args`` arguments in ``arg_parts``."""
        return command_from(3 + keys + args, [self._evalsha, bulk(keys), *key_parts, *arg_parts])

    def later(
        self,
        keys: Sequence[Any],
        args: Sequence[Any],
        on_reply: Callable[[Any], None] | None = None,
        shared: tuple[Any, ...] | None = None,
    ) -> ScriptCall:
        """This call, to be made later (see :class:`ScriptCall`)."""
        return ScriptCall(self, keys, args, on_reply, shared)


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
