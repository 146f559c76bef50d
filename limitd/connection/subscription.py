"""A pub/sub subscription read in batches, without redis-py's ``PubSub``.

Every push publishes a wake-up, and every capsule process hears every one: a stream of
pushes is a stream of messages in each capsule. redis-py's ``PubSub.get_message`` costs
8 to 13 us of Python per message (its parser's dispatch, a dict per message, health
checks) and one socket call, hence one GIL hand-off, each; with ten busy processor
threads beside it, a capsule paid that for every job pushed while it ran, as much again
as the job itself. Here one ``recv`` takes whatever has arrived, hiredis parses it in C,
and the caller gets all of it in one list.

The connection is made by the client's own connection class (so AUTH, TLS, the
database, RESP3 and a Sentinel's primary lookup apply as everywhere else) and is kept
outside its pool: a subscribed connection can do nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import hiredis
import redis
from redis.exceptions import ConnectionError, ResponseError

from limitd import clock

READ_SIZE = 65536  # bytes per recv: about 1,500 wake-ups
CONFIRM_SECONDS = 10.0  # for Redis to confirm the subscriptions

Message = tuple[bytes, bytes]  # (channel, data)


class Subscription:
    """One connection subscribed to ``channels``; ``read`` returns the messages that
    arrived, waiting up to its timeout for the first. ``close`` when done."""

    def __init__(self, client: redis.Redis, channels: Iterable[str]) -> None:
        self.channels = list(channels)
        pool = client.connection_pool
        self._connection: Any = pool.connection_class(**pool.connection_kwargs)
        self._reader = hiredis.Reader()
        self._pending: list[Message] = []  # messages read with the confirmations
        self._timeout: float | None = None  # the socket's, set only when it changes
        try:
            self._connection.connect()
            self._connection.send_command("SUBSCRIBE", *self.channels)
            self._await_confirmations()
        except BaseException:
            self.close()
            raise

    def read(self, timeout: float) -> list[Message]:
        """The messages received, at least one unless ``timeout`` seconds passed first.
        Raises ConnectionError when the connection is lost."""
        messages, self._pending = self._pending, []
        if not messages and self._receive(timeout):
            self._parse(messages)
        return messages

    def close(self) -> None:
        self._connection.disconnect()

    def _await_confirmations(self) -> None:
        """Until Redis has confirmed every channel: a message published after that is
        heard, which is what a caller re-checking after subscribing relies on."""
        waiting = set(self.channels)
        deadline = clock.monotonic() + CONFIRM_SECONDS
        while waiting:
            left = deadline - clock.monotonic()
            if left <= 0:
                raise ConnectionError(f"Redis did not confirm the subscription to {waiting}")
            if self._receive(left):
                waiting -= self._parse(self._pending)

    def _receive(self, timeout: float) -> bool:
        """Feed the reader what arrives within ``timeout``; False if nothing did."""
        sock = self._connection._sock
        if sock is None:
            raise ConnectionError("the subscription's connection is closed")
        if timeout != self._timeout:  # (each settimeout is a system call)
            sock.settimeout(timeout)
            self._timeout = timeout
        try:
            data = sock.recv(READ_SIZE)
        except (TimeoutError, BlockingIOError):  # TimeoutError is socket.timeout
            return False
        except OSError as exc:
            raise ConnectionError(f"the subscription's connection failed: {exc}") from exc
        if not data:
            raise ConnectionError("Redis closed the subscription's connection")
        self._reader.feed(data)
        return True

    def _parse(self, messages: list[Message]) -> set[str]:
        """Append the complete messages the reader holds to ``messages``; returns the
        channels whose subscription was confirmed among them."""
        confirmed: set[str] = set()
        while (reply := self._next_reply()) is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise ResponseError(str(reply))
            kind = reply[0] if isinstance(reply, list) and len(reply) == 3 else None
            if kind == b"message":
                messages.append((reply[1], reply[2]))
            elif kind == b"subscribe":
                confirmed.add(reply[1].decode("utf-8", "replace"))
        return confirmed

    def _next_reply(self) -> Any:
        """The next complete reply, or False; bytes that are not the Redis protocol end
        the connection (the listener reconnects) rather than the listener's thread."""
        try:
            return self._reader.gets()
        except hiredis.ProtocolError as exc:
            self.close()
            raise ConnectionError(f"the subscription read a malformed reply: {exc}") from exc
