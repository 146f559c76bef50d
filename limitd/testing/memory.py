"""The testing modes' stand-in for Redis: a ``redis.Redis`` whose connections talk to an
object in this process instead of a server.

Why a connection and not a fake client: limitd's own code then runs unchanged in the
testing modes. The client writes a push as it always does (``SADD`` + ``LPUSH`` +
``PUBLISH``, or ``ZADD schedule``), sync or on an event loop, and the features' middleware
send their scripts (a unique lock, a batch's bookkeeping, tenant counting) as
``EVALSHA``. :class:`MemoryServer` understands exactly that: a pushed job goes to the
mode's :class:`Sink` (recorded by the fake mode, run by the inline mode), and the scripts
of the unique, batch and fair-tenant features are played by their Python twins
(:mod:`limitd.testing.scripts`). Anything else (a limiter's script, an admin read, a job's
own ``limitd.redis_client()`` calls) fails with an error that says it needs a real Redis:
no socket is ever opened.
"""

from __future__ import annotations

import hashlib
import importlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis as redis_py
import redis.asyncio
from redis.exceptions import NoScriptError, ResponseError

from limitd import keys
from limitd.payload import Payload, parse
from limitd.testing.scripts import ScriptTwins


class NeedsRealRedis(ResponseError):
    """What the testing modes' in-memory Redis answers to a command it does not play."""


class Sink(Protocol):
    """Where pushed jobs go: the fake mode records them, the inline mode runs them."""

    def accept(self, payloads: list[Payload]) -> None: ...

    async def aaccept(self, payloads: list[Payload]) -> None: ...


# Replies to the bookkeeping commands of a push, whose values nobody reads.
_ACKNOWLEDGED = {"SADD": 1, "PUBLISH": 0, "EXPIRE": 1}


class MemoryServer:
    """Answers the commands limitd sends while pushing and running jobs (see the module)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.scripts = ScriptTwins(sink)
        self._loaded: dict[str, bytes] = {}  # sha -> source, from SCRIPT LOAD

    def execute(self, args: Sequence[Any]) -> Any:
        """The reply to one command (an exception instance for an error reply)."""
        name, rest = _name(args), [_text(a) for a in args[1:]]
        if name == "LPUSH":
            self.sink.accept(self._immediate(rest))
            return len(rest) - 1
        if name == "ZADD":
            self.sink.accept(self._scheduled(rest))
            return (len(rest) - 1) // 2
        return self._other(name, rest)

    async def aexecute(self, args: Sequence[Any]) -> Any:
        """:meth:`execute` on an event loop: pushed jobs go to the sink's async side."""
        name, rest = _name(args), [_text(a) for a in args[1:]]
        if name == "LPUSH":
            await self.sink.aaccept(self._immediate(rest))
            return len(rest) - 1
        if name == "ZADD":
            await self.sink.aaccept(self._scheduled(rest))
            return (len(rest) - 1) // 2
        return self._other(name, rest)

    def _other(self, name: str, rest: list[str]) -> Any:
        if name in _ACKNOWLEDGED:
            return _ACKNOWLEDGED[name]
        if name == "EXISTS" and rest and all(_is_cancel_flag(key) for key in rest):
            return 0  # ``limitd.cancelled()``: no job is cancelled in the testing modes
        if name == "EVALSHA":
            return self._evalsha(rest)
        if name == "SCRIPT" and rest and rest[0].upper() == "LOAD":
            source = rest[1].encode()
            sha = hashlib.sha1(source).hexdigest()
            self._loaded[sha] = source
            return sha.encode()
        return NeedsRealRedis(
            f"limitd.testing: {name} needs a real Redis (the testing modes keep jobs in "
            "memory and play only what enqueueing, unique jobs, batches and tenant "
            "fairness send)"
        )

    def _evalsha(self, rest: list[str]) -> Any:
        sha, count = rest[0], int(rest[1])
        script_keys, script_args = rest[2 : 2 + count], rest[2 + count :]
        twin = self.scripts.twin(sha)
        if twin is not None:
            return twin(script_keys, script_args)
        source = self._loaded.get(sha)
        if source is None:
            return NoScriptError("NOSCRIPT (limitd.testing)")  # the caller sends SCRIPT LOAD
        header = source.decode(errors="replace").splitlines()[0].lstrip("- ")
        return NeedsRealRedis(
            f"limitd.testing: the script '{header}' needs a real Redis (the testing modes "
            "play only the unique, batch and fair-tenant scripts)"
        )

    @staticmethod
    def _immediate(rest: list[str]) -> list[Payload]:
        """``LPUSH queue:<name> body...``: the jobs, oldest first (fetchers take from the
        right, and the client pushes a queue's bodies in the order it was given them)."""
        return [parse(body) for body in rest[1:]]

    @staticmethod
    def _scheduled(rest: list[str]) -> list[Payload]:
        """``ZADD schedule score body ...``: the jobs, each with its time as ``at``."""
        if rest[0] != keys.STANDALONE.SCHEDULE:
            raise NeedsRealRedis(f"limitd.testing: ZADD {rest[0]} needs a real Redis")
        pairs = zip(rest[1::2], rest[2::2], strict=True)
        return [{**parse(body), "at": float(score)} for score, body in pairs]


def _words(args: Sequence[Any]) -> list[Any]:
    """A command as redis-py sends it unpacked: its name may hold several words
    (``"SCRIPT LOAD"``), which the packed form splits, as here."""
    if args and isinstance(args[0], str) and " " in args[0]:
        return [*args[0].split(), *args[1:]]
    return list(args)


def _is_cancel_flag(key: str) -> bool:
    return key.startswith(keys.STANDALONE.cancel_flag(""))


def _name(args: Sequence[Any]) -> str:
    return _text(args[0]).upper()


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode()
    return str(value)


def parse_commands(packed: bytes) -> list[list[bytes]]:
    """RESP arrays of bulk strings (what redis-py packs) back into argument lists."""
    commands: list[list[bytes]] = []
    view, at = bytes(packed), 0
    while at < len(view):
        end = view.index(b"\r\n", at)
        count, at = int(view[at + 1 : end]), end + 2
        args = []
        for _ in range(count):
            end = view.index(b"\r\n", at)
            size, at = int(view[at + 1 : end]), end + 2
            args.append(view[at : at + size])
            at += size + 2
        commands.append(args)
    return commands


def _joined(command: Any) -> bytes:
    if isinstance(command, (bytes, bytearray, memoryview)):
        return bytes(command)
    return b"".join(bytes(part) for part in command)


class MemoryConnection(redis_py.Connection):
    """A redis-py connection to a :class:`MemoryServer`: every reply is worked out as the
    command is sent, and read back in order."""

    def __init__(self, *, server: MemoryServer, **settings: Any) -> None:
        super().__init__(**settings)
        self.server = server
        self._replies: deque[Any] = deque()

    def connect(self) -> None:
        """Nothing to open."""

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._replies.clear()

    def can_read(self, timeout: float | None = 0) -> bool:
        return False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._answer(parse_commands(_joined(command)), self.server.execute)

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        self._answer([_words(args)], self.server.execute)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return _reply(self._replies.popleft())

    def _answer(self, commands: list[list[Any]], execute: Callable[[list[Any]], Any]) -> None:
        self._replies.clear()  # a caller that raised before reading leaves none behind
        for args in commands:
            self._replies.append(execute(args))


class AsyncMemoryConnection(redis.asyncio.Connection):
    """:class:`MemoryConnection` for asyncio clients (the async client, async jobs)."""

    def __init__(self, *, server: MemoryServer, **settings: Any) -> None:
        super().__init__(**settings)
        self.server = server
        self._replies: deque[Any] = deque()

    async def connect(self) -> None:
        """Nothing to open."""

    async def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._replies.clear()

    async def can_read(self) -> bool:
        return False

    async def can_read_destructive(self) -> bool:
        return False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._replies.clear()
        for args in parse_commands(_joined(command)):
            self._replies.append(await self.server.aexecute(args))

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        self._replies.clear()
        self._replies.append(await self.server.aexecute(_words(args)))

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return _reply(self._replies.popleft())


def _reply(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


# The asyncio twin of a client (limitd.connection.loop_twin, used by the async client,
# async jobs and ``batch.aio``) is built for its connection class: ours is registered.
# (The module, not the ``connect`` function the package exports under the same name.)
importlib.import_module("limitd.connection.connect").register_async_connection(
    MemoryConnection, AsyncMemoryConnection
)


def memory_redis(server: MemoryServer) -> redis_py.Redis:
    """A ``redis.Redis`` whose every command goes to ``server``."""
    pool = redis_py.ConnectionPool(connection_class=MemoryConnection, server=server)
    return redis_py.Redis(connection_pool=pool)
