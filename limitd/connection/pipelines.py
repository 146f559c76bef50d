"""Pipelines that work the same standalone and in a cluster (where redis-py's cluster
pipeline refuses PUBLISH), and small typed reads shared by many modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import redis
import redis.asyncio

from limitd import keys
from limitd.connection import cluster

NAMES_PER_ROUND_TRIP = 1000  # see each_pipelined


def pipeline(client: redis.Redis, *, transaction: bool = False) -> Any:
    """``client.pipeline(transaction=...)``, that also takes PUBLISH in cluster mode
    (redis-py's cluster pipeline refuses it: a channel has no slot). There the messages
    are published after the pipeline's commands, in order."""
    pipe = client.pipeline(transaction=transaction)
    return _PublishAfter(client, pipe) if cluster.is_cluster(client) else pipe


def each_pipelined(
    client: redis.Redis, names: Sequence[str], ask: Callable[[Any, str], object]
) -> Iterator[tuple[str, Any]]:
    """Each of ``names`` with the reply to what ``ask(pipe, name)`` queued for it, in
    order, a thousand names per round trip: thousands of queues read in a few."""
    for first in range(0, len(names), NAMES_PER_ROUND_TRIP):
        chunk = names[first : first + NAMES_PER_ROUND_TRIP]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            ask(pipe, name)
        yield from zip(chunk, pipe.execute(), strict=True)


def apipeline(client: redis.asyncio.Redis) -> Any:
    """:func:`pipeline` for an asyncio client."""
    pipe = client.pipeline(transaction=False)
    return _AsyncPublishAfter(client, pipe) if cluster.is_async_cluster(client) else pipe


class _PublishLater:
    """A cluster pipeline whose PUBLISH calls wait for its ``execute``."""

    def __init__(self, client: Any, pipe: Any) -> None:
        self._client = client
        self._pipe = pipe
        keys.attach(self, keys.of(client))
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


def decode_name(value: bytes | str) -> str:
    """A name read from Redis (responses stay bytes, see ``limitd.connection.connect``),
    as text; bytes that are not UTF-8 are replaced, never an error, so a listing shows
    what is there."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def set_members(conn: redis.Redis, key: str) -> list[str]:
    """A set of names (queues, capsule ids), decoded and sorted."""
    members = cast("set[bytes]", conn.smembers(key))
    return sorted(member.decode("utf-8", "replace") for member in members)
