"""The job payload: a JSON object in Sidekiq's format.

Fields limitd writes: ``class``, ``args``, ``queue``, ``jid`` (24 hex chars),
``created_at``, ``enqueued_at``, ``retry`` and, after a failure, ``retry_count``,
``failed_at``, ``retried_at``, ``error_class``, ``error_message``. Unknown fields are
kept untouched, so features (and Ruby Sidekiq) can add their own.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from limitd import codec

Payload = dict[str, Any]

STRICT_ARGS_MODES = ("raise", "warn", "off")
DEFAULT_QUEUE = "default"
_MILLISECONDS_THRESHOLD = 100_000_000_000  # epoch seconds reach this in the year 5138


class MalformedPayload(ValueError):
    """A queued job that cannot be run whatever happens next: it goes straight to the
    dead set with this reason instead of being retried."""

    wire_name = "limitd.MalformedPayload"


class UnsafeArgument(TypeError):
    """A job argument that JSON cannot carry faithfully (it would not come back equal)."""


def new_jid() -> str:
    """A random job id in Sidekiq's format: 12 random bytes as 24 hex characters (from the
    OS's CSPRNG, as ``secrets.token_hex`` is, without its two extra calls per job)."""
    return os.urandom(12).hex()


def to_seconds(value: Any) -> float | None:
    """Read a timestamp written as float seconds (Sidekiq <= 7, limitd) or integer
    milliseconds (Sidekiq 8)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= _MILLISECONDS_THRESHOLD:
        return value / 1000.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def dumps(payload: Payload) -> str:
    """Compact JSON, as Sidekiq writes it (see ``limitd.codec``)."""
    return codec.encode(payload)


def _decode(raw: bytes | str) -> Payload:
    """A JSON object, strictly: NaN and Infinity are refused (Sidekiq's JSON refuses them,
    and a payload holding one could never be written back for a retry)."""
    data = codec.decode(raw)
    if not isinstance(data, dict):
        raise MalformedPayload(f"payload is a JSON {type(data).__name__}, not an object")
    return data


def parse(raw: bytes | str) -> Payload:
    """Decode a payload fetched from Redis, or say precisely why it cannot be run."""
    try:
        data = _decode(raw)
    except MalformedPayload:
        raise
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise MalformedPayload(f"payload is not valid JSON: {exc}") from exc
    except Exception as exc:
        # A document nested too deep raises RecursionError, a huge one MemoryError.
        # Whatever stops the decoder, retrying will not help.
        raise MalformedPayload(f"payload cannot be decoded: {_describe_error(exc)}") from exc
    if not isinstance(data.get("class"), str) or not data["class"]:
        raise MalformedPayload("payload has no 'class' string")
    if not isinstance(data.get("args"), list):
        raise MalformedPayload("payload has no 'args' list")
    return data


def describe_job(raw: bytes | str) -> str:
    """``jid=... class=...`` of a fetched job for a log line, whatever state it is in."""
    try:
        payload = parse(raw)
    except MalformedPayload:
        return "jid=None class=None (undecodable payload)"
    return f"jid={payload.get('jid')} class={payload['class']}"


def _describe_error(exc: BaseException) -> str:
    """``RecursionError: maximum recursion depth exceeded ...``, cut to one short line."""
    return f"{type(exc).__name__}: {exc}"[:200]


def find_unsafe(value: Any, path: str = "args") -> tuple[str, Any] | None:
    """The first value under ``value`` that does not survive a JSON round trip, with its
    path (``args[1]['when']``), or None. Tuples, sets, datetimes, objects, non-string
    keys and NaN/infinity are all unsafe: the job would see something else."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if type(value) is list:
        children = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    elif type(value) is dict:
        bad_key = next((key for key in value if not isinstance(key, str)), None)
        if bad_key is not None:
            return (f"{path} key {bad_key!r}", bad_key)
        children = ((f"{path}[{key!r}]", item) for key, item in value.items())
    else:
        return (path, value)
    for child_path, item in children:
        found = find_unsafe(item, child_path)
        if found:
            return found
    return None


def check_args(job_name: str, args: list[Any], mode: str = "raise") -> None:
    """Enforce the strict-arguments policy (``raise``, ``warn`` or ``off``)."""
    if mode == "off" or (type(args) is list and all(type(arg) in codec.SCALARS for arg in args)):
        return  # the common case, checked without a call per argument
    found = find_unsafe(args)
    if found is None:
        return
    path, value = found
    message = (
        f"arguments of job {job_name} must be plain JSON types (None, bool, int, finite "
        f"float, str, list, dict with str keys): {path} is {value!r} of type "
        f"{type(value).__name__}"
    )
    if mode == "raise":
        raise UnsafeArgument(message)
    warnings.warn(message, stacklevel=4)


def dead_entry_for_malformed(raw: bytes | str, queue: str, reason: str, now: float) -> str:
    """What the dead set keeps for a job that could not be parsed (see ``dead_entry``)."""
    return dead_entry(raw, queue, MalformedPayload.wire_name, reason, now)


def dead_entry(raw: bytes | str, queue: str, error_class: str, reason: str, now: float) -> str:
    """What the dead set keeps for a job buried without running: the original object
    with the error added when it is a JSON object that can be written back, otherwise an
    envelope that carries the raw text, so an operator can see and repair it. Nothing is
    dropped."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    error = {
        "error_class": error_class,
        "error_message": reason[:10_000],
        "failed_at": now,
        "queue": queue,
    }
    try:
        return dumps({**_decode(text), **error})
    except Exception:  # undecodable or unwritable for any reason: keep the raw text
        envelope = {"class": MalformedPayload.wire_name, "args": [], "jid": new_jid()}
        return dumps({**envelope, "retry": False, "raw": text, **error})
