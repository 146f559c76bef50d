"""Unique jobs: while a job holds its lock, an identical job is not pushed.

A job opts in with ``unique_for`` (seconds or a timedelta)::

    @limitd.job(unique_for=600)                       # released when it succeeds
    def import_account(account_id): ...

    @limitd.job(unique_for=60, unique_until="executing")
    def refresh_cache(key): ...

"Identical" means the same job class, the same queue (the one asked for, before tenant
fairness may reroute it) and the same arguments, compared in a canonical JSON form and
hashed so the key stays short. The lock is ``SET NX PX`` with the jid as its value; a
duplicate gets ``None`` from ``perform_async``, is counted in ``limitd:unique:skipped``
and logged at debug level. A scheduled job's lock lives for its delay plus
``unique_for``. ``unique_until`` says when the lock goes before its lifetime ends:

- ``"executed"`` (default): when the job succeeds, is discarded or dies; a failing job
  keeps its lock across retries;
- ``"executing"``: when the job starts, so a new copy may be queued while it runs;
- ``"timeout"``: never; the lock only expires.

Sidekiq's names are accepted and stored as limitd's (:data:`ALIASES`): the unique-jobs
gems' ``until_executed``, ``until_executing`` and ``until_timeout``, and Sidekiq
Enterprise's ``success`` (the lock goes when the job succeeds: ``executed``) and
``start`` (``executing``). One difference: under ``executed`` a job that dies frees its
lock at once, where Enterprise keeps it until it expires.

Release is compare-and-delete, so a job whose lock expired never frees the lock a newer
copy took. A process killed while holding a lock needs nothing: the lock expires.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

from limitd import clock, keys, options
from limitd.connection import LuaScript, ScriptCall
from limitd.middleware.base import ClientMiddleware, ServerMiddleware
from limitd.middleware.chain import RUNS_AGAIN
from limitd.middleware.work import RedisClient
from limitd.payload import Payload
from limitd.spec import JobSpec

log = logging.getLogger("limitd.unique")

ACQUIRE = LuaScript(__package__ or "limitd.unique", "unique_acquire.lua")
RELEASE = LuaScript(__package__ or "limitd.unique", "unique_release.lua")
POLICIES = ("executed", "executing", "timeout")
ALIASES = {  # Sidekiq's spellings of the same policies
    "until_executed": "executed",
    "until_executing": "executing",
    "until_timeout": "timeout",
    "success": "executed",  # Sidekiq Enterprise
    "start": "executing",  # Sidekiq Enterprise
}
DEFAULT_POLICY = "executed"
LOCK_FIELD = "unique_key"  # payload field naming the lock the job holds


def _policy_option(value: Any) -> str:
    """The policy in limitd's name, so the payload and the server see one spelling."""
    if isinstance(value, str) and value in ALIASES:
        return ALIASES[value]
    if value not in POLICIES:
        raise ValueError(
            f"expected one of {', '.join(repr(p) for p in POLICIES)} (or Sidekiq's "
            f"{', '.join(repr(a) for a in ALIASES)})"
        )
    return str(value)


options.declare("unique_for", options.seconds, owner="limitd.unique")
options.declare("unique_until", _policy_option, owner="limitd.unique")


def args_digest(args: list[Any]) -> str:
    """The arguments in one canonical form (sorted keys, no spaces), hashed: two
    enqueues with equal arguments get the same lock whatever their dict order."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def lock_key(layout: keys.KeyLayout, payload: Payload) -> str:
    return layout.unique_lock(payload["class"], payload["queue"], args_digest(payload["args"]))


def lock_milliseconds(payload: Payload, now: float) -> int:
    """``unique_for``, plus the delay of a scheduled job: its copy must stay unique
    until it has had its chance to run."""
    delay = max(0.0, float(payload.get("at") or now) - now)
    return max(1, math.ceil((float(payload["unique_for"]) + delay) * 1000))


def release(redis: RedisClient, payload: Payload) -> bool:
    """Free the lock ``payload`` holds, if it still holds it."""
    call = release_call(payload)
    return bool(call.run(redis)) if call is not None else False


def release_call(payload: Payload) -> ScriptCall | None:
    """The compare-and-delete of the lock ``payload`` holds, to make now or later."""
    key = payload.get(LOCK_FIELD)
    return RELEASE.later([key], [payload["jid"]]) if key else None


class UniqueJobs(ClientMiddleware):
    """Client middleware: take the lock before the push, or halt the duplicate; give
    the lock back if the push does not happen after all."""

    def __init__(self, layout: keys.KeyLayout = keys.STANDALONE) -> None:
        self.keys = layout  # the chain gives each connection's its own (for_layout)

    def for_layout(self, layout: keys.KeyLayout) -> UniqueJobs:
        return self if layout is self.keys else UniqueJobs(layout)

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        return bool(payload.get("unique_for"))

    def push_work(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """The script call that takes ``payload``'s lock (or counts it as skipped)."""
        if not payload.get("unique_for"):
            return None
        ttl = lock_milliseconds(payload, clock.now())
        locks = [lock_key(self.keys, payload), self.keys.UNIQUE_SKIPPED]
        return ACQUIRE.later(locks, [payload["jid"], ttl])

    def admit(self, spec: JobSpec | None, payload: Payload, reply: Any) -> bool:
        """With the lock, the payload names it; without, the duplicate is logged."""
        key = lock_key(self.keys, payload)
        if not reply:
            log.debug(
                "duplicate not pushed class=%s queue=%s lock=%s",
                payload["class"],
                payload["queue"],
                key,
            )
            return False
        payload[LOCK_FIELD] = key
        return True

    def undo_work(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """Halted later in the chain, or failed: the lock would guard nothing."""
        return release_call(payload) if payload.get("unique_for") else None

    def abandon_work(self, spec: JobSpec | None, payloads: list[Payload]) -> list[ScriptCall]:
        """The chunk was not written: free the locks its jobs took."""
        return [call for call in map(release_call, payloads) if call is not None]


class UniqueRelease(ServerMiddleware):
    """Server middleware: free the lock when the job's policy says so."""

    concerns_fields = frozenset({LOCK_FIELD})

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    def concerns(self, payload: Payload) -> bool:
        """Only a job that holds a lock has one to free."""
        return bool(payload.get(LOCK_FIELD))

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> ScriptCall | None:
        """Under ``executing``, the lock goes as the job starts."""
        if payload.get(LOCK_FIELD) and _policy(payload) == "executing":
            return release_call(payload)
        return None

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> ScriptCall | None:
        """After the job's fate is recorded: a job that will not run again frees its
        lock under ``executed`` (with its acknowledgement); one waiting for a retry
        keeps it, as does one a limiter rescheduled or an iterable job put back in line
        (``RUNS_AGAIN``). A job cancelled before it started (``limitd.api.cancel``
        settles it so) frees it under ``executing`` too: no start will."""
        if outcome in RUNS_AGAIN:
            return None
        policy = _policy(payload)
        if policy == "executed" or (policy == "executing" and outcome == "cancelled"):
            return release_call(payload)
        return None


def _policy(payload: Payload) -> str:
    return str(payload.get("unique_until") or DEFAULT_POLICY)
