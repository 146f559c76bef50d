"""Putting a testing mode in place: a default client on the in-memory Redis, kept for
the block and replaced by the one before it afterwards (so modes nest).

The client is an ordinary :class:`limitd.Client` with the middleware the app's default
client has (its own and the features'), or the default chain when none was built yet:
pushes pass the client middleware and the push gates (a Django transaction still holds
its jobs until the commit) exactly as in production. Only the Redis underneath is in
memory. ``job.aio`` and ``Batch.aio`` use the default client's async twin, so they are
covered too. A push through a client the app built itself (``.set(client=...)``) goes
where that client points: a testing mode replaces the default client only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis as redis_py

from limitd import client as client_module
from limitd.client import Client, set_default_client
from limitd.middleware.client_chain import ClientChain
from limitd.middleware.defaults import default_client_chain

_lock = threading.Lock()


def client_chain(extra: Iterable[Any]) -> ClientChain:
    """The app's client middleware: its default client's, else the features' defaults,
    then ``extra``."""
    current = client_module._default
    chain = ClientChain(list(current.middleware)) if current is not None else default_client_chain()
    for middleware in extra:
        chain.add(middleware)
    return chain


@contextmanager
def installed(redis: redis_py.Redis, client_middleware: Iterable[Any]) -> Iterator[Client]:
    """A client on ``redis`` (in memory) as the default client for the block."""
    with _lock:
        before = client_module._default
        chain = client_chain(client_middleware)
        strict = before.strict_args if before is not None else "raise"
        testing = Client(redis, middleware=chain, strict_args=strict)
        set_default_client(testing)
    try:
        yield testing
    finally:
        set_default_client(before)
