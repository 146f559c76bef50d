"""The wake-up subscription, on a real Redis: read in batches, confirmed before use,
lost connections noticed, and each distinct message of a batch handled once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import pytest
import redis as redis_py

from limitd import keys
from limitd.connection.subscription import Subscription
from limitd.fetch.wakeup import WakeupListener
from tests.helpers import wait_for

CHANNEL = keys.WAKE_CHANNEL


def subscribers(redis: redis_py.Redis, channel: str = CHANNEL) -> int:
    return int(dict(redis.pubsub_numsub(channel)).get(channel.encode(), 0))


def publish_all(redis: redis_py.Redis, messages: list[tuple[str, str]]) -> None:
    """In one round trip: Redis hands them to each subscriber in one write."""
    pipe = redis.pipeline(transaction=False)
    for channel, text in messages:
        pipe.publish(channel, text)
    pipe.execute()


@pytest.fixture
def subscription(redis: redis_py.Redis) -> Iterator[Subscription]:
    made = Subscription(redis, [CHANNEL, keys.DUE_CHANNEL])
    yield made
    made.close()


def test_the_subscription_is_in_place_once_made(
    redis: redis_py.Redis, subscription: Subscription
) -> None:
    assert subscribers(redis) == 1 and subscribers(redis, keys.DUE_CHANNEL) == 1


def test_messages_come_in_order_several_per_read(
    redis: redis_py.Redis, subscription: Subscription
) -> None:
    sent = [(CHANNEL if n % 3 else keys.DUE_CHANNEL, f"m{n}") for n in range(500)]
    publish_all(redis, sent)
    heard: list[tuple[bytes, bytes]] = []
    reads = 0
    while len(heard) < len(sent) and reads < len(sent):
        heard += subscription.read(5.0)
        reads += 1
    assert heard == [(channel.encode(), text.encode()) for channel, text in sent]
    assert reads < 50  # 500 messages, not a read each


def test_a_read_with_nothing_published_returns_nothing_after_its_timeout(
    subscription: Subscription,
) -> None:
    assert subscription.read(0.05) == []


def test_a_killed_connection_raises_a_connection_error(
    redis: redis_py.Redis, subscription: Subscription
) -> None:
    assert redis.client_kill_filter(_type="pubsub") == 1
    with pytest.raises(redis_py.ConnectionError):
        for _ in range(100):  # the kill lands within one read or two
            subscription.read(1.0)


class Recorder:
    """A handler that counts the texts it was given, and its calls."""

    def __init__(self) -> None:
        self.heard: Counter[str] = Counter()
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, texts: Sequence[str]) -> None:
        with self._lock:
            self.heard.update(texts)
            self.calls += 1

    def wait(self, condition: Callable[[Counter[str]], bool], message: str) -> None:
        wait_for(lambda: condition(self.heard), message=message)


@pytest.fixture
def listened(redis: redis_py.Redis) -> Iterator[Recorder]:
    recorder = Recorder()
    listener = WakeupListener(redis, {CHANNEL: recorder})
    listener.start()
    recorder.wait(lambda heard: heard[""] == 1, "the re-check after subscribing")
    yield recorder
    listener.stop()


def test_a_message_heard_many_times_at_once_is_handled_once_per_read(
    redis: redis_py.Redis, listened: Recorder
) -> None:
    publish_all(redis, [(CHANNEL, "busy")] * 200 + [(CHANNEL, "other")])
    listened.wait(lambda heard: heard["other"] == 1, "the last message")
    assert 1 <= listened.heard["busy"] < 200


def test_each_distinct_message_is_handled_in_few_calls(
    redis: redis_py.Redis, listened: Recorder
) -> None:
    names = [f"q{n}" for n in range(300)]
    publish_all(redis, [(CHANNEL, name) for name in names])
    listened.wait(lambda heard: all(heard[name] for name in names), "every queue named")
    assert all(listened.heard[name] == 1 for name in names)
    assert listened.calls - 1 < 30  # (the first call was the re-check) not one per name


def test_each_channel_hears_only_its_own_messages(redis: redis_py.Redis) -> None:
    wake, due = Recorder(), Recorder()
    listener = WakeupListener(redis, {CHANNEL: wake, keys.DUE_CHANNEL: due})
    listener.start()
    try:
        wait_for(lambda: subscribers(redis, keys.DUE_CHANNEL) == 1, message="the subscription")
        publish_all(redis, [(CHANNEL, "a"), (keys.DUE_CHANNEL, "12.5"), (CHANNEL, "b")])
        wait_for(lambda: wake.heard["b"] and due.heard["12.5"], message="both channels")
        assert set(wake.heard) == {"", "a", "b"} and set(due.heard) == {"", "12.5"}
    finally:
        listener.stop()


def test_a_lost_subscription_is_remade_and_rechecked(
    redis: redis_py.Redis, listened: Recorder
) -> None:
    assert redis.client_kill_filter(_type="pubsub") == 1
    listened.wait(lambda heard: heard[""] == 2, "the re-check after subscribing again")
    wait_for(lambda: subscribers(redis) == 1, message="the new subscription")
    publish_all(redis, [(CHANNEL, "after")])
    listened.wait(lambda heard: heard["after"] == 1, "a message on the new subscription")


def test_bytes_that_are_not_the_protocol_end_the_connection_not_the_thread(
    redis: redis_py.Redis, subscription: Subscription
) -> None:
    # What a corrupted stream (a proxy gone wrong) would hand the reader, before the
    # next message arrives.
    subscription._reader.feed(b"not the redis protocol\r\n")
    publish_all(redis, [(CHANNEL, "next")])
    with pytest.raises(redis_py.ConnectionError, match="malformed"):
        subscription.read(5.0)
