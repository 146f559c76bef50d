"""Where an iterable job's progress lives in Redis, and the cancel flag of any job.

One hash per job (``limitd:iteration:<jid>``, see ``iteration_begin.lua`` for its
fields) holds the cursor of the last item done, how many items and runs it took, and its
state; a string ``limitd:cancel:<jid>`` is the cancel flag. Both are keyed by jid, so
they follow the job through retries and restarts, and both carry the ``{limitd}`` tag in
cluster mode (one slot: the scripts touch them together).

Each call is one script, sync or on an asyncio client alike: ``begin`` when a run
starts, ``save`` after items and when a run ends (it also reads the cancel flag).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from limitd import clock, keys
from limitd.connection import LuaScript

BEGIN = LuaScript(__package__ or "limitd.iteration", "iteration_begin.lua")
SAVE = LuaScript(__package__ or "limitd.iteration", "iteration_save.lua")

# How long a job's progress is kept after its last write: long enough for a job that
# waits days in the retry set, or behind a long deploy, to resume (Sidekiq keeps its
# own 30 days). Once the job completed or was cancelled, a day: for the dashboard and
# the admin API, and so that a copy run again after a crash finds it done.
STATE_TTL = 30 * 86400
FINISHED_TTL = 86400
# A cancel flag outlives any job that could still obey it by a wide margin.
CANCEL_TTL = 7 * 86400

RUNNING, INTERRUPTED, FAILED, COMPLETED, CANCELLED, EXPIRED = (
    "running", "interrupted", "failed", "completed", "cancelled", "expired",
)  # fmt: skip
FINISHED = (COMPLETED, CANCELLED, EXPIRED)


@dataclass(frozen=True)
class Resume:
    """What a run starts from: the state the last run left (``""`` for a first run),
    the cursor of the last item done (None: from the beginning), items done so far,
    which run this is (1 for the first), the runtime of the runs before, and whether
    the job was cancelled."""

    state: str
    cursor: Any
    items: int
    runs: int
    runtime: float
    cancelled: bool

    @property
    def finished(self) -> bool:
        """The job completed or was cancelled already: this run has nothing to do."""
        return self.state in FINISHED


FRESH = Resume("", None, 0, 1, 0.0, False)  # a run with nowhere to keep progress


def encode_cursor(cursor: Any) -> str:
    """The cursor as stored: JSON, so that a cursor survives as the job's arguments do
    (an int, a string, a list of them, a dict...)."""
    try:
        return json.dumps(cursor, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"an iterable job's cursor must be JSON (a number, string, list or dict of "
            f"them), got {type(cursor).__name__}: {cursor!r}"
        ) from exc


def decode_cursor(raw: bytes | str | None) -> Any:
    if not raw:
        return None
    return json.loads(raw)


class IterationStore:
    """One job's progress on ``redis`` (a client, or its asyncio twin for the
    ``a``-methods)."""

    def __init__(self, redis: Any, jid: str, job_class: str) -> None:
        self.redis = redis
        self.job_class = job_class
        layout = keys.of(redis)
        self.keys = (layout.iteration(jid), layout.cancel_flag(jid))

    def begin(self) -> Resume:
        return _resume(BEGIN(self.redis, self.keys, self._begin_args()))

    async def abegin(self, conn: redis.asyncio.Redis) -> Resume:
        return _resume(await BEGIN.acall(conn, self.keys, self._begin_args()))

    def save(self, cursor: str, items: int, runtime: float, state: str) -> bool:
        """Record progress (``cursor`` already encoded, "" to keep the saved one); True
        if the job was cancelled."""
        return bool(SAVE(self.redis, self.keys, _save_args(cursor, items, runtime, state)))

    async def asave(
        self, conn: redis.asyncio.Redis, cursor: str, items: int, runtime: float, state: str
    ) -> bool:
        args = _save_args(cursor, items, runtime, state)
        return bool(await SAVE.acall(conn, self.keys, args))

    def _begin_args(self) -> list[Any]:
        return [self.job_class, clock.now(), STATE_TTL]


def _save_args(cursor: str, items: int, runtime: float, state: str) -> list[Any]:
    ttl = FINISHED_TTL if state in FINISHED else STATE_TTL
    return [cursor, items, round(runtime, 6), state, clock.now(), ttl]


def _resume(reply: list[Any]) -> Resume:
    state, cursor, items, runs, runtime, cancelled = reply
    return Resume(
        state=_text(state),
        cursor=decode_cursor(cursor),
        items=int(items),
        runs=int(runs),
        runtime=float(runtime),
        cancelled=bool(int(cancelled)),
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
