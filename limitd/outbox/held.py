"""The outbox's :class:`~limitd.transactions.hold.Held`: a push made inside a
transaction becomes rows of the outbox table, written through that transaction's
session, so the database keeps or drops them with the rest of its work (a rolled-back
savepoint included). Nothing waits in memory, and the commit pushes nothing: the relay
(``limitd.outbox.relay``) does, later.

Batches are refused, loudly: a batch is opened and closed in Redis around its jobs,
and its jobs are tied to it by the thread that pushes them (``batch.building``); a
relay pushing the rows later, in another process, could do neither.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from limitd.batch.building import building_bid
from limitd.outbox.table import outbox_table
from limitd.payload import dumps
from limitd.transactions.hold import Held

log = logging.getLogger("limitd.outbox")

BATCH_REFUSED = (
    "batches are not supported through the outbox: build the batch outside the "
    "outbox transaction, or enqueue its jobs from a session without outbox=True"
)

ASYNC_REFUSED = (
    "the outbox writes its rows when the job is enqueued, which an AsyncSession cannot "
    "do from async code: use a sync Session for outbox transactions, or enqueue inside "
    "AsyncSession.run_sync"
)


class OutboxUnsupported(RuntimeError):
    """Something enqueued in an outbox transaction that the outbox cannot carry."""


class OutboxHeld(Held):
    """One transaction (or savepoint) of a session whose pushes go to the outbox."""

    def __init__(self, owner: object, session: Any, table: str) -> None:
        super().__init__(owner)
        self.session = session
        self.table = table
        self.rows = 0  # written at this level, for the log when it rolls back

    def add(self, run: Callable[[], Any], what: str) -> None:
        """Generic work after the commit (a batch opening or closing): refused."""
        raise OutboxUnsupported(f"{what}: {BATCH_REFUSED}")

    def add_push(self, payloads: list[dict[str, Any]], run: Callable[[], Any], what: str) -> None:
        """Insert one row per payload in the session's transaction; ``run`` (the push
        after the commit) is not needed."""
        if building_bid() is not None:
            raise OutboxUnsupported(f"{what} (in batch {building_bid()}): {BATCH_REFUSED}")
        if _async_outside_greenlet(self.session):
            raise OutboxUnsupported(f"{what}: {ASYNC_REFUSED}")
        from sqlalchemy import insert

        rows = [{"jid": str(payload["jid"]), "payload": dumps(payload)} for payload in payloads]
        # Session.execute, not the connection: the session then knows it wrote, and a
        # close without commit drops the rows like the rest of the transaction.
        self.session.execute(insert(outbox_table(self.table)), rows)
        self.rows += len(rows)
        log.debug("outbox %s: wrote %s", self.table, what)

    def hand_to(self, parent: Held) -> None:
        super().hand_to(parent)
        if isinstance(parent, OutboxHeld):
            parent.rows += self.rows
        self.rows = 0

    def drop(self, why: str) -> None:
        super().drop(why)
        if self.rows:
            log.info("%d outbox rows rolled back with the transaction: %s", self.rows, why)
        self.rows = 0


def _async_outside_greenlet(session: Any) -> bool:
    """An AsyncSession's sync session, called from plain async code (not from
    ``run_sync``): it cannot run a statement, and trying leaves a coroutine behind."""
    from sqlalchemy.util.concurrency import in_greenlet

    return bool(session.get_bind().dialect.is_async) and not in_greenlet()
