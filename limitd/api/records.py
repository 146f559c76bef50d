"""What every part of the admin API shares: the record of one stored
job, and the bookkeeping that keeps paged iteration stable.

Every record keeps the exact bytes Redis holds, because removing it (LREM, ZREM) must
name the stored value exactly. A value that is not a runnable payload is still listed,
with ``payload`` None and its raw text, so an operator can delete or kill it.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any

from limitd import clock
from limitd.encryption.cipher import SHOWN, is_sealed
from limitd.payload import DEFAULT_QUEUE, MalformedPayload, Payload, parse, to_seconds

PAGE_SIZE = 100


class _Seen:
    """What one iteration yielded and the caller has not removed since, newest first:
    the anchors the next page resumes after (see the page scripts). Entries deleted,
    retried or killed through the API leave it, so acting on entries while iterating
    never loses the iterator's place."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: deque[bytes] = deque()

    def add(self, raw: bytes) -> None:
        self.entries.appendleft(raw)

    def anchors(self) -> list[bytes]:
        """The newest ``size`` entries kept. Trimmed only here, between pages, so the
        caller's removals from the page just read leave older survivors as anchors."""
        while len(self.entries) > self.size:
            self.entries.pop()
        return list(self.entries)

    def discard(self, raw: bytes) -> None:
        with contextlib.suppress(ValueError):
            self.entries.remove(raw)


class JobRecord:
    """One stored job, read-only: the payload fields an operator looks at.

    ``raw`` is the value exactly as Redis holds it. ``payload`` is None when those bytes
    are not a payload a server could run (``parse_error`` says why): the record then has
    no jid, class or queue, and ``text`` shows what is there."""

    def __init__(self, raw: bytes, seen: _Seen | None = None) -> None:
        self.raw = raw
        self._seen = seen
        self.payload: Payload | None = None
        self.parse_error: str | None = None
        try:
            self.payload = parse(raw)
        except MalformedPayload as exc:
            self.parse_error = str(exc)

    def get(self, field: str, default: Any = None) -> Any:
        """A payload field, or ``default`` when absent or the entry is malformed."""
        return default if self.payload is None else self.payload.get(field, default)

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "backslashreplace")

    def get_str(self, field: str) -> str | None:
        """A string payload field, or None (absent, not a string, or malformed)."""
        value = self.get(field)
        return value if isinstance(value, str) else None

    @property
    def jid(self) -> str | None:
        return self.get_str("jid")

    @property
    def klass(self) -> str | None:
        """The ``class`` field: the job's wire name."""
        return self.get_str("class")

    @property
    def args(self) -> list[Any]:
        """The arguments as an operator sees them: ``["[encrypted]"]`` for a job whose
        arguments are sealed (``limitd.encryption``; the sealed form is in ``payload``)."""
        if self.get("encrypt") and self.payload is not None and is_sealed(self.payload):
            return [SHOWN]
        return list(self.get("args", []))

    @property
    def queue(self) -> str | None:
        """The queue the job runs in (where ``retry()`` sends it)."""
        return None if self.payload is None else str(self.get("queue") or DEFAULT_QUEUE)

    @property
    def enqueued_at(self) -> float | None:
        return to_seconds(self.get("enqueued_at"))

    @property
    def created_at(self) -> float | None:
        return to_seconds(self.get("created_at"))

    @property
    def failed_at(self) -> float | None:
        return to_seconds(self.get("failed_at"))

    @property
    def error_class(self) -> str | None:
        return self.get_str("error_class")

    @property
    def error_message(self) -> str | None:
        return self.get_str("error_message")

    @property
    def retry_count(self) -> int | None:
        count = self.get("retry_count")
        return count if isinstance(count, int) else None

    def latency(self) -> float:
        """Seconds since the job was enqueued (or created), never negative; 0.0 when the
        entry carries no timestamp."""
        since = self.enqueued_at or self.created_at
        return 0.0 if since is None else max(0.0, clock.now() - since)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} jid={self.jid} class={self.klass}>"

    def _removed(self, moved: bool) -> bool:
        if moved and self._seen is not None:
            self._seen.discard(self.raw)
        return moved
