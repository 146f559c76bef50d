"""The periodic scheduler: a thread in every capsule process that enqueues each entry's
job at each of its ticks, exactly once across all processes and hosts on one Redis.

There is no leader. Every scheduler wakes at every tick and tries to claim it
(``PeriodicStore.claim``, one Lua script); only the first claim of a tick wins, and its
scheduler pushes the job through the process's default client, so the client
middleware run as for any enqueue. The jid is chosen before the claim and recorded by
it; if the push raises, the claim is given back (compare-and-set on that jid) and the
error logged with the jid and the job, so the tick shows as not run.

On start, an entry with ``missed: once`` that ran before and whose latest tick nobody
claimed (every scheduler was down) runs that tick once, never the whole backlog;
``missed: skip`` waits for the next tick, and an entry that never ran does not
backfill. A scheduler that wakes a few seconds late tries each tick it slept through
(oldest first; those another scheduler claimed are refused); one that wakes later than
that (a paused process) runs only the latest due tick, like ``missed: once``. Redis
errors are logged and the tick is left to the others or tried again at the next one:
the thread never dies of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timezone

from limitd import clock
from limitd.capacity.job import capacity_job
from limitd.client import default_client
from limitd.config.app_checks import registered_jobs
from limitd.payload import new_jid
from limitd.periodic.checks import resolve_job
from limitd.periodic.section import PeriodicEntry
from limitd.periodic.store import Claim, PeriodicStore
from limitd.spec import JobSpec

log = logging.getLogger("limitd.periodic")

MAX_WAIT = 60.0  # seconds; wake at least this often, in case the wall clock jumped
STOP_TIMEOUT = 2.0
LATE_GRACE = 5.0  # seconds: a scheduler woken this late still tries each tick it slept through


class PeriodicScheduler:
    """One process's scheduler (a ``limitd.plugins.Service``) for ``entries``."""

    def __init__(self, redis: object, entries: Sequence[PeriodicEntry]) -> None:
        self.store = PeriodicStore(redis)
        self.entries = tuple(entries)
        self._due: dict[str, float] = {}
        self._caught_up = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="limitd-periodic", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wake the thread and wait for it briefly: it only ever sleeps in an Event."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT)

    def catch_up(self, now: float) -> None:
        """Record the entries in Redis, then run each ``missed: once`` entry's latest
        tick if it ran before and nobody claimed that tick. Raises Redis errors."""
        self.store.register({entry.name: _meta(entry) for entry in self.entries})
        records = self.store.records(entry.name for entry in self.entries)
        for entry in self.entries:
            last = records[entry.name].last_tick
            if entry.missed == "once" and last is not None:
                tick = entry.latest_tick(now)
                if tick > last:
                    log.info("periodic %s: running missed tick %s once", entry.name, _when(tick))
                    self.fire(entry, tick)
        self._caught_up = True

    def run_due(self, now: float) -> float:
        """Fire every entry's ticks due at ``now`` (see :func:`due_ticks`), plan each
        entry's next tick; returns the seconds until the next one is due."""
        for entry in self.entries:
            due = self._due.get(entry.name)
            if due is not None and due <= now:
                for tick in due_ticks(entry, due, now):
                    self.fire(entry, tick)
            if due is None or due <= now:
                self._due[entry.name] = entry.next_tick(now)
        soonest = min(self._due.values(), default=now + MAX_WAIT)
        return min(max(soonest - now, 0.0), MAX_WAIT)

    def fire(self, entry: PeriodicEntry, tick: float) -> list[str] | None:
        """Claim ``tick`` of ``entry`` and, if won, enqueue its job. Returns the jids
        enqueued (empty when a middleware halted it), None when not enqueued (the tick
        was claimed elsewhere, or something failed, which is logged)."""
        spec = resolve_job(entry.job, registered_jobs())
        if spec is None:
            log.error(
                "periodic %s: job %s is not registered; tick %s skipped",
                entry.name,
                entry.job,
                _when(tick),
            )
            return None
        jid = new_jid()
        try:
            claim = self.store.claim(entry.name, tick, jid, clock.now())
        except Exception:
            log.exception(
                "periodic %s: could not claim tick %s (jid=%s class=%s)",
                entry.name,
                _when(tick),
                jid,
                spec.name,
            )
            return None
        if claim is None:
            return None
        return self._enqueue(entry, spec, claim)

    def _enqueue(self, entry: PeriodicEntry, spec: JobSpec, claim: Claim) -> list[str] | None:
        try:
            jids = _push(entry, spec, claim)
        except Exception:
            log.exception(
                "periodic %s: push failed jid=%s class=%s tick %s; giving the tick back",
                entry.name,
                claim.jid,
                spec.name,
                _when(claim.tick),
            )
            self._give_back(claim, spec)
            return None
        if jids != [claim.jid]:
            self._settle(claim, jids, spec)
        log.info(
            "periodic %s: enqueued jid=%s class=%s for tick %s",
            entry.name,
            " ".join(jids) or "(none)",
            spec.name,
            _when(claim.tick),
        )
        return jids

    def _give_back(self, claim: Claim, spec: JobSpec) -> None:
        try:
            if not self.store.give_back(claim):
                log.warning(
                    "periodic %s: tick %s not given back (jid=%s class=%s): a later "
                    "tick was claimed since",
                    claim.name,
                    _when(claim.tick),
                    claim.jid,
                    spec.name,
                )
        except Exception:
            log.exception(
                "periodic %s: could not give back tick %s (jid=%s class=%s); it "
                "counts as run but enqueued nothing",
                claim.name,
                _when(claim.tick),
                claim.jid,
                spec.name,
            )

    def _settle(self, claim: Claim, jids: list[str], spec: JobSpec) -> None:
        try:
            self.store.settle(claim, jids)
        except Exception:
            log.exception(
                "periodic %s: could not record jids %s (class=%s) of tick %s",
                claim.name,
                jids,
                spec.name,
                _when(claim.tick),
            )

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                wait = self._step()
            except Exception:  # never die: the next tick tries again
                log.exception("periodic scheduler step failed")
                wait = 1.0
            self._stopping.wait(wait)

    def _step(self) -> float:
        now = clock.now()
        if not self._caught_up:
            try:
                self.catch_up(now)
            except Exception:
                log.exception(
                    "periodic: could not record entries or run missed ticks; "
                    "trying again at the next tick"
                )
        return self.run_due(now)


def due_ticks(entry: PeriodicEntry, due: float, now: float) -> list[float]:
    """The ticks to try at ``now`` when ``due`` was the next one: all of them, oldest
    first, if the scheduler woke less than ``LATE_GRACE`` seconds late (a busy host:
    another scheduler may have claimed them, then the claims fail); when it woke later
    (a paused process), only the latest, once, as ``missed: once`` does."""
    ticks: list[float] = []
    tick = due if due > now - LATE_GRACE else entry.next_tick(now - LATE_GRACE)
    while tick <= now:
        ticks.append(tick)
        tick = entry.next_tick(tick)
    return ticks or [entry.latest_tick(now)]


def _push(entry: PeriodicEntry, spec: JobSpec, claim: Claim) -> list[str]:
    """Enqueue through the process's default client (its middleware run), the entry's
    name and tick in the payload's ``periodic`` field (the job can read them from
    ``limitd.spec.current_payload()``); a capacity entry calls
    ``perform_with_capacity``, which picks its own jids and payloads."""
    if entry.capacity:
        job_class = capacity_job(spec.name)
        if job_class is None:
            raise LookupError(f"{spec.name} is not a LimitedCapacityJob (capacity: true)")
        return list(job_class.perform_with_capacity(*entry.args))
    item = {
        "class": spec.name,
        "args": list(entry.args),
        "jid": claim.jid,
        "periodic": {"name": entry.name, "tick": round(claim.tick)},
    }
    pushed = default_client().push(item, spec)
    return [] if pushed is None else [pushed]


def _meta(entry: PeriodicEntry) -> dict[str, str]:
    return {"cron": entry.cron, "tz": entry.tz, "job": entry.job}


def _when(tick: float) -> str:
    return datetime.fromtimestamp(tick, timezone.utc).isoformat()
