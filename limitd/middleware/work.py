"""Redis work described as data, and the two runners that make it.

Middleware hooks do not talk to Redis: they return the work to do, a
:class:`~limitd.connection.ScriptCall` (``SCRIPT.later(keys, args)``) or a :class:`Command`,
and the chain runs it, with :func:`run_work` for sync code and :func:`arun_work` on an
event loop. Those two functions are the only place where a feature's Redis work differs
by ``await``: each feature's decisions are written once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import redis as redis_py
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError

from limitd.connection import ScriptCall, cluster, pipeline

# The clients limitd talks to: a standalone (or Sentinel) client, or a cluster client.
RedisClient: TypeAlias = "redis_py.Redis | redis.cluster.RedisCluster"
AsyncRedisClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"


class Command:
    """A plain Redis command to send later, named by its redis-py method (``"zadd"``,
    ``"publish"``) so a pipeline's own handling applies (PUBLISH in cluster mode)."""

    __slots__ = ("args", "method")

    def __init__(self, method: str, *args: Any) -> None:
        self.method = method
        self.args = args

    def __repr__(self) -> str:
        return f"Command({self.method}, {self.args!r})"

    def send(self, conn: Any) -> Any:
        """Send on ``conn`` (a client or a pipeline, sync or asyncio)."""
        return getattr(conn, self.method)(*self.args)


Work: TypeAlias = "ScriptCall | Command"


def as_list(work: Work | Sequence[Work] | None) -> Sequence[Work]:
    """One piece of work, several or none, as a sequence."""
    if work is None:
        return ()
    if isinstance(work, (ScriptCall, Command)):
        return (work,)
    return work


def run_work(conn: RedisClient, work: Work | Sequence[Work]) -> list[Any]:
    """Make ``work`` now, in one round trip when there are several pieces (a pipeline),
    and return the replies in order (a script call's ``on_reply`` gets its own)."""
    pieces = as_list(work)
    if len(pieces) == 1:
        return [_run_one(conn, pieces[0])]
    pipe = pipeline(conn)  # type: ignore[arg-type]
    for piece in pieces:
        if isinstance(piece, ScriptCall):
            piece.script(pipe, piece.keys, piece.all_args())
        else:
            piece.send(pipe)
    return [_delivered(piece, reply) for piece, reply in zip(pieces, pipe.execute(), strict=True)]


async def arun_work(conn: AsyncRedisClient, work: Work | Sequence[Work]) -> list[Any]:
    """:func:`run_work` on an asyncio client. In cluster mode the pieces go one by one
    (their keys may be on several shards); a script the server lost (NOSCRIPT, after a
    restart) is loaded and its call made again on its own."""
    pieces = as_list(work)
    if len(pieces) == 1 or cluster.is_async_cluster(conn):
        return [await _arun_one(conn, piece) for piece in pieces]
    pipe = conn.pipeline(transaction=False)
    for piece in pieces:
        if isinstance(piece, ScriptCall):
            keys = piece.keys
            pipe.evalsha(piece.script.sha, len(keys), *keys, *piece.all_args())
        else:
            piece.send(pipe)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    for index, (piece, reply) in enumerate(zip(pieces, replies, strict=True)):
        if isinstance(reply, NoScriptError) and isinstance(piece, ScriptCall):
            replies[index] = await piece.arun(conn)  # type: ignore[arg-type]
        elif isinstance(reply, Exception):
            raise reply
        else:
            replies[index] = _delivered(piece, reply)
    return replies


def _run_one(conn: RedisClient, piece: Work) -> Any:
    if isinstance(piece, ScriptCall):
        return piece.run(conn)
    return piece.send(conn)


async def _arun_one(conn: AsyncRedisClient, piece: Work) -> Any:
    if isinstance(piece, ScriptCall):
        return await piece.arun(conn)  # type: ignore[arg-type]
    return await piece.send(conn)


def _delivered(piece: Work, reply: Any) -> Any:
    """A pipelined piece's reply, as running it alone would return it."""
    return piece.delivered(reply) if isinstance(piece, ScriptCall) else reply
