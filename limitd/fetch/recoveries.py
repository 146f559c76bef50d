"""Catching poison jobs (jobs that take their process down) without blaming bystanders.

A job goes back to its queue without completing when its process dies while holding it
(the reaper returns it) or when the worker cannot record its outcome (the processor gives
it back). Either could repeat forever, so limitd charges such events to jobs and buries a
job charged ``max_recoveries`` times instead of running it again (a poison pill). The
hard part is *which* job to charge when a process running many jobs dies. The rule:

- A job that was in a crashed process and was no suspect becomes a *suspect*, charged
  one crash that it shares with everything else that process held.
- A capsule holds at most one suspect at a time (the fetch passes over the others, to
  the back of their queues, for other capsules or later), and says so in Redis just
  before it runs it. A crash while a suspect runs is charged to that suspect alone.
- A suspect that completes, with any outcome, is cleared.
- A job is buried once ``max_recoveries`` crashes are charged to it *and* at least one
  was charged to it alone. Its first crash, shared, never buries it by itself.
- When the supervisor stopped the process itself (memory recycle, a stop that ran out
  of time) nothing is charged: the jobs go back unmarked.
- A job whose outcome could not be recorded is charged a crash alone (its own run
  failed).

So a poison job reaches the dead set after ``max_recoveries`` crashes (the first shared,
the others alone), while an innocent job is buried only if it was the one suspect running
in its process at ``max_recoveries - 1`` crashes that something else caused: an operator
or the OOM killer killing the process (the supervisor cannot tell who sent a SIGKILL), or
a fresh poison job that had not been caught yet, running beside it.

Where the charges live depends on the fetch:

- limit fetch: beside the job, in the ``limitd:recoveries`` hash, under the SHA-1 of the
  job's exact bytes: ``<sha1>`` crashes, ``<sha1>:alone`` crashes alone, ``<sha1>:error``
  the last reason; ``held:<capsule>`` and ``running:<capsule>`` name the suspect each
  capsule holds and has started. The reaper is a Lua script and cannot rewrite JSON
  faithfully (Redis's cjson changes floats and empty lists), so the payload is left
  untouched; the fetch script reads the charges as it takes the job. The hash expires
  ``RECOVERIES_TTL`` after its last change, so charges of jobs deleted while queued do
  not pile up.
- basic fetch: the job is out of Redis while it runs (a killed process loses it), so the
  only charges are give-backs, and they travel in the payload (``recoveries`` and
  ``recovery_error`` fields).
"""

from __future__ import annotations

import hashlib
import json

import redis as redis_py

from limitd import keys
from limitd.connection import LuaScript
from limitd.payload import dumps

RECOVER_JOB = LuaScript(__package__ or "limitd.fetch", "recover_job.lua")
SUSPECT_STARTED = LuaScript(__package__ or "limitd.fetch", "suspect_started.lua")
SUSPECT_CLEARED = LuaScript(__package__ or "limitd.fetch", "suspect_cleared.lua")
RECOVERIES_TTL = 30 * 86_400
COUNT_FIELD = "recoveries"
REASON_FIELD = "recovery_error"
MAX_REASON = 1_000


class RecoveredTooOften(Exception):
    """A job given back to its queue ``count`` times without ever completing: its
    process died each time, or its outcome could not be recorded. Running it again would
    only repeat that, so it is buried instead (a poison pill)."""

    wire_name = "limitd.RecoveredTooOften"

    def __init__(self, count: int, last_error: str) -> None:
        super().__init__(f"recovered {count} times without completing: {last_error}")
        self.count = count


def job_id(job: bytes) -> str:
    """The field a job's count is kept under: the SHA-1 of its bytes, as Lua computes it."""
    return hashlib.sha1(job).hexdigest()


def recover(redis: redis_py.Redis, capsule_id: str, queue: str, job: bytes, reason: str) -> int:
    """Return a job this capsule holds to the front of its queue, charging it a crash
    alone; see ``recover_job.lua``. Returns the job's crashes, 0 if the capsule no longer
    held it."""
    k = keys.of(redis)
    script_keys = [
        k.in_progress(capsule_id, queue),
        k.queue(queue),
        k.busy_of(queue),
        k.recoveries_of(queue),
    ]
    args = [job, queue, reason[:MAX_REASON], RECOVERIES_TTL, keys.WAKE_CHANNEL, capsule_id]
    return int(RECOVER_JOB(redis, script_keys, args))


def started(redis: redis_py.Redis, capsule_id: str, job: bytes, queue: str) -> bool:
    """The capsule is about to run the suspect it holds: a crash from now on is charged
    to this job alone (``suspect_started.lua``). False if it no longer held it."""
    k = keys.of(redis)
    args = [capsule_id, job_id(job)]
    return bool(SUSPECT_STARTED(redis, [k.recoveries_of(queue)], args))


def last_reason(redis: redis_py.Redis, job: bytes, queue: str) -> str:
    """Why the job was last given back, as recorded by the reaper or the processor."""
    k = keys.of(redis)
    reason = redis.hget(k.recoveries_of(queue), job_id(job) + ":error")
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else "unknown"


def forget(redis: redis_py.Redis, capsule_id: str, job: bytes, queue: str) -> None:
    """The job completed (or was buried): its charges are dropped and the capsule's hold
    on it released, with a wake-up for the suspects it passed over
    (``suspect_cleared.lua``)."""
    k = keys.of(redis)
    args = [capsule_id, job_id(job), keys.WAKE_CHANNEL, queue]
    SUSPECT_CLEARED(redis, [k.recoveries_of(queue)], args)


def mark_recovered(job: bytes, reason: str) -> bytes:
    """The job with its count raised and the reason kept, for a fetch that holds jobs
    outside Redis. A job that is not a JSON object cannot carry them: returned as is (it
    is buried as malformed when fetched again)."""
    try:
        payload = json.loads(job)
    except Exception:  # any decoding failure: keep the bytes, nothing is lost
        return job
    if not isinstance(payload, dict):
        return job
    payload[COUNT_FIELD] = count_in(payload) + 1
    payload[REASON_FIELD] = reason[:MAX_REASON]
    try:
        return dumps(payload).encode()
    except (TypeError, ValueError, RecursionError):
        return job


def count_in(payload: dict[str, object]) -> int:
    """The count a payload carries (basic fetch), 0 when absent or not a number."""
    value = payload.get(COUNT_FIELD, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
