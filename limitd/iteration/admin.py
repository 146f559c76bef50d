"""An iterable job's progress, as the admin API, ``limitd progress`` and the dashboard's
Busy page read it: the state the job's runs leave in ``limitd:iteration:<jid>`` (see
``store.py``). Read-only; cancelling is ``limitd.api.cancel``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import redis as redis_py

from limitd import keys
from limitd.client import connection_or_default
from limitd.iteration.store import decode_cursor


@dataclasses.dataclass(frozen=True)
class IterationProgress:
    """Where an iterable job is: ``state`` (running, interrupted, failed, completed,
    cancelled, expired), the ``cursor`` of the last item done (None before the first), the
    ``items`` done and the ``runs`` started over all its runs, their total ``runtime``
    in seconds, and when it started and last saved (epoch seconds)."""

    jid: str
    job_class: str | None
    state: str
    cursor: Any
    items: int
    runs: int
    runtime: float
    started_at: float | None
    updated_at: float | None
    cancelled_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def iteration_progress(
    jid: str, redis: redis_py.Redis | None = None
) -> IterationProgress | None:
    """The progress of the iterable job ``jid``, or None when it has none (not an
    iterable job, not started yet, or finished more than a day ago)."""
    return iteration_progress_of([jid], redis).get(jid)


def iteration_progress_of(
    jids: Sequence[str], redis: redis_py.Redis | None = None
) -> dict[str, IterationProgress]:
    """The progress of those of ``jids`` that have one, in one round trip (the Busy
    page asks for every job it lists)."""
    conn = connection_or_default(redis)
    layout = keys.of(conn)
    pipe = conn.pipeline(transaction=False)
    for jid in jids:
        pipe.hgetall(layout.iteration(jid))
    replies = pipe.execute() if jids else []
    found = {}
    for jid, fields in zip(jids, replies, strict=True):
        if fields:
            found[jid] = _progress(jid, {_text(k): _text(v) for k, v in fields.items()})
    return found


def _progress(jid: str, fields: dict[str, str]) -> IterationProgress:
    return IterationProgress(
        jid=jid,
        job_class=fields.get("class"),
        state=fields.get("state", "unknown"),
        cursor=_cursor(fields.get("cursor")),
        items=int(fields.get("items") or 0),
        runs=int(fields.get("runs") or 0),
        runtime=float(fields.get("runtime") or 0.0),
        started_at=_float(fields.get("started_at")),
        updated_at=_float(fields.get("updated_at")),
        cancelled_at=_float(fields.get("cancelled_at")),
    )


def _cursor(raw: str | None) -> Any:
    try:
        return decode_cursor(raw)
    except ValueError:
        return raw  # written by something else: shown as it is


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
