"""What Redis records about periodic entries, and the claim that makes each tick run
once.

Keys (built here, and only here):

- ``limitd:periodic:entry:<name>``: hash per entry: ``last_tick`` (epoch seconds of the
  last tick claimed), ``last_jid``, ``last_run_at`` (when it was claimed), and the
  entry's ``cron``, ``tz`` and ``job`` as the last scheduler to start saw them (so the
  metrics and the admin API can say when it runs next without the config);
- ``limitd:periodic:names``: set of the entry names schedulers run.

Every scheduler in every process tries every tick; :meth:`PeriodicStore.claim` (one
script, ``periodic_claim.lua``) lets exactly one of them win. A winner whose push fails
gives the tick back (``periodic_release.lua``) unless a later tick was claimed since.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from limitd import keys
from limitd.connection import LuaScript, set_members


def names_key(layout: keys.KeyLayout) -> str:
    """Set of the entries' names."""
    return layout.LIMITD_PREFIX + "periodic:names"


META_FIELDS = ("cron", "tz", "job")

CLAIM = LuaScript(__package__ or "limitd.periodic", "periodic_claim.lua")
RELEASE = LuaScript(__package__ or "limitd.periodic", "periodic_release.lua")
SETTLE = LuaScript(__package__ or "limitd.periodic", "periodic_settle.lua")


def entry_key(layout: keys.KeyLayout, name: str) -> str:
    return layout.LIMITD_PREFIX + "periodic:entry:" + name


@dataclass(frozen=True)
class Claim:
    """A tick won by one scheduler, with the entry's record before it (to give back)."""

    name: str
    tick: float
    jid: str
    previous: tuple[str, str, str]


@dataclass(frozen=True)
class Record:
    """What Redis holds about one entry; None for what was never written."""

    name: str
    last_tick: float | None = None
    last_jid: str | None = None
    last_run_at: float | None = None
    cron: str | None = None
    tz: str | None = None
    job: str | None = None


class PeriodicStore:
    """The periodic keys on one Redis client."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.keys = keys.of(redis)

    def register(self, entries: Mapping[str, Mapping[str, str]]) -> None:
        """Record the entries a scheduler runs (name -> cron, tz, job), in one round
        trip, for the metrics and the admin API."""
        if not entries:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(names_key(self.keys), *entries)
        for name, meta in entries.items():
            pipe.hset(entry_key(self.keys, name), mapping={key: meta[key] for key in META_FIELDS})
        pipe.execute()

    def claim(self, name: str, tick: float, jid: str, now: float) -> Claim | None:
        """Claim ``tick`` for ``jid``; None when this tick (or a later one) was claimed."""
        reply = CLAIM(self.redis, [entry_key(self.keys, name)], [_seconds(tick), jid, repr(now)])
        if not reply:
            return None
        before = [_text(value) for value in reply]
        return Claim(name, tick, jid, (before[0], before[1], before[2]))

    def give_back(self, claim: Claim) -> bool:
        """Undo ``claim`` (its push failed); False when a later tick was claimed since."""
        entry = entry_key(self.keys, claim.name)
        return bool(RELEASE(self.redis, [entry], [claim.jid, *claim.previous]))

    def settle(self, claim: Claim, jids: Iterable[str]) -> bool:
        """Record the jids ``claim`` really enqueued in its place of ``claim.jid``."""
        entry = entry_key(self.keys, claim.name)
        return bool(SETTLE(self.redis, [entry], [claim.jid, " ".join(jids)]))

    def names(self) -> list[str]:
        return sorted(set_members(self.redis, names_key(self.keys)))

    def records(self, names: Iterable[str]) -> dict[str, Record]:
        """Each named entry's record, in one round trip."""
        wanted = list(names)
        pipe = self.redis.pipeline(transaction=False)
        for name in wanted:
            pipe.hgetall(entry_key(self.keys, name))
        return {name: _record(name, raw) for name, raw in zip(wanted, pipe.execute(), strict=True)}


def _record(name: str, raw: Mapping[Any, Any]) -> Record:
    fields = {_text(key): _text(value) for key, value in raw.items()}
    return Record(
        name=name,
        last_tick=_number(fields.get("last_tick")),
        last_jid=fields.get("last_jid") or None,
        last_run_at=_number(fields.get("last_run_at")),
        cron=fields.get("cron") or None,
        tz=fields.get("tz") or None,
        job=fields.get("job") or None,
    )


def _seconds(tick: float) -> str:
    """Ticks are whole seconds: written as integers, so equal ticks compare equal."""
    return str(round(tick))


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
