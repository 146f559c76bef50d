"""Waking idle fetchers the moment work may be available, without polling Redis.

A limit-aware fetch is a Lua call, so it cannot block like BRPOP. Instead, producers
publish the queue name on ``limitd:wake`` when they push (and acks publish when they free
a slot of a limited queue with a backlog); each capsule subscribes once, and a message
wakes the capsule's dispatcher, whose next call serves every idle processor. While
idle, one waiter per capsule also re-checks every ``poll_range`` seconds: jobs pushed
by clients that do not publish (Ruby Sidekiq) still start within that delay. A queue
held back only by its rate limit publishes nothing when its time comes: the fetch says
when that is, and the polling waiter wakes then (``wait(at_most=...)``).

Every push is heard by every capsule process, busy or not, so the listener reads what
has arrived in one go (``limitd.connection.subscription``) and handles a message heard
several times since its last read once, each channel's handler called once per read
with what was heard on it: a busy capsule paid about 60 us of CPU per wake-up when each
was read and handled on its own (``bench/wakeups.py``).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping

import redis as redis_py

from limitd.connection import cluster
from limitd.connection.subscription import Message, Subscription
from limitd.fetch import WakeHandler

log = logging.getLogger("limitd.wakeup")

LONG_WAIT = 60.0  # followers re-check this often even if every signal were lost
RECONNECT_PAUSE = 1.0
LISTEN_SLICE = 0.25


class IdleGate:
    """Where a capsule's idle processors wait. ``wait`` returns on a wake-up, on the poll
    timeout (for the one waiter that polls), or on ``close``."""

    def __init__(
        self,
        poll_range: tuple[float, float] = (0.4, 0.5),
        max_pending: int = 64,
        rng: random.Random | None = None,
    ) -> None:
        self.poll_range = poll_range
        self.max_pending = max_pending
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._pending = 0
        self._waiting = 0
        self._poller_waiting = False
        self._closed = False

    def wait(self, at_most: float | None = None) -> None:
        """Block until there may be work. Called after a fetch found none; ``at_most``:
        seconds until a rate limit lets a waiting job go, which shortens the poll."""
        with self._cond:
            polls = not self._poller_waiting
            self._poller_waiting = self._poller_waiting or polls
            self._waiting += 1
            timeout = self._rng.uniform(*self.poll_range) if polls else LONG_WAIT
            if polls and at_most is not None:
                timeout = min(timeout, at_most)
            try:
                self._cond.wait_for(lambda: self._pending > 0 or self._closed, timeout)
                if self._pending > 0:
                    self._pending -= 1
            finally:
                self._waiting -= 1
                if polls:
                    self._poller_waiting = False

    def wake(self, count: int = 1) -> None:
        """Let up to ``count`` waiters (or the next ones to wait) try a fetch."""
        with self._cond:
            self._pending = min(self._pending + count, self.max_pending)
            self._cond.notify(count)

    def wake_one_more(self) -> None:
        """After a successful fetch: if others are idle, there may be more work."""
        with self._cond:
            if self._waiting > self._pending:
                self._pending += 1
                self._cond.notify(1)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class WakeupListener:
    """One pub/sub connection per capsule, for every channel the capsule listens to
    (``limitd:wake`` for its fetch, ``limitd:wake:due`` for its scheduled poller).
    ``handlers`` maps each channel to its ``WakeHandler``, called once per read."""

    def __init__(self, redis: redis_py.Redis, handlers: Mapping[str, WakeHandler]) -> None:
        self.redis = redis
        self.handlers = dict(handlers)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-wakeup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The listener notices within ``LISTEN_SLICE`` seconds (reading a subscription
        sends no command, so short slices cost Redis nothing)."""
        self._done.set()
        if self._thread.ident is not None:
            self._thread.join(2)

    def _subscriber(self) -> redis_py.Redis:
        """Where to subscribe. In a cluster a message published on any node reaches
        every node, so one node will do: a random one, chosen again after each loss (it
        may have failed over)."""
        if not cluster.is_cluster(self.redis):
            return self.redis
        return cluster.one_node(self.redis)

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                self._listen()
            except (redis_py.RedisError, OSError, ValueError, AttributeError) as exc:
                if self._done.is_set():
                    return
                log.warning("wake-up subscription lost, reconnecting: %s", exc)
                self._done.wait(RECONNECT_PAUSE)

    def _listen(self) -> None:
        subscriber = self._subscriber()
        try:
            subscription = Subscription(subscriber, self.handlers)
        finally:
            if subscriber is not self.redis:
                subscriber.close()  # (the subscription keeps a connection of its own)
        try:
            for handler in self.handlers.values():
                handler([""])  # anything published while we were not subscribed
            while not self._done.is_set():
                self._dispatch(subscription.read(LISTEN_SLICE))
        finally:
            subscription.close()

    def _dispatch(self, messages: list[Message]) -> None:
        """Each channel's handler gets what was heard on it, once per read and each
        text once: a stream of pushes costs the capsule a call per read, not per push
        (one wake-up brings the fetch call that serves every idle processor, and the
        poller needs only the soonest due time)."""
        heard: dict[bytes, dict[str, None]] = {}
        for channel, data in messages:
            heard.setdefault(channel, {})[data.decode("utf-8", "replace")] = None
        for channel, texts in heard.items():
            self.handlers[channel.decode("utf-8", "replace")](list(texts))
