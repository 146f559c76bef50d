"""Periodic entries as an operator sees them: when each last ran (which jid) and when it
runs next (what ``limitd periodic`` prints)::

    from limitd.api import periodic_status

    for status in periodic_status():
        print(status.name, status.last_jid, status.next_run)

The entries come from the config when given (``entries``), else from what the
schedulers recorded in Redis when they started (their cron, zone and job). One round
trip to Redis for the records, two without entries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

import redis as redis_py

from limitd import clock
from limitd.client import connection_or_default
from limitd.periodic.section import PeriodicEntry, in_zone
from limitd.periodic.store import PeriodicStore, Record


@dataclasses.dataclass(frozen=True)
class PeriodicStatus:
    """One entry: its schedule, its last run as Redis records it (None: never ran;
    ``last_tick`` is the tick it ran for, ``last_run_at`` when it was enqueued) and its
    next tick after now (epoch seconds)."""

    name: str
    cron: str
    tz: str
    job: str
    last_tick: float | None
    last_jid: str | None
    last_run_at: float | None
    next_run: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def periodic_status(
    redis: redis_py.Redis | None = None,
    entries: Sequence[PeriodicEntry] | None = None,
    *,
    now: float | None = None,
) -> list[PeriodicStatus]:
    """Each entry's status, in the entries' order (by name for recorded ones)."""
    store = PeriodicStore(connection_or_default(redis))
    if entries is None:
        records = store.records(store.names())
        entries = recorded_entries(records)
    else:
        records = store.records(entry.name for entry in entries)
    at = clock.now() if now is None else now
    return [_status(entry, records[entry.name], at) for entry in entries]


def recorded_entries(records: Mapping[str, Record]) -> list[PeriodicEntry]:
    """The entries schedulers recorded when they started, as far as Redis knows them
    (their arguments and options are only in the config)."""
    return [
        PeriodicEntry(name=name, cron=record.cron, job=record.job or "?", tz=record.tz or "UTC")
        for name, record in records.items()
        if record.cron
    ]


def _status(entry: PeriodicEntry, record: Record, now: float) -> PeriodicStatus:
    return PeriodicStatus(
        name=entry.name,
        cron=entry.cron,
        tz=entry.tz,
        job=entry.job,
        last_tick=record.last_tick,
        last_jid=record.last_jid,
        last_run_at=record.last_run_at,
        next_run=entry.next_tick(now),
    )


def local_time(timestamp: float | None, tz: str) -> str:
    """A time as the entry's zone shows it, to the second; "-" for none."""
    if timestamp is None:
        return "-"
    return in_zone(timestamp, ZoneInfo(tz)).isoformat(sep=" ", timespec="seconds")
