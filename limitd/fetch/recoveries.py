"""Counting how often a job was given back without completing, to catch poison jobs.

A job is *recovered* when it goes back to its queue although its run never finished:
its process died while running it (the reaper returns it), or the worker could not
record its outcome (the processor gives it back rather than lose it). Either can repeat
forever: a job that crashes its process every time, or a payload that breaks the
worker's own bookkeeping, would take a thread (or a process) again and again. So each
recovery is counted, and the executor buries a job recovered ``max_recoveries`` times
instead of running it once more (what Sidekiq Pro calls a poison pill).

Where the count lives depends on the fetch:

- limit fetch: beside the job, in the ``limitd:recoveries`` hash under the SHA-1 of the
  job's exact bytes (``<sha1>:error`` keeps the last reason). The reaper is a Lua script
  and cannot rewrite JSON faithfully (Redis's cjson changes floats and empty lists), so
  the payload is left untouched; the fetch script reads the count as it takes the job.
  The hash expires ``RECOVERIES_TTL`` after its last change, so counts of jobs that were
  deleted while queued do not pile up.
- basic fetch: the job is out of Redis while it runs, so the count travels in the payload
  (``recoveries`` and ``recovery_error`` fields) when it is pushed back.
"""

from __future__ import annotations

import hashlib
import json

import redis as redis_py

from limitd import keys
from limitd.payload import dumps
from limitd.redis import LuaScript

RECOVER_JOB = LuaScript(__package__ or "limitd.fetch", "recover_job.lua")
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
    """Return a job this capsule holds to the front of its queue, counting a recovery;
    see ``recover_job.lua``. Returns the job's count, 0 if the capsule no longer held it."""
    script_keys = [
        keys.in_progress(capsule_id, queue),
        keys.queue(queue),
        keys.busy_of(queue),
        keys.recoveries_of(queue),
    ]
    args = [job, queue, reason[:MAX_REASON], RECOVERIES_TTL, keys.WAKE_CHANNEL]
    return int(RECOVER_JOB(redis, script_keys, args))


def last_reason(redis: redis_py.Redis, job: bytes, queue: str) -> str:
    """Why the job was last given back, as recorded by the reaper or the processor."""
    reason = redis.hget(keys.recoveries_of(queue), job_id(job) + ":error")
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else "unknown"


def forget(redis: redis_py.Redis, job: bytes, queue: str) -> None:
    """The job completed (or was buried): its count is no longer needed."""
    field = job_id(job)
    redis.hdel(keys.recoveries_of(queue), field, field + ":error")


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
