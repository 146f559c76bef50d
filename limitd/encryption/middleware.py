"""Sealing a job's arguments on the client, opening them around ``perform`` only.

``@limitd.job(encrypt=True)`` (or ``.set(encrypt=True)`` for one push) puts
``"encrypt": true`` in the payload; :class:`SealArgs`, the last client middleware,
replaces its ``args`` with their sealed form (``limitd.encryption.cipher``) just before
the write. The client middleware before it (unique's digest, the tenant hook) see the
arguments in clear, so unique jobs still match; the lock key then holds a SHA-256 of the
clear arguments, which the docs warn about for guessable values.

On the server, :class:`OpenArgs` (innermost but for the features registered after it)
puts the clear arguments in the payload as the job starts and the sealed ones back as
the chain unwinds, before the retry decision: the retry set, the dead set, the error
and death handlers and a limiter's reschedule all write the sealed form. Arguments that
do not open raise :class:`~limitd.encryption.cipher.UndecryptableArguments`, which the
retry handler sends to the dead set at once (see ``limitd.retry.Unretriable``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from limitd.encryption.cipher import (
    Keyring,
    UndecryptableArguments,
    is_sealed,
    open_sealed,
    seal,
)
from limitd.middleware.base import ClientMiddleware, Ending, ServerMiddleware
from limitd.middleware.work import RedisClient, Work
from limitd.payload import Payload
from limitd.spec import JobSpec

SEALED_FIELD = "_limitd_sealed_args"  # the sealed args while the job runs; never written


class KeySource:
    """The keyring, loaded when first needed (a process that never seals or opens does
    not read keys, nor import ``cryptography``), or set from the loaded config."""

    def __init__(self, load: Callable[[], Keyring]) -> None:
        self._load = load
        self._keyring: Keyring | None = None
        self._lock = threading.Lock()

    def use(self, keyring: Keyring) -> None:
        self._keyring = keyring

    def get(self) -> Keyring:
        with self._lock:
            if self._keyring is None:
                self._keyring = self._load()
            return self._keyring


class SealArgs(ClientMiddleware):
    """Client middleware: a job with ``encrypt`` set leaves with its arguments sealed
    under the current key. Arguments already sealed (a payload passing the chain again)
    are left as they are."""

    def __init__(self, keys: KeySource) -> None:
        self.keys = keys

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        return bool(payload.get("encrypt"))

    def push_work(self, spec: JobSpec | None, payload: Payload) -> Work | None:
        """No Redis work: the payload is changed in place, the last step before the write."""
        if payload.get("encrypt") and not is_sealed(payload):
            payload["args"] = seal(self.keys.get(), payload)
        return None


class OpenArgs(ServerMiddleware):
    """Server middleware: the arguments in clear for ``perform``, sealed again after."""

    def __init__(self, redis: RedisClient | None, keys: KeySource) -> None:
        self.redis = redis
        self.keys = keys

    concerns_fields = frozenset({"encrypt"})

    def concerns(self, payload: Payload) -> bool:
        return bool(payload.get("encrypt"))

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> Work | None:
        try:
            keyring = self.keys.get()
        except ValueError as exc:  # the environment's keys are malformed
            raise UndecryptableArguments(f"encryption keys could not be read: {exc}") from None
        clear = open_sealed(keyring, payload)
        payload[SEALED_FIELD] = payload["args"]
        payload["args"] = clear
        return None

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> Ending | None:
        """Whatever the outcome, the payload holds the sealed arguments again before
        anything records it."""
        restore(payload)
        return None


def restore(payload: Payload) -> Any:
    """Put the sealed arguments back, if ``payload`` had them opened."""
    sealed = payload.pop(SEALED_FIELD, None)
    if sealed is not None:
        payload["args"] = sealed
    return sealed
