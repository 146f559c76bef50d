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
from collections.abc import Awaitable, Callable
from typing import Any

from redis import asyncio as redis_asyncio

from limitd import keys
from limitd.aio.client_chain import AsyncPushNext, acall_next_or_undo
from limitd.batch.building import building_bid
from limitd.batch.store import ADD, REMOVE, add_jobs, job_settled_call, remove_jobs
from limitd.middleware.chain import call_next_or_undo
from limitd.payload import Payload
from limitd.redis import ScriptCall
from limitd.retry import error_class_name
from limitd.spec import JobSpec

log = logging.getLogger("limitd.batch")

# How a job's outcome (limitd.supervisor.executor) counts for its batch.
RESULTS = {"done": "success", "retry": "failure", "dead": "death", "discarded": "death"}


class BatchMembership:
    """Client middleware: jobs pushed inside ``Batch.jobs()`` join that batch. The sync
    client calls it, the async client awaits ``acall`` (and the ``a`` bulk hooks): the
    same decisions, with the Redis calls awaited."""

    def __init__(self) -> None:
        # The jids of the bulk chunk registered already: a context variable, so threads
        # and the tasks of one event loop each keep their own chunk's.
        self._registered: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
            f"limitd_batch_registered_{id(self)}", default=frozenset()
        )

    def prepare_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        bid, jids = self._chunk(payloads)
        if bid and jids:
            add_jobs(redis, bid, jids)
        self._registered.set(frozenset(jids))

    async def aprepare_bulk(
        self, spec: JobSpec | None, payloads: list[Payload], redis: redis_asyncio.Redis
    ) -> None:
        bid, jids = self._chunk(payloads)
        if bid and jids:
            await aadd_jobs(redis, bid, jids)
        self._registered.set(frozenset(jids))

    def abandon_bulk(self, spec: JobSpec | None, payloads: list[Payload], redis: Any) -> None:
        """The chunk was not written: its jobs leave the batch (all of them were
        registered by ``prepare_bulk``; removing one already gone changes nothing)."""
        bid, jids = self._chunk(payloads)
        if bid and jids:
            remove_jobs(redis, bid, jids)

    async def aabandon_bulk(
        self, spec: JobSpec | None, payloads: list[Payload], redis: redis_asyncio.Redis
    ) -> None:
        bid, jids = self._chunk(payloads)
        if bid and jids:
            await aremove_jobs(redis, bid, jids)

    def __call__(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: Any,
        call_next: Callable[[Payload], Payload | None],
    ) -> Payload | None:
        bid = self._join(payload)
        if bid is None:
            return call_next(payload)
        jid = payload["jid"]
        if jid not in self._registered.get():
            add_jobs(redis, bid, [jid])
        return call_next_or_undo(call_next, payload, lambda: remove_jobs(redis, bid, [jid]))

    async def acall(
        self,
        spec: JobSpec | None,
        payload: Payload,
        redis: redis_asyncio.Redis,
        call_next: AsyncPushNext,
    ) -> Payload | None:
        bid = self._join(payload)
        if bid is None:
            return await call_next(payload)
        jid = payload["jid"]
        if jid not in self._registered.get():
            await aadd_jobs(redis, bid, [jid])
        return await acall_next_or_undo(call_next, payload, lambda: aremove_jobs(redis, bid, [jid]))

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


async def aadd_jobs(redis: redis_asyncio.Redis, bid: str, jids: list[str]) -> int:
    """``limitd.batch.store.add_jobs`` on an asyncio client."""
    return int(await ADD.acall(redis, keys.batch_keys(bid), jids))


async def aremove_jobs(redis: redis_asyncio.Redis, bid: str, jids: list[str]) -> int:
    """``limitd.batch.store.remove_jobs`` on an asyncio client."""
    return int(await REMOVE.acall(redis, keys.batch_keys(bid), jids))


class BatchProgress:
    """Server middleware: after each run of a batch job, tell the batch how it ended."""

    def concerns(self, payload: Payload) -> bool:
        return bool(payload.get("bid"))

    def __call__(
        self, spec: JobSpec, payload: Payload, queue: str, call_next: Callable[[], Any]
    ) -> Any:
        return call_next()

    async def acall(
        self,
        spec: JobSpec,
        payload: Payload,
        queue: str,
        call_next: Callable[[], Awaitable[Any]],
    ) -> Any:
        return await call_next()  # its work is in ``settled``, sent with the ack

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
