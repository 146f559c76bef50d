"""Cancelling a job by its jid: ``limitd.api.cancel(jid)``, ``limitd cancel JID``.

A cancel first sets the job's cancel flag (``limitd:cancel:<jid>``, kept a week), then
removes the job from wherever it waits: any queue, the ``schedule`` and the ``retry``
set. A job removed is settled as a job that ended ``cancelled`` is (the features'
``settled`` work, as a capsule makes it): its batch counts it as done, its unique lock
is freed. The flag comes first so that a job a fetcher takes during the search still sees
it: an iterable job checks it when it starts and after each item (it then stops, with
the outcome ``cancelled``); a plain job that is running goes on unless its code looks
(``limitd.cancelled()``). A job in the dead set is not touched: it runs only if someone
retries it, and the flag makes an iterable one stop at once if they do.

The search scans each queue (O(its length), as Sidekiq's ``find_job``) and matches the
jid in the sets server-side: an operator's call, not one for a hot path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis as redis_py

from limitd import clock, handoff, keys
from limitd.api.processes import Processes
from limitd.api.queues import Queue
from limitd.api.records import JobRecord
from limitd.api.sorted_sets import RetrySet, ScheduledSet
from limitd.api.work import running_jobs
from limitd.client import connection_or_default
from limitd.connection import run_calls
from limitd.iteration.store import CANCEL_TTL
from limitd.middleware.chain import ServerChain
from limitd.middleware.defaults import default_server_chain

CANCELLED = "cancelled"  # the outcome a cancelled job is settled with


@dataclasses.dataclass(frozen=True)
class Cancellation:
    """What a cancel did: ``removed_from`` the places the job was taken out of
    (``queue:<name>``, ``schedule``, ``retry``); ``running``: whether a live process
    listed it as running (its record is rewritten every few seconds), in which case
    it stops only if it is iterable or looks at its flag."""

    jid: str
    removed_from: tuple[str, ...]
    running: bool

    @property
    def found(self) -> bool:
        return bool(self.removed_from) or self.running

    def as_dict(self) -> dict[str, Any]:
        return {"jid": self.jid, "removed_from": list(self.removed_from), "running": self.running}


def cancel(jid: str, redis: redis_py.Redis | None = None) -> Cancellation:
    """Cancel the job ``jid`` (see the module docstring)."""
    conn = connection_or_default(redis)
    conn.set(keys.of(conn).cancel_flag(jid), 1, ex=CANCEL_TTL)
    removed: dict[str, tuple[JobRecord, str]] = {}  # where from -> (the job, its queue)
    for queue in Queue.all(conn):
        entry = queue.find_job(jid)
        if entry is not None and entry.delete():
            removed[f"queue:{queue.name}"] = (entry, queue.name)
    for waiting in (ScheduledSet(conn), RetrySet(conn)):
        found = waiting.find_job(jid)
        if found is not None and found.delete():
            removed[waiting.key_name.lower()] = (found, found.queue or "default")
    if removed:
        chain = default_server_chain(conn)  # built once, for what was taken out
        for record, queue_name in removed.values():
            _settle(conn, chain, record, queue_name)
    live = [process.identity for process in Processes(conn)]
    running = any(job.jid == jid for job in running_jobs(live, conn))
    return Cancellation(jid, tuple(removed), running)


def _settle(conn: redis_py.Redis, chain: ServerChain, entry: JobRecord, queue: str) -> None:
    """What a capsule makes for a job that ended ``cancelled``, for one that will never
    reach a capsule now: its batch's count, its unique lock."""
    if entry.payload is None:
        return  # unreadable: no feature can have state for it
    calls = chain.settle(None, entry.payload, queue, CANCELLED, None)
    if calls:
        run_calls(conn, calls)
        if keys.of(conn).cluster:  # callbacks fired go through the hand-off set
            handoff.push_waiting(conn, clock.now())
