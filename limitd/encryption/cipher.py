"""The sealed form of a job's arguments, and the keyring that seals and opens it.

All the arguments are sealed together, not only the last one as Sidekiq Enterprise
does: a secret passed anywhere but last would otherwise reach Redis in clear without
warning, and even the number of arguments stays private. The payload stays Sidekiq's
wire format: ``args`` is a JSON list, of one string::

    {"class": "Charge", "args": ["limitd:aes256gcm:v2:<base64 nonce + ciphertext>"],
     "encrypt": true, "jid": "...", ...}

The string names the scheme and the key version (so a rotated keyring still opens old
jobs); the rest is a random 96-bit nonce, then AES-256-GCM over the arguments' JSON
with the job's ``jid`` and ``class`` as associated data: a sealed argument copied into
another job, or altered by one bit, does not open.

``cryptography`` is imported when a key is first used, not with ``import limitd``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from limitd.payload import Payload
from limitd.retry import Unretriable

PREFIX = "limitd:aes256gcm:v"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's 96-bit nonce, random per job
SHOWN = "[encrypted]"  # what the dashboard, the CLI and the admin API show for the args


class UndecryptableArguments(Unretriable):
    """A job's sealed arguments do not open: their key version is not configured, the
    key is not the one they were sealed with, or they were altered. The job goes to the
    dead set at once (retrying cannot fix a key) and runs after ``limitd dead retry``
    once the key is configured."""


class NoEncryptionKey(ValueError):
    """The client was asked to seal arguments without any key configured."""


@dataclass(frozen=True)
class Keyring:
    """Versioned 32-byte keys: ``current`` seals new jobs, every listed one opens. To
    rotate, add a version, make it current, and drop the old one once no job sealed
    with it is left (in the queues, the schedule, the retry and dead sets)."""

    keys: Mapping[int, bytes] = field(default_factory=dict)
    current: int | None = None

    def __post_init__(self) -> None:
        for version, key in self.keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"key version {version}: expected {KEY_BYTES} bytes")
        if self.keys and self.current not in self.keys:
            raise ValueError(f"current key version {self.current} is not among the keys")

    def __repr__(self) -> str:  # never the keys themselves
        return f"Keyring(versions={sorted(self.keys)}, current={self.current})"


def decode_key(text: str) -> bytes | None:
    """A key written as base64 (standard or URL-safe, padded or not); None unless it
    decodes to exactly 32 bytes."""
    cleaned = text.strip().replace("-", "+").replace("_", "/")
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        raw = base64.b64decode(cleaned, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == KEY_BYTES else None


def new_key() -> str:
    """A fresh random key, base64, as the config and the environment take it."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def is_sealed(payload: Payload) -> bool:
    """Whether ``payload``'s arguments are in the sealed form."""
    args = payload.get("args")
    return (
        isinstance(args, list)
        and len(args) == 1
        and isinstance(args[0], str)
        and args[0].startswith(PREFIX)
    )


def seal(keyring: Keyring, payload: Payload) -> list[str]:
    """``payload``'s arguments sealed with the current key, as its new ``args``."""
    if keyring.current is None:
        raise NoEncryptionKey(
            f"job {payload.get('class')}: encrypt is set but no encryption key is "
            "configured (the encryption section's keys, or LIMITD_ENCRYPTION_KEYS)"
        )
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE_BYTES)
    plain = json.dumps(payload["args"], separators=(",", ":"), allow_nan=False).encode()
    sealed = AESGCM(keyring.keys[keyring.current]).encrypt(nonce, plain, _bound_to(payload))
    blob = base64.b64encode(nonce + sealed).decode()
    return [f"{PREFIX}{keyring.current}:{blob}"]


def open_sealed(keyring: Keyring, payload: Payload) -> list[Any]:
    """``payload``'s sealed arguments in clear; :class:`UndecryptableArguments` saying
    why when they do not open (never with any of their content)."""
    version, blob = _parts(payload)
    key = keyring.keys.get(version)
    if key is None:
        known = ", ".join(map(str, sorted(keyring.keys))) or "none"
        raise UndecryptableArguments(
            f"arguments sealed with key version {version}, which is not configured "
            f"(configured: {known}); add it and retry the job from the dead set"
        )
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        plain = AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _bound_to(payload))
    except InvalidTag:
        raise UndecryptableArguments(
            f"arguments do not open with key version {version}: the key differs from the "
            "one they were sealed with, or the job (its args, jid or class) was altered"
        ) from None
    args = json.loads(plain)
    if not isinstance(args, list):
        raise UndecryptableArguments("sealed arguments are not a JSON list")
    return args


def _parts(payload: Payload) -> tuple[int, bytes]:
    """The key version and the nonce + ciphertext of sealed arguments."""
    if not is_sealed(payload):
        raise UndecryptableArguments(
            f"the job has encrypt set but its args are not sealed by limitd "
            f"(expected one string starting with {PREFIX!r})"
        )
    version, _, text = payload["args"][0].removeprefix(PREFIX).partition(":")
    try:
        blob = base64.b64decode(text, validate=True)
        number = int(version)
    except (binascii.Error, ValueError):
        raise UndecryptableArguments("sealed arguments are malformed") from None
    if len(blob) <= NONCE_BYTES:
        raise UndecryptableArguments("sealed arguments are truncated")
    return number, blob


def _bound_to(payload: Payload) -> bytes:
    """The associated data: what the ciphertext belongs to."""
    return f"{payload.get('jid')}\n{payload.get('class')}".encode()
