"""The ``periodic:`` config section: each entry's cron, time zone, job and arguments,
checked once at load, and the entry's ticks (when it is due).

Two forms, the same entries::

    periodic:                       # a list (name defaults to the job)
      - cron: "*/5 * * * *"
        job: app.jobs.ImportBacklog

    periodic:                       # a mapping by name: a later file can replace one
      refill-imports:               # entry (mappings merge by key, lists are replaced)
        cron: "*/5 * * * *"
        job: app.jobs.ImportBacklog

``limitd check`` prints the mapping form. Ticks are computed by croniter in the entry's
zone (zoneinfo), so they follow its daylight-saving changes: a fixed time that falls in
the hour skipped in spring runs at the first instant after the gap; in the hour repeated
in autumn, an entry with a fixed hour runs once (at the first pass), while an entry that
runs every hour follows real time and runs in both passes.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from limitd.config.files import dotted
from limitd.config.values import Section, describe

if TYPE_CHECKING:
    from croniter import croniter as Croniter

KEY = "periodic"
ENTRY_KEYS = frozenset({"name", "cron", "job", "args", "capacity", "tz", "missed"})
MISSED = ("once", "skip")
_NAME = re.compile(r"\S+")
_CRON_FORMS = "a cron expression of 5 fields, or 6 with seconds first"
_HOUR = 1  # croniter's index of the hour field, with or without seconds


def croniter(*args: Any, **kwargs: Any) -> Croniter:
    """croniter, imported when a cron expression is first read: at import it runs
    ``platform.architecture()``, which starts a ``file`` process, and ``import limitd``
    (the first thing ``limitd start`` does, before its signal handlers exist) should
    start none."""
    from croniter import croniter as make

    return make(*args, **kwargs)


@dataclass(frozen=True)
class PeriodicEntry:
    """One periodic job: which job to enqueue with which arguments, on which ticks.

    ``missed``: what a scheduler starting after every scheduler was down does about the
    ticks nobody enqueued: ``once`` enqueues the latest of them once, ``skip`` none."""

    name: str
    cron: str
    job: str
    args: list[Any] = field(default_factory=list)
    capacity: bool = False
    tz: str = "UTC"
    missed: str = "once"
    # Where the entry was written (file, key path), for errors found later (check_app).
    source: str = field(default="", compare=False, repr=False)
    path: str = field(default=KEY, compare=False, repr=False)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_tick(self, after: float) -> float:
        """The first tick strictly after ``after`` (epoch seconds)."""
        found = self._first(_wall(after, self.zone), after, forward=True)
        repeat = _repeated_hour(after, self.zone)
        if repeat is not None and repeat.first_pass and _every_hour(self.cron):
            # ticks behind us on the wall clock come again in the second pass
            again = self._first(repeat.start - timedelta(microseconds=1), after, forward=True)
            found = min(found, again)
        return found

    def latest_tick(self, at: float) -> float:
        """The last tick at or before ``at`` (epoch seconds)."""
        wall = _wall(at, self.zone).replace(microsecond=0) + timedelta(seconds=1)
        found = self._first(wall, at, forward=False)
        repeat = _repeated_hour(at, self.zone)
        if repeat is not None and not repeat.first_pass:
            # ticks ahead of us on the wall clock already had their first pass
            found = max(found, self._first(repeat.end, at, forward=False))
        return found

    def _first(self, start: datetime, bound: float, forward: bool) -> float:
        """Walking the wall-clock ticks from ``start`` (naive, excluded), the first that
        happens after ``bound`` (forward), or at or before it (backward)."""
        for naive in _walk(self.cron, start, forward):
            hits = [t for t in self.instants(naive) if (t > bound if forward else t <= bound)]
            if hits:
                return min(hits) if forward else max(hits)
        raise AssertionError("unreachable: croniter yields ticks forever")

    def instants(self, naive: datetime) -> list[float]:
        """When a wall-clock tick of the entry's zone happens (epoch seconds): once on
        most days. An entry with a fixed hour runs once a day whatever the clocks do:
        a tick they jump over runs when they jump, one they go back over runs at its
        first pass. An entry that runs every hour follows real time instead: no run
        for wall times that do not exist, a run at both passes of a repeated hour."""
        first = naive.replace(tzinfo=self.zone, fold=0).timestamp()
        second = naive.replace(tzinfo=self.zone, fold=1).timestamp()
        if first == second:
            return [first]
        if first > second:  # no such wall time: the clocks jumped over it
            return [] if _every_hour(self.cron) else [_offset_change(second, first, self.zone)]
        return [first, second] if _every_hour(self.cron) else [first]

    def as_dict(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "job": self.job,
            "args": list(self.args),
            "capacity": self.capacity,
            "tz": self.tz,
            "missed": self.missed,
        }


@dataclass(frozen=True)
class PeriodicSettings:
    """The entries of the ``periodic`` section, in the files' order."""

    entries: tuple[PeriodicEntry, ...] = ()

    def entry(self, name: str) -> PeriodicEntry | None:
        return next((entry for entry in self.entries if entry.name == name), None)


def read_periodic(section: Section, env: Mapping[str, str]) -> PeriodicSettings:
    """The section in either form; every value checked, each error naming the file, the
    key path (``periodic[0].cron``) and what was expected."""
    if isinstance(section.data, list):
        items = [(_item(section, index, raw), None) for index, raw in enumerate(section.data)]
    else:
        items = [(section.section(name), _checked(section, name)) for name in section.data]
    entries: dict[str, PeriodicEntry] = {}
    for item, name in items:
        entry = read_entry(item, name)
        if entry.name in entries:
            where = entries[entry.name].path
            raise item.error(
                "name",
                f"name {entry.name!r} is used twice (also {where}); give each entry its own name",
            )
        entries[entry.name] = entry
    return PeriodicSettings(tuple(entries.values()))


def read_entry(item: Section, name: str | None) -> PeriodicEntry:
    """One entry; ``name`` is its key in the mapping form (None in the list form)."""
    item.check_keys(ENTRY_KEYS if name is None else ENTRY_KEYS - {"name"})
    job = _required(item, "job", "a job name (its wire name or dotted path)")
    return PeriodicEntry(
        name=name if name is not None else _name(item, job),
        cron=_cron(item),
        job=job,
        args=_args(item),
        capacity=item.boolean("capacity", False),
        tz=_tz(item),
        missed=item.choice("missed", MISSED, "once"),
        source=item.layers.origin(item.path),
        path=dotted(item.path),
    )


def as_dict(settings: PeriodicSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it: the mapping form, which reads back."""
    return {entry.name: entry.as_dict() for entry in settings.entries}


def cron_problem(text: str) -> str | None:
    """Why ``text`` is not a cron expression limitd accepts, or None."""
    fields = len(text.split())
    if fields not in (5, 6):
        return f"expected {_CRON_FORMS}, got {fields} field(s) in {text!r}"
    try:
        croniter(text, second_at_beginning=True)
    except (ValueError, KeyError) as exc:  # croniter's errors are ValueErrors
        return f"expected {_CRON_FORMS}, got {text!r} ({exc})"
    return None


@functools.lru_cache(maxsize=256)
def _every_hour(cron: str) -> bool:
    hours = croniter(cron, second_at_beginning=True).expanded[_HOUR]
    return hours == ["*"] or len(hours) == 24


def _walk(cron: str, start: datetime, forward: bool) -> Iterator[datetime]:
    """The entry's wall-clock ticks (naive datetimes) after ``start``, or before it.
    croniter walks naive times, which have no daylight-saving changes to trip on;
    :meth:`PeriodicEntry.instants` places each in real time."""
    ticks = croniter(cron, start, second_at_beginning=True)
    while True:
        yield ticks.get_next(datetime) if forward else ticks.get_prev(datetime)


def in_zone(timestamp: float, zone: ZoneInfo) -> datetime:
    """``timestamp`` as an aware datetime of ``zone``, ``fold`` set in a repeated hour.
    (Through ``fromutc``: freezegun's ``fromtimestamp(ts, zone)`` loses the fold.)"""
    utc = datetime.fromtimestamp(timestamp, timezone.utc)
    return zone.fromutc(utc.replace(tzinfo=zone))


def _wall(timestamp: float, zone: ZoneInfo) -> datetime:
    """The wall-clock time (naive) at ``timestamp`` in ``zone``."""
    return in_zone(timestamp, zone).replace(tzinfo=None)


@dataclass(frozen=True)
class _Repeat:
    """The wall-clock times the clocks went back over (naive ``start`` to ``end``,
    excluded), and whether the instant asked about is in their first pass."""

    start: datetime
    end: datetime
    first_pass: bool


def _repeated_hour(timestamp: float, zone: ZoneInfo) -> _Repeat | None:
    """The repeated wall-clock times ``timestamp`` falls in, if it does."""
    wall = _wall(timestamp, zone)
    passes = sorted(wall.replace(tzinfo=zone, fold=fold).timestamp() for fold in (0, 1))
    if passes[0] == passes[1]:
        return None
    start = _wall(_offset_change(passes[0], passes[1], zone), zone)
    span = timedelta(seconds=passes[1] - passes[0])
    first_pass = abs(timestamp - passes[0]) < abs(timestamp - passes[1])
    return _Repeat(start, start + span, first_pass)


def _offset_change(low_bound: float, high_bound: float, zone: ZoneInfo) -> float:
    """The first whole second after ``low_bound`` with ``high_bound``'s UTC offset
    (when the clocks jumped between the two readings of one wall-clock time): by
    bisection, a dozen steps for an hour."""
    low, high = math.floor(low_bound), math.ceil(high_bound)
    jumped = in_zone(high, zone).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if in_zone(middle, zone).utcoffset() == jumped:
            high = middle
        else:
            low = middle
    return float(high)


def _item(section: Section, index: int, raw: Any) -> Section:
    if not isinstance(raw, dict):
        raise section.error((index,), f"expected a mapping with cron and job, got {describe(raw)}")
    return Section(raw, (*section.path, index), section.layers)


def _required(item: Section, key: str, what: str) -> str:
    found = item.optional_string(key)
    if found is None or not found.strip():
        raise item.error(key, f"expected {what}, got {describe(item.data.get(key))}")
    return found.strip()


def _name(item: Section, default: str) -> str:
    return _checked(item, item.string("name", default), "name")


def _checked(section: Section, name: str, key: str | None = None) -> str:
    """A name as Redis keys and the listing show it: no spaces."""
    if not _NAME.fullmatch(name):
        raise section.error(key or name, f"expected a name without spaces, got {name!r}")
    return name


def _cron(item: Section) -> str:
    text = _required(item, "cron", _CRON_FORMS)
    problem = cron_problem(text)
    if problem is not None:
        raise item.error("cron", problem)
    return " ".join(text.split())


def _tz(item: Section) -> str:
    name = item.string("tz", "UTC")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise item.error(
            "tz", f"expected an IANA time zone such as 'Europe/Berlin' or 'UTC', got {name!r}"
        ) from None
    return name


def _args(item: Section) -> list[Any]:
    raw = item.data.get("args")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise item.error("args", f"expected a list of arguments, got {describe(raw)}")
    try:
        json.dumps(raw)
    except (TypeError, ValueError):
        raise item.error(
            "args", f"expected JSON values (text, numbers, ...), got {describe(raw)}"
        ) from None
    return list(raw)
