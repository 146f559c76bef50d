"""Batches: run a group of jobs, then be told, once, how it went.

::

    batch = limitd.Batch("import 2026-11 invoices", callback_queue="callbacks")
    batch.on("success", notify_finance, {"month": "2026-11"})
    batch.on("complete", cleanup_import)
    with batch.jobs():
        for invoice_id in invoice_ids:
            import_invoice.perform_async(invoice_id)

Every job pushed inside ``jobs()`` (by this thread, through any enqueue method) carries
the batch id in its payload (``bid``) and counts in the batch. The events:

- ``complete``: once, when every job has run to success or failed at least once;
- ``success``: once, when every job has succeeded (a job that failed and succeeded on a
  retry counts as a success); fired after ``complete``;
- ``death``: once, when the first job dies (or is discarded): it will not run again,
  so ``success`` cannot happen unless it is retried from the dead set.

A callback is an ordinary job, enqueued with two arguments: the batch's status as a dict
(``bid``, ``event``, ``total``, ``pending``, ``failures``, ``description``) and the
options given to ``on``. Nothing fires while a ``jobs()`` block is open, so a first job
that finishes at once cannot complete a half-built batch; an empty batch completes and
succeeds when its block closes. A batch created inside another batch's ``jobs()`` block
is its child: the parent completes after the child completes and succeeds after the
child succeeds. A running batch job may add jobs to its own batch with
``limitd.Batch.current().jobs()`` until the batch has completed. Jobs a batch job pushes
outside such a block are not in the batch.

A batch's data expires ``expires_in`` (default 30 days, at least a second) after the last
change to it: jobs added, a job's run recorded, a child batch finishing (recorded runs
renew it once it has run down by an hour, or a tenth of a shorter lifetime). So a
running batch stays as long as it makes progress, and one that never finishes (its
builder was killed inside ``jobs()``, a dead job is never retried) still goes away.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from limitd import clock, handoff, keys
from limitd.batch.building import building_bid, building_inside
from limitd.batch.store import (
    EVENTS,
    BatchNotOpen,
    BatchStatus,
    NewBatch,
    check_opened,
    close_batch,
    close_call,
    open_batch,
    open_call,
    read_status,
)
from limitd.client import Client, default_client, normalize
from limitd.connection import loop_twin
from limitd.payload import Payload, check_args, dumps
from limitd.registry import registry
from limitd.spec import JobSpec, current_payload
from limitd.transactions import hold as transactions

DEFAULT_EXPIRES_IN = 30 * 86_400.0
STATUS_MARK = "\x00limitd-batch-status\x00"


def new_bid() -> str:
    """A fresh batch id: 24 hex characters, like a jid. Hex rather than URL-safe base64
    because a bid is typed on command lines, where one starting with "-" reads as a flag."""
    return secrets.token_hex(12)


class Batch:
    """A group of jobs with callbacks. Create, register callbacks, then add jobs."""

    def __init__(
        self,
        description: str = "",
        *,
        callback_queue: str | None = None,
        expires_in: float | dt.timedelta = DEFAULT_EXPIRES_IN,
        client: Client | None = None,
        bid: str | None = None,
    ) -> None:
        if isinstance(expires_in, dt.timedelta):
            expires_in = expires_in.total_seconds()
        if expires_in < 1:
            raise ValueError(f"expires_in must be at least one second, not {expires_in!r}")
        self.bid = bid or new_bid()
        self.description = description
        self.callback_queue = callback_queue
        self.expires_in = float(expires_in)
        self._client = client
        self._callbacks: dict[str, list[dict[str, Any]]] = {event: [] for event in EVENTS}
        self._created = bid is not None  # an existing batch, opened to add jobs

    @classmethod
    def open(cls, bid: str, *, client: Client | None = None) -> Batch:
        """An existing batch, to add jobs to it (its ``jobs()`` raises BatchNotOpen if it
        has completed or does not exist)."""
        return cls(client=client, bid=bid)

    @classmethod
    def current(cls, *, client: Client | None = None) -> Batch | None:
        """Inside a running batch job: its batch, so it can add jobs. Else None."""
        payload = current_payload()
        bid = payload.get("bid") if payload else None
        return cls.open(bid, client=client) if bid else None

    @staticmethod
    def status(bid: str, *, client: Client | None = None) -> BatchStatus | None:
        """The batch's counts, failures and flags; None if unknown or expired."""
        return read_status(_client(client).redis, bid)

    def on(self, event: str, callback: Any, options: dict[str, Any] | None = None) -> Batch:
        """Enqueue ``callback`` (a job, job class or registered job name) with the status
        and ``options`` when ``event`` (success, complete, death) fires."""
        if event not in EVENTS:
            raise ValueError(f"unknown batch event {event!r}: expected one of {EVENTS}")
        if self._created:
            raise RuntimeError(
                f"batch {self.bid}: register callbacks before its first jobs() block"
            )
        self._callbacks[event].append(self._template(callback, options or {}))
        return self

    @property
    def aio(self) -> AsyncBatchJobs:
        """This batch's ``jobs()`` for async code: ``async with batch.aio.jobs():``."""
        return AsyncBatchJobs(self)

    @contextmanager
    def jobs(self) -> Iterator[Batch]:
        """Add jobs: every job this thread pushes inside the block joins the batch. The
        batch cannot fire until the block ends, even if the block raises."""
        redis = _client(self._client).redis
        new = self._opening()
        held = transactions.current()
        if held is None:
            open_batch(redis, self.bid, new)
        else:  # in a transaction: opened, filled and closed after the commit, as one unit
            held.add(functools.partial(open_batch, redis, self.bid, new), f"batch {self.bid}")
        self._created = True
        try:
            with building_inside(self.bid):
                yield self
        finally:
            if held is None:
                close_batch(redis, self.bid)
            else:
                held.add(functools.partial(close_batch, redis, self.bid), f"batch {self.bid}")

    def _opening(self) -> NewBatch | None:
        """What the next ``jobs()`` block writes: the batch itself the first time (the
        child of the batch being built, if any), nothing after."""
        return None if self._created else self._new(building_bid())

    def _new(self, parent: str | None) -> NewBatch:
        return NewBatch(
            bid=self.bid,
            description=self.description,
            expires_in=self.expires_in,
            callbacks={event: list(entries) for event, entries in self._callbacks.items()},
            parent=parent,
        )

    def _template(self, callback: Any, options: dict[str, Any]) -> dict[str, Any]:
        """The callback's payload, cut where the status goes (see batch_lib.lua)."""
        spec = _spec_of(callback)
        name = spec.name if spec else str(callback)
        if spec is not None and spec.options.get("encrypt"):
            # Its payload is finished in Redis, where the status goes in: nothing there
            # can seal it, and its options would wait in the batch in clear.
            raise ValueError(
                f"batch callback {name} has encrypt=True, which callbacks cannot have: "
                "give the callback ids to look up rather than secrets"
            )
        item: Payload = {"class": name, "args": [STATUS_MARK, options]}
        if self.callback_queue:
            item["queue"] = self.callback_queue
        payload = normalize(item, spec)
        check_args(name, payload["args"], "raise")
        text = dumps(payload)
        k = keys.of(_client(self._client).redis)  # the layout its callbacks are pushed in
        mark = json.dumps(STATUS_MARK)
        cut = text.index(mark)
        template: dict[str, Any] = {
            "queue": payload["queue"],
            "queue_key": k.queue(payload["queue"]),
            "head": text[:cut],
            "tail": text[cut + len(mark) : -1],
        }
        if k.cluster:  # the queue is on another shard (limitd.handoff)
            template["handoff"] = True
        return template

    def __repr__(self) -> str:
        return f"<limitd.Batch {self.bid} {self.description!r}>"


class AsyncBatchJobs:
    """``batch.aio``: the batch's ``jobs()`` block for async code."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    @asynccontextmanager
    async def jobs(self) -> AsyncIterator[Batch]:
        """``Batch.jobs()`` for async code: the batch is opened and closed through the
        event loop's asyncio Redis, and every job pushed inside the block (by this task,
        awaited or not: ``job.aio.perform_async`` and ``job.perform_async`` alike) joins
        it. The batch id is a context variable, so tasks started inside the block carry
        it too: await them before the block ends, or their pushes join a batch that may
        have fired. In a database transaction nothing is sent now (the batch is opened, filled
        and closed after the commit), so the sync block serves as it is."""
        batch = self.batch
        if transactions.current() is not None:
            with batch.jobs():
                yield batch
            return
        redis = loop_twin(_client(batch._client).redis)
        k = keys.of(redis)
        check_opened(batch.bid, await open_call(k, batch.bid, batch._opening()).arun(redis))
        batch._created = True
        try:
            with building_inside(batch.bid):
                yield batch
        finally:
            await close_call(k, batch.bid).arun(redis)
            if k.cluster:  # callbacks it fired were handed off
                await handoff.apush_waiting(redis, clock.now())


def _spec_of(callback: Any) -> JobSpec | None:
    spec = getattr(callback, "spec", None)
    if isinstance(spec, JobSpec):
        return spec
    if isinstance(callback, str):
        return registry.resolve(callback)
    raise TypeError(f"batch callback must be a job or a job name, not {callback!r}")


def _client(client: Client | None) -> Client:
    return client if client is not None else default_client()


__all__ = ["Batch", "BatchNotOpen", "BatchStatus"]
