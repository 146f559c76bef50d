"""Pushes held until a database transaction commits.

The most common bug with a job queue: a job enqueued inside a transaction runs before
the transaction commits (the worker cannot find the row) or although it rolled back.
Once an ORM adapter is set up (``limitd.transactions.sqlalchemy``, ``.django``: each
adds its provider with :func:`add_provider`), the client offers every push to
:func:`hold_until_commit`, a push gate (``limitd.plugins.add_push_gate``); the client
itself knows nothing of transactions. When a provider says a transaction is open, the
push is validated at once (so a bad argument fails inside the transaction, where the
mistake is) and its jid returned, but the whole push (client middleware and Redis
write) is held in that transaction's :class:`Held`: run in order when it commits,
dropped when it rolls back. A savepoint has a ``Held`` of its own, handed to its parent
when released. With no provider, no gate is added and pushes pay nothing.

Held work runs with the context it was enqueued in (``contextvars``), so a job
enqueued inside a batch's ``jobs()`` block still joins that batch after the commit.
One action that fails does not stop the others; every failure is logged with the jid
and job name, and the first is raised to the code that committed: the database has
committed, the job did not go out (the outbox option closes that gap).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from limitd import plugins

log = logging.getLogger("limitd.transactions")

Provider = Callable[[], "Held | None"]


@dataclass(frozen=True)
class _Action:
    run: Callable[[], Any]
    context: contextvars.Context
    what: str  # "jid=... class=..." for the log


class PushAfterCommitFailed(Exception):
    """Held pushes that failed after the transaction committed (the first is the cause)."""


class Held:
    """The pushes held by one transaction (or savepoint)."""

    def __init__(self, owner: object = None) -> None:
        self.owner = owner  # what the adapter keys this on (a SessionTransaction ...)
        self.actions: list[_Action] = []

    def add(self, run: Callable[[], Any], what: str) -> None:
        self.actions.append(_Action(run, contextvars.copy_context(), what))

    def add_push(self, payloads: list[dict[str, Any]], run: Callable[[], Any], what: str) -> None:
        """A push of ``payloads`` (complete, validated, jids set): by default ``run``
        after the commit, like any action. The outbox's ``Held`` writes the payloads into
        the transaction instead, which is why the client says what it pushes."""
        self.add(run, what)

    def __len__(self) -> int:
        return len(self.actions)

    def hand_to(self, parent: Held) -> None:
        """A released savepoint: its pushes now wait for the enclosing transaction."""
        parent.actions.extend(self.actions)
        self.actions = []

    def drop(self, why: str) -> None:
        if self.actions:
            log.info("dropped %d held pushes: %s", len(self.actions), why)
            for action in self.actions:
                log.debug("dropped %s: %s", action.what, why)
        self.actions = []

    def run(self) -> None:
        """The transaction committed: run every action in order, each even if one
        before it failed; then raise the first failure, if any."""
        actions, self.actions = self.actions, []
        failures: list[BaseException] = []
        for action in actions:
            try:
                action.context.run(action.run)
            except Exception as exc:
                log.exception("push after commit failed: %s", action.what)
                failures.append(exc)
        if failures:
            raise PushAfterCommitFailed(
                f"{len(failures)} of {len(actions)} pushes failed after the commit: {failures[0]!r}"
            ) from failures[0]


_providers: list[Provider] = []
_lock = threading.Lock()


def add_provider(provider: Provider) -> None:
    """Ask ``provider`` (an ORM adapter) at every push whether a transaction is open.
    Adding the same provider again changes nothing."""
    with _lock:
        if provider not in _providers:
            _providers.append(provider)
        plugins.add_push_gate(hold_until_commit)


def remove_provider(provider: Provider) -> None:
    with _lock:
        if provider in _providers:
            _providers.remove(provider)
        if not _providers:
            plugins.remove_push_gate(hold_until_commit)


def current() -> Held | None:
    """Where a push made now must wait, or None to push at once. Costs one empty-list
    check when no adapter is set up."""
    for provider in _providers:
        held = provider()
        if held is not None:
            return held
    return None


def hold_until_commit(push: plugins.Push) -> bool:
    """The push gate: inside a transaction, validate ``push`` now and hold it until the
    commit (True); outside, let the client run it (False)."""
    held = current()
    if held is None:
        return False
    push.validate()
    held.add_push(push.payloads, push.run, push.what())
    return True
