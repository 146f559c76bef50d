"""Transaction-aware enqueue for SQLAlchemy 2.x sessions, sync and async::

    import limitd.transactions.sqlalchemy as tx
    tx.transaction_aware()                   # every Session (AsyncSession included)

    with Session(engine) as session, session.begin():
        session.add(User(id=7, email=...))
        welcome.perform_async(7)             # jid now; pushed after the COMMIT

Built on the session's transaction events: each ``SessionTransaction`` gets a
:class:`~limitd.transactions.hold.Held`, and the innermost one open in the current
context (thread or asyncio task) holds what is pushed. When it ends:

- committed: the root's pushes run right after the COMMIT; a released savepoint hands
  its pushes to the transaction around it, so they wait for the outer commit;
- rolled back (a savepoint or the whole transaction): its pushes are dropped;
- closed without either (``session.close()`` on an autobegun transaction): dropped if
  the transaction wrote anything (a flush, or any statement but a SELECT), since that
  work is rolled back; pushed if it only read, since nothing the job could look for
  was undone (a session opened to read a row and enqueue a job about it is common).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from limitd.transactions.hold import Held, add_provider

OPEN, COMMITTED, ROLLED_BACK = "open", "committed", "rolled back"
_INFO_KEY = "limitd.transactions"
_WROTE_KEY = "limitd.transactions.wrote"
_READS = ("select", "show", "explain")

_open: contextvars.ContextVar[tuple[Held, ...]] = contextvars.ContextVar(
    "limitd_sqlalchemy_open", default=()
)


@dataclass
class _Level:
    """One open SessionTransaction of a session, root or savepoint."""

    transaction: Any
    held: Held
    state: str = OPEN
    wrote: bool = False
    parent: _Level | None = field(default=None, repr=False)


def transaction_aware(target: Any = None, outbox: bool | str = False) -> None:
    """Hold pushes made inside the transactions of ``target``'s sessions: the
    ``Session`` class (the default: every session, the ones ``AsyncSession`` wraps
    included), a subclass, a ``sessionmaker``, one session, an ``AsyncSession`` or an
    ``async_sessionmaker``. Calling it again for the same target changes nothing.

    ``outbox`` (True, or the outbox table's name): write those pushes into the outbox
    table in the transaction instead of holding them in memory; a relay pushes them
    (``limitd.outbox``). Sync sessions only: the insert is made at the enqueue."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    resolved = _event_target(target)
    if all(known is not resolved for known in _targets):
        _targets.append(resolved)
    if outbox:
        _use_outbox(resolved, outbox)
    # Listened for once, on the base class: listeners on a sessionmaker as well would
    # fire twice for its sessions. _created keeps only the sessions of _targets.
    for name, listener in _LISTENERS.items():
        if not event.contains(Session, name, listener):
            event.listen(Session, name, listener)
    add_provider(current_held)


def current_held() -> Held | None:
    """The innermost transaction open in this context, if any (the provider)."""
    levels = _open.get()
    return levels[-1] if levels else None


def _event_target(target: Any) -> Any:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
    from sqlalchemy.orm import Session

    if target is None:
        return Session
    if isinstance(target, AsyncSession):
        return target.sync_session
    if isinstance(target, async_sessionmaker):
        return target.kw.get("sync_session_class", Session)
    if isinstance(target, type) and issubclass(target, AsyncSession):
        return target.sync_session_class
    return target


# The outbox option: (event target, table name) of the sessions whose pushes are
# written into an outbox table (limitd.outbox) rather than held in memory.
_outboxes: list[tuple[Any, str]] = []


def _use_outbox(resolved: Any, outbox: bool | str) -> None:
    from limitd.outbox.table import DEFAULT_TABLE, checked_name

    table = DEFAULT_TABLE if outbox is True else checked_name(str(outbox))
    _outboxes[:] = [(known, name) for known, name in _outboxes if known is not resolved]
    _outboxes.append((resolved, table))


# The sessions set up for transaction-aware enqueue (classes, sessionmakers, sessions).
_targets: list[Any] = []


def _matches(session: Any, target: Any) -> bool:
    kind = getattr(target, "class_", target)  # a sessionmaker's sessions are its class_
    return session is kind or (isinstance(kind, type) and isinstance(session, kind))


def _new_held(session: Any, transaction: Any) -> Held:
    """A transaction's Held: the outbox's when its session was set up for one."""
    for target, table in reversed(_outboxes):
        if _matches(session, target):
            from limitd.outbox.held import OutboxHeld

            return OutboxHeld(transaction, session, table)
    return Held(transaction)


def _levels(session: Any) -> list[_Level]:
    found: list[_Level] = session.info.setdefault(_INFO_KEY, [])
    return found


def _created(session: Any, transaction: Any) -> None:
    if not any(_matches(session, target) for target in _targets):
        return
    levels = _levels(session)
    parent = next((level for level in levels if level.transaction is transaction.parent), None)
    level = _Level(transaction, _new_held(session, transaction), parent=parent)
    if parent is None:
        level.wrote = bool(session.info.pop(_WROTE_KEY, False))
    levels.append(level)
    _open.set((*_open.get(), level.held))


def _mark(session: Any, state: str) -> None:
    """The session's innermost open level committed or rolled back (its end follows)."""
    for level in reversed(_levels(session)):
        if level.state == OPEN:
            level.state = state
            return


def _committed(session: Any) -> None:
    _mark(session, COMMITTED)


def _rolled_back(session: Any) -> None:
    _mark(session, ROLLED_BACK)


def _wrote(session: Any, *_: Any) -> None:
    levels = _levels(session)
    if not levels:  # the statement comes before the transaction it autobegins
        session.info[_WROTE_KEY] = True
    for level in levels:
        level.wrote = True


def _executed(state: Any) -> None:
    if not _reads_only(state.statement):
        _wrote(state.session)


def _reads_only(statement: Any) -> bool:
    """A SELECT, or SQL text that starts as a read; anything else may write."""
    if getattr(statement, "is_select", False):
        return True
    if getattr(statement, "is_dml", False) or not hasattr(statement, "text"):
        return False
    return str(statement.text).lstrip().lower().startswith(_READS)


def _ended(session: Any, transaction: Any) -> None:
    levels = _levels(session)
    level = next((level for level in levels if level.transaction is transaction), None)
    if level is None:  # began before limitd was set up
        return
    levels.remove(level)
    _open.set(tuple(held for held in _open.get() if held is not level.held))
    _settle(level)


def _settle(level: _Level) -> None:
    closed_unwritten = level.state == OPEN and not level.wrote
    if level.state == COMMITTED or closed_unwritten:
        if level.parent is not None:
            level.held.hand_to(level.parent.held)
        else:
            level.held.run()  # raises to the code that committed if a push failed
    elif level.state == ROLLED_BACK:
        level.held.drop("the transaction rolled back")
    else:
        level.held.drop("the session closed a transaction that wrote, without committing")


_LISTENERS: dict[str, Callable[..., None]] = {
    "after_transaction_create": _created,
    "after_commit": _committed,
    "after_rollback": _rolled_back,
    "after_flush": _wrote,
    "do_orm_execute": _executed,
    "after_transaction_end": _ended,
}
