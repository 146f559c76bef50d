"""Batch middleware: the client side puts jobs into the batch being built, the server
side reports how each run ended. The batch itself (counting, firing callbacks) lives in
:mod:`limitd.batch`.

A job is registered in its batch *before* it is pushed, so a job that finishes at once
is already counted; if the push is halted (a duplicate of a unique job) or fails, it is
taken out again. A bulk chunk is registered in one call before its jobs go through the
chain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from limitd.batch.building import building_bid
from limitd.batch.store import add_jobs, job_settled_call, remove_jobs
from limitd.middleware.chain import call_next_or_undo
from limitd.payload import Payload
from limitd.redis import ScriptCall
from limitd.retry import error_class_name
from limitd.spec import JobSpec

log = logging.getLogger("limitd.batch")

# How a job's outcome (limitd.supervisor.executor) counts for its batch.
RESULTS = {"done": "success", "retry": "failure", "dead": "death", "discarded": "death"}


class BatchMembership:
    """Client middleware: jobs pushed inside ``Batch.jobs()`` join that batch."""

    def __init__(self) -> None:
        self._registered = threading.local()  # jids of the bulk chunk registered already

    def prepare_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        bid = building_bid()
        jids = [payload["jid"] for payload in payloads] if bid else []
        if bid and jids:
            add_jobs(redis, bid, jids)
        self._registered.jids = set(jids)

    def abandon_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        """The chunk was not written: its jobs leave the batch (all of them were
        registered by ``prepare_bulk``; removing one already gone changes nothing)."""
        bid = building_bid()
        if bid is not None and payloads:
            remove_jobs(redis, bid, [payload["jid"] for payload in payloads])

    def __call__(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: Any,
        call_next: Callable[[Payload], Payload | None],
    ) -> Payload | None:
        bid = building_bid()
        if bid is None:
            return call_next(payload)
        payload["bid"] = bid
        jid = payload["jid"]
        if jid not in getattr(self._registered, "jids", ()):
            add_jobs(redis, bid, [jid])
        return call_next_or_undo(call_next, payload, lambda: remove_jobs(redis, bid, [jid]))


class BatchProgress:
    """Server middleware: after each run of a batch job, tell the batch how it ended."""

    def concerns(self, payload: Payload) -> bool:
        return bool(payload.get("bid"))

    def __call__(
        self, spec: JobSpec, payload: Payload, queue: str, call_next: Callable[[], Any]
    ) -> Any:
        return call_next()

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> ScriptCall | None:
        """The batch's update, sent with the job's acknowledgement."""
        bid = payload.get("bid")
        if not bid or outcome not in RESULTS:
            return None
        text = f"{error_class_name(error)}: {error}" if error is not None else ""
        jid, job_class = payload["jid"], payload["class"]

        def check(reply: object) -> None:
            if reply == -1:
                log.warning(
                    "batch %s of jid=%s class=%s is unknown or expired; its result is not counted",
                    bid,
                    jid,
                    job_class,
                )

        return job_settled_call(str(bid), jid, RESULTS[outcome], text, check)
