"""A job's own look at its cancel flag: ``limitd.cancelled()``.

``limitd cancel`` (``limitd.api.cancel``) sets the flag of a job that may be running;
an iterable job obeys it after its current item by itself (``run.py``). A plain job
cannot be stopped from outside without risk (a thread cannot be interrupted safely
mid-write), so it may look, where stopping is safe for it::

    @limitd.job
    def export(report_id):
        for chunk in chunks(report_id):
            if limitd.cancelled():
                return
            write(chunk)

Each look is one EXISTS on the capsule's Redis (for an async job, ``await
limitd.acancelled()``, on the event loop's client).
"""

from __future__ import annotations

from typing import Any

from limitd import keys
from limitd.client import default_client
from limitd.connection import loop_twin
from limitd.spec import current_payload


def cancelled() -> bool:
    """Whether the job running here was cancelled (False outside a job)."""
    found = _flag()
    if found is None:
        return False
    redis, key = found
    return bool(redis.exists(key))


async def acancelled() -> bool:
    """:func:`cancelled` for an async job, on the running loop's client."""
    found = _flag()
    if found is None:
        return False
    redis, key = found
    return bool(await loop_twin(redis).exists(key))


def _flag() -> tuple[Any, str] | None:
    """The client to ask and the running job's flag key, or None outside a job."""
    from limitd.iteration.middleware import binding  # loaded when a job first looks

    payload = current_payload()
    jid = payload.get("jid") if payload is not None else None
    if not jid:
        return None
    bound = binding()
    redis = bound.redis if bound is not None else default_client().redis
    return redis, keys.of(redis).cancel_flag(str(jid))
