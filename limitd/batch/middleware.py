"""Batch middleware: the client side puts jobs into the batch being built, the server
side reports how each run ended. The batch itself (counting, firing callbacks) lives in
:mod:`limitd.batch`.

A job is registered in its batch *before* it is pushed, so a job that finishes at once
is already counted; if the push is halted (a duplicate of a unique job) or fails, it is
taken out again. A bulk chunk is registered in one call before its jobs go through the
chain.
"""

from __future__ import annotations

import contextvars
import logging

from limitd import keys
from limitd.batch.building import building_bid
from limitd.batch.store import add_jobs_call, job_settled_call, remove_jobs_call
from limitd.connection import ScriptCall
from limitd.middleware.base import ClientMiddleware, ServerMiddleware
from limitd.middleware.work import RedisClient
from limitd.payload import Payload
from limitd.retry import error_class_name
from limitd.spec import JobSpec

log = logging.getLogger("limitd.batch")

# How a job's outcome (limitd.supervisor.executor) counts for its batch. An expired job
# (limitd.expiry) was dropped by design, not by an error: it counts as a success, as in
# Sidekiq Pro, whose expiry skips the job without raising. So does a cancelled one
# (limitd.iteration): it was stopped on purpose, and runs no more.
RESULTS = {
    "done": "success",
    "expired": "success",
    "cancelled": "success",
    "retry": "failure",
    "dead": "death",
    "discarded": "death",
}


class BatchMembership(ClientMiddleware):
    """Client middleware: jobs pushed inside ``Batch.jobs()`` join that batch."""

    def __init__(self, layout: keys.KeyLayout = keys.STANDALONE) -> None:
        self.keys = layout  # the chain gives each connection's its own (for_layout)
        # The jids of the bulk chunk registered already: a context variable, so threads
        # and the tasks of one event loop each keep their own chunk's.
        self._registered: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
            f"limitd_batch_registered_{id(self)}", default=frozenset()
        )

    def for_layout(self, layout: keys.KeyLayout) -> BatchMembership:
        return self if layout is self.keys else BatchMembership(layout)

    def bulk_work(self, spec: JobSpec | None, payloads: list[Payload]) -> list[ScriptCall]:
        """The whole chunk joins the batch in one call; its jobs then pass on their own."""
        bid, jids = self._chunk(payloads)
        self._registered.set(frozenset(jids))
        return [add_jobs_call(self.keys, bid, jids)] if bid and jids else []

    def abandon_work(self, spec: JobSpec | None, payloads: list[Payload]) -> list[ScriptCall]:
        """The chunk was not written: its jobs leave the batch (all of them were
        registered by ``bulk_work``; removing one already gone changes nothing)."""
        bid, jids = self._chunk(payloads)
        return [remove_jobs_call(self.keys, bid, jids)] if bid and jids else []

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        """Only pushes made inside a batch's ``jobs()`` block."""
        return building_bid() is not None

    def push_work(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """A job of the batch being built is registered in it before its push."""
        bid = self._join(payload)
        if bid is None or payload["jid"] in self._registered.get():
            return None
        return add_jobs_call(self.keys, bid, [payload["jid"]])

    def undo_work(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """Halted later in the chain, or failed: the job leaves the batch again."""
        bid = building_bid()
        return None if bid is None else remove_jobs_call(self.keys, bid, [payload["jid"]])

    @staticmethod
    def _chunk(payloads: list[Payload]) -> tuple[str | None, list[str]]:
        """The batch being built, and the chunk's jids if there is one."""
        bid = building_bid()
        return bid, [payload["jid"] for payload in payloads] if bid else []

    @staticmethod
    def _join(payload: Payload) -> str | None:
        """The batch being built, if any, named in the payload."""
        bid = building_bid()
        if bid is not None:
            payload["bid"] = bid
        return bid


class BatchProgress(ServerMiddleware):
    """Server middleware: after each run of a batch job, tell the batch how it ended
    (its work is in ``settled``, sent with the acknowledgement)."""

    def __init__(self, redis: RedisClient) -> None:
        self.keys = keys.of(redis)  # of the capsule's connection, the ack goes through

    concerns_fields = frozenset({"bid"})

    def concerns(self, payload: Payload) -> bool:
        return bool(payload.get("bid"))

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

        return job_settled_call(self.keys, str(bid), jid, RESULTS[outcome], text, on_reply=check)
