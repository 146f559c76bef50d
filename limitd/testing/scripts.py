"""Python twins of the feature scripts the testing modes play: unique locks, tenant
counting and batches, so that those features behave in an app's tests as they do on a
real Redis (a duplicate is dropped, a busy tenant is rerouted, a batch fires its callbacks
once its jobs have run).

Each twin takes the script's ``KEYS`` and ``ARGV`` (as text) and returns its reply; it
keeps its state in plain dicts, keyed by the script's own keys, and reads the time from
its arguments or :func:`limitd.clock.now` (so freezegun moves lock lifetimes too). The
Lua files stay the reference: a twin follows its script's header, not its Redis data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from limitd import clock
from limitd.batch import store as batch_store
from limitd.fair_tenant.middleware import FAIR_TENANT
from limitd.unique.middleware import ACQUIRE, RELEASE

if TYPE_CHECKING:
    from limitd.testing.memory import Sink

Twin = Callable[[list[str], list[str]], Any]


@dataclass
class _Batch:
    """What ``batch_lib.lua`` keeps in a batch's four keys."""

    bid: str
    description: str
    member: str
    callbacks: dict[str, str]
    parent: str | None = None  # the parent's meta key
    total: int = 0
    pending_count: int = 0
    building: int = 0
    complete_at: str | None = None
    success_at: str | None = None
    death_at: str | None = None
    pending: set[str] = field(default_factory=set)  # jids and children not succeeded yet
    unfinished: set[str] = field(default_factory=set)  # neither succeeded nor failed
    failures: dict[str, str] = field(default_factory=dict)


class ScriptTwins:
    """The twins by script sha, and the state they share."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.locks: dict[str, tuple[str, float]] = {}  # lock key -> (jid, expires at)
        self.skipped = 0
        self.enqueues: dict[str, list[tuple[float, str]]] = {}  # tenant key -> (time, jid)
        self.batches: dict[str, _Batch] = {}  # meta key -> batch
        self._twins: dict[str, Twin] = {
            ACQUIRE.sha: self.unique_acquire,
            RELEASE.sha: self.unique_release,
            FAIR_TENANT.sha: self.fair_tenant,
            batch_store.OPEN.sha: self.batch_open,
            batch_store.CLOSE.sha: self.batch_close,
            batch_store.ADD.sha: self.batch_add,
            batch_store.REMOVE.sha: self.batch_remove,
            batch_store.JOB_SETTLED.sha: self.batch_job_settled,
        }

    def twin(self, sha: str) -> Twin | None:
        return self._twins.get(sha)

    # Unique jobs (unique_acquire.lua, unique_release.lua).

    def unique_acquire(self, script_keys: list[str], args: list[str]) -> int:
        now, held = clock.now(), self.locks.get(script_keys[0])
        if held is not None and held[1] > now and held[0] != args[0]:
            self.skipped += 1
            return 0
        self.locks[script_keys[0]] = (args[0], now + int(args[1]) / 1000)
        return 1

    def unique_release(self, script_keys: list[str], args: list[str]) -> int:
        held = self.locks.get(script_keys[0])
        if held is None or held[0] != args[0] or held[1] <= clock.now():
            return 0
        del self.locks[script_keys[0]]
        return 1

    # Tenant fairness (fair_tenant.lua): count the tenant's enqueues, pick each queue.

    def fair_tenant(self, script_keys: list[str], args: list[str]) -> list[int]:
        now, window, rules = float(args[0]), float(args[1]), int(args[5])
        per = [float(args[6 + 3 * r]) for r in range(rules)]
        threshold = [int(args[7 + 3 * r]) for r in range(rules)]
        seen = [e for e in self.enqueues.get(script_keys[0], []) if e[0] > now - window]
        before = [sum(1 for at, _ in seen if at > now - p) for p in per]
        decisions = []
        for position, jid in enumerate(args[6 + 3 * rules :], start=1):
            chosen = 0
            for r in range(rules):
                if before[r] + position > threshold[r]:
                    chosen = r + 1
            decisions.append(chosen)
            seen.append((now, jid))
        self.enqueues[script_keys[0]] = seen
        return decisions

    # Batches (batch_*.lua, sharing batch_lib.lua).

    def batch_open(self, script_keys: list[str], args: list[str]) -> int:
        batch = self.batches.get(script_keys[0])
        if batch is not None and batch.complete_at is not None:
            return 0
        if batch is None:
            if args[2] != "1":
                return -1
            batch = self._create(script_keys, args)
        batch.building += 1
        return 1

    def _create(self, script_keys: list[str], args: list[str]) -> _Batch:
        events = ("success", "complete", "death")
        callbacks = {event: args[8 + i] for i, event in enumerate(events) if args[8 + i]}
        batch = _Batch(bid=args[0], description=args[3], member=args[5], callbacks=callbacks)
        if args[6]:
            batch.parent = script_keys[5]
            parent = self.batches[batch.parent]
            parent.pending.add(batch.member)
            parent.unfinished.add(batch.member)
        self.batches[script_keys[0]] = batch
        return batch

    def batch_close(self, script_keys: list[str], args: list[str]) -> int:
        batch = self.batches[script_keys[0]]
        batch.building = max(0, batch.building - 1)
        self._settle(batch, args[0])
        return batch.building

    def batch_add(self, script_keys: list[str], jids: list[str]) -> int:
        batch = self.batches[script_keys[0]]
        added = [jid for jid in dict.fromkeys(jids) if jid not in batch.pending]
        batch.pending.update(added)
        batch.unfinished.update(added)
        batch.total += len(added)
        batch.pending_count += len(added)
        return len(added)

    def batch_remove(self, script_keys: list[str], jids: list[str]) -> int:
        batch = self.batches[script_keys[0]]
        removed = [jid for jid in dict.fromkeys(jids) if jid in batch.pending]
        batch.pending.difference_update(removed)
        batch.unfinished.difference_update(removed)
        batch.total -= len(removed)
        batch.pending_count -= len(removed)
        return len(removed)

    def batch_job_settled(self, script_keys: list[str], args: list[str]) -> list[int]:
        runs = [args[at : at + 4] for at in range(1, len(args), 4)]
        batch = self.batches.get(script_keys[0])
        if batch is None:
            return [-1] * len(runs)
        results = [self._record(batch, jid, result, error, now) for jid, result, error, now in runs]
        self._settle(batch, runs[-1][3])
        return results

    def _record(self, batch: _Batch, jid: str, result: str, error: str, now: str) -> int:
        if jid not in batch.pending:
            return 0  # a repeat, or a late failure of a run that succeeded
        if result == "success":
            batch.pending.discard(jid)
            batch.unfinished.discard(jid)
            batch.failures.pop(jid, None)
            batch.pending_count -= 1
            return 1
        batch.unfinished.discard(jid)
        batch.failures[jid] = error
        if result == "death" and batch.death_at is None:
            batch.death_at = now
            self._fire(batch, "death", now)
        return 1

    def _settle(self, batch: _Batch | None, now: str) -> None:
        """batch_lib.lua's settle_batch: fire what became true, then up the tree."""
        while batch is not None and batch.building == 0:
            completed = succeeded = False
            if batch.complete_at is None and not batch.unfinished:
                batch.complete_at = now
                self._fire(batch, "complete", now)
                completed = True
            if batch.complete_at and batch.success_at is None and not batch.pending:
                batch.success_at = now
                self._fire(batch, "success", now)
                succeeded = True
            if not (completed or succeeded) or batch.parent is None:
                return
            parent = self.batches.get(batch.parent)
            if parent is not None and completed:
                parent.unfinished.discard(batch.member)
            if parent is not None and succeeded:
                parent.pending.discard(batch.member)
            batch = parent

    def _fire(self, batch: _Batch, event: str, now: str) -> None:
        """Push the event's callbacks, rebuilt from their templates as the script does."""
        raw = batch.callbacks.get(event)
        if not raw:
            return
        status = json.dumps(
            {
                "bid": batch.bid,
                "event": event,
                "total": batch.total,
                "pending": batch.pending_count,
                "failures": len(batch.failures),
                "description": batch.description,
            }
        )
        bodies = [
            cb["head"] + status + cb["tail"] + f',"enqueued_at":{now}}}' for cb in json.loads(raw)
        ]
        self.sink.accept([json.loads(body) for body in bodies])
