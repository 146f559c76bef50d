"""The jobs running now, process by process, as Sidekiq's Busy page lists them.

Each process record (``limitd.supervisor.heartbeat.ProcessRecord``) has a hash
``<identity>:work`` of thread id -> JSON ``{"queue", "run_at", "payload"}``, rewritten at
every record refresh (5 s by default), so this list trails the jobs by that much. Ruby
Sidekiq 7 writes the same hash, so its jobs are listed too::

    from limitd.api import Processes
    from limitd.api.work import running_jobs

    for job in running_jobs([p.identity for p in Processes()]):
        print(job.identity, job.klass, job.queue, job.run_at)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import redis as redis_py

from limitd import keys
from limitd.api.records import JobRecord
from limitd.client import connection_or_default
from limitd.connection import decode_name


@dataclasses.dataclass(frozen=True)
class RunningJob:
    """One job a process runs now. ``thread``: the processor thread's id (or
    ``async-N`` for a job on the process's event loop); ``run_at``: when it started
    (epoch seconds, None if unreadable); ``job``: its payload as a read-only record
    (``job.klass``, ``job.args``, ``job.jid``; a payload that does not parse is still
    listed, with ``job.payload`` None)."""

    identity: str
    thread: str
    queue: str | None
    run_at: float | None
    job: JobRecord = dataclasses.field(compare=False)

    @property
    def klass(self) -> str | None:
        return self.job.klass

    @property
    def args(self) -> list[Any]:
        return self.job.args

    @property
    def jid(self) -> str | None:
        return self.job.jid

    def as_dict(self) -> dict[str, Any]:
        """The row as plain data, for JSON output."""
        return {
            "identity": self.identity,
            "thread": self.thread,
            "queue": self.queue,
            "run_at": self.run_at,
            "jid": self.jid,
            "class": self.klass,
            "args": self.args,
        }


def running_jobs(
    identities: Sequence[str], redis: redis_py.Redis | None = None
) -> list[RunningJob]:
    """The jobs ``identities`` (live processes, e.g. from ``Processes``) run now, the
    longest-running first. One round trip however many processes: a pipelined HGETALL
    per identity (each hash holds at most the process's concurrency of rows)."""
    conn = connection_or_default(redis)
    pipe = conn.pipeline(transaction=False)
    for identity in identities:
        pipe.hgetall(keys.process_work(identity))
    rows = pipe.execute() if identities else []
    jobs = [
        _running(identity, decode_name(thread), raw)
        for identity, work in zip(identities, rows, strict=True)
        for thread, raw in work.items()
    ]
    return sorted(jobs, key=lambda job: (job.run_at is None, job.run_at or 0.0, job.identity))


def _running(identity: str, thread: str, raw: bytes) -> RunningJob:
    """One row, tolerant of odd content: a listing must not fail on one bad row."""
    try:
        row = json.loads(raw)
    except ValueError:
        row = {}
    if not isinstance(row, dict):
        row = {}
    payload = row.get("payload")
    if isinstance(payload, dict):  # Sidekiq 6 and some writers store the object itself
        payload = json.dumps(payload)
    run_at = row.get("run_at")
    return RunningJob(
        identity=identity,
        thread=thread,
        queue=row["queue"] if isinstance(row.get("queue"), str) else None,
        run_at=float(run_at) if isinstance(run_at, (int, float)) else None,
        job=JobRecord(payload.encode() if isinstance(payload, str) else b""),
    )
