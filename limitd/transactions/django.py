"""Transaction-aware enqueue for Django's ``transaction.atomic()``::

    # in an AppConfig.ready(), after Django is set up
    import limitd.transactions.django as tx
    tx.transaction_aware()                    # every database alias

    with transaction.atomic():
        user = User.objects.create(email=...)
        welcome.perform_async(user.pk)        # jid now; pushed after the COMMIT

Built on ``transaction.on_commit``: while an atomic block is open on a watched alias,
each held action (a push, a batch's open or close) becomes one ``robust`` on_commit
callback, so Django's own savepoint rules decide its fate: dropped with an ``atomic()``
block that rolls back, kept until the outermost commit by one that exits normally, run
in order right after that commit. ``ATOMIC_REQUESTS`` is an atomic block around the
view, so a view's jobs go out after its transaction commits, never when it raises.

After the commit, one push that fails does not stop the others (limitd's or anyone's);
each failure is logged with the jid and job name, and the last limitd callback of the
commit arranges for :class:`~limitd.transactions.hold.PushAfterCommitFailed` to be
raised to the code that committed, after every other callback ran. Knowing which
callback is the last needs the list of callbacks Django has still to run, which Django
keeps private; where it cannot be read (another Django version, a test runner calling
the callbacks itself) the failures are only logged, never lost silently, and no other
callback is disturbed.

Django is imported only inside functions: ``import limitd`` works without it.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

from limitd.transactions.hold import Held, PushAfterCommitFailed, add_provider, log

_HOOKS_LOCAL = "current_run_on_commit"  # see _pending_callbacks
_MAX_FRAMES = 8  # how far up from a callback Django's hook runner may be


@dataclass(frozen=True)
class AtomicBlocks:
    """The provider :func:`transaction_aware` registers: asked at every push, it returns
    a :class:`DjangoHeld` for the first watched alias with an atomic block open in this
    thread, else None (push at once). Equal for equal aliases, so registering it twice
    changes nothing."""

    aliases: tuple[str, ...] | None = None  # None: every alias, the default one first
    outbox: str | None = None  # the outbox table's name: pushes become its rows

    def __call__(self) -> Held | None:
        from django.db import transaction

        for alias in self.aliases if self.aliases is not None else _every_alias():
            if transaction.get_connection(alias).in_atomic_block:
                if self.outbox is not None:
                    return DjangoOutboxHeld(alias, self.outbox)
                return DjangoHeld(alias)
        return None


def transaction_aware(
    using: str | Iterable[str] | None = None, outbox: bool | str = False
) -> AtomicBlocks:
    """Hold pushes made inside ``transaction.atomic()`` on ``using`` (an alias, a list of
    aliases, or None for every alias in ``DATABASES``) until the transaction commits.
    Call it once Django is set up (``AppConfig.ready``). Returns the provider, which
    ``limitd.transactions.hold.remove_provider`` takes to undo this.

    ``outbox`` (True, or the outbox table's name): write those pushes as rows of the
    outbox table in the atomic block's transaction instead, for the relay to push
    (``limitd.outbox``); nothing waits in memory or in on_commit callbacks."""
    table = None
    if outbox:
        from limitd.outbox.table import DEFAULT_TABLE, checked_name

        table = DEFAULT_TABLE if outbox is True else checked_name(str(outbox))
    provider = AtomicBlocks(_checked_aliases(using), table)
    add_provider(provider)
    return provider


def _checked_aliases(using: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """An alias missing from ``DATABASES`` is a mistake to report now, not at every push."""
    if using is None:
        return None
    aliases = (using,) if isinstance(using, str) else tuple(using)
    known = _every_alias()
    unknown = [alias for alias in aliases if alias not in known]
    if unknown:
        raise ValueError(f"transaction_aware: no database alias {unknown} in DATABASES {known}")
    return aliases


def _every_alias() -> list[str]:
    from django.db import DEFAULT_DB_ALIAS, connections

    return sorted(connections, key=lambda alias: alias != DEFAULT_DB_ALIAS)


class DjangoHeld(Held):
    """Where a push made inside an atomic block waits: not in a list of its own, as
    :class:`Held` keeps one, but in Django's on_commit callbacks, one per action, so a
    savepoint rollback drops exactly the actions registered inside it."""

    def __init__(self, alias: str) -> None:
        super().__init__(owner=alias)
        self.alias = alias

    def add(self, run: Callable[[], Any], what: str) -> None:
        from django.db import transaction

        callback = _OnCommit(run, what)
        transaction.on_commit(callback, using=self.alias, robust=True)
        callback.can_report = _registered_as_expected(self.alias, callback)


class DjangoOutboxHeld(Held):
    """An atomic block's pushes as rows of the outbox table, written through the
    alias's connection inside the block: Django's savepoints and rollbacks keep or drop
    them with the block's own rows. Generic actions (a batch's open and close) are
    refused, as with SQLAlchemy's outbox."""

    def __init__(self, alias: str, table: str) -> None:
        super().__init__(owner=alias)
        self.alias = alias
        self.table = table

    def add(self, run: Callable[[], Any], what: str) -> None:
        from limitd.outbox.held import BATCH_REFUSED, OutboxUnsupported

        raise OutboxUnsupported(f"{what}: {BATCH_REFUSED}")

    def add_push(self, payloads: list[dict[str, Any]], run: Callable[[], Any], what: str) -> None:
        from django.db import connections

        from limitd.batch.building import building_bid
        from limitd.outbox.held import BATCH_REFUSED, OutboxUnsupported
        from limitd.payload import dumps

        if building_bid() is not None:
            raise OutboxUnsupported(f"{what} (in batch {building_bid()}): {BATCH_REFUSED}")
        rows = [(str(payload["jid"]), dumps(payload)) for payload in payloads]
        with connections[self.alias].cursor() as cursor:  # the table name was checked
            cursor.executemany(f"INSERT INTO {self.table} (jid, payload) VALUES (%s, %s)", rows)
        log.debug("outbox %s: wrote %s", self.table, what)


@dataclass
class _Report:
    """What the limitd callbacks of one commit did, handed from each to the next."""

    ran: int = 0
    failures: list[tuple[str, Exception]] = field(default_factory=list)

    def raise_failures(self) -> None:
        """Run by Django last of all the commit's callbacks, not robust: the committer's
        ``atomic()`` (or ``commit()``) raises this."""
        what, first = self.failures[0]
        raise PushAfterCommitFailed(
            f"{len(self.failures)} of {self.ran} pushes failed after the commit, "
            f"first {what}: {first!r}"
        ) from first


class _OnCommit:
    """One held action as Django calls it after the commit: in the context it was
    enqueued in (so a job pushed inside a batch's ``jobs()`` joins that batch), catching
    and logging its own failure, then handing the commit's report on."""

    def __init__(self, run: Callable[[], Any], what: str) -> None:
        self.run = run
        self.what = what
        self.context = contextvars.copy_context()
        self.report: _Report | None = None  # set by the limitd callback before it
        self.can_report = False
        # Django names a robust callback that raises by its __qualname__.
        self.__qualname__ = f"limitd push after commit ({what})"

    def __call__(self) -> None:
        report = self.report or _Report()
        report.ran += 1
        try:
            self.context.run(self.run)
        except Exception as exc:
            log.exception("push after commit failed: %s", self.what)
            report.failures.append((self.what, exc))
        self._hand_on(report)

    def _hand_on(self, report: _Report) -> None:
        pending = _pending_callbacks() if self.can_report else None
        if pending is None:
            if report.failures:
                log.error(
                    "push after commit failed and cannot be raised to the code that "
                    "committed (Django's pending on_commit callbacks are out of reach): %s",
                    "; ".join(what for what, _ in report.failures),
                )
            return
        later = next((entry[1] for entry in pending if isinstance(entry[1], _OnCommit)), None)
        if later is not None:
            later.report = report
        elif report.failures:  # the last of ours: raise once every other callback ran
            pending.append((set(), report.raise_failures, False))


# Django internals: the two functions below read private state of
# django.db.backends.base.base.BaseDatabaseWrapper (as of Django 5.2): the
# (savepoint ids, callback, robust) tuples it keeps in ``run_on_commit``, and the local
# list ``current_run_on_commit`` that ``run_and_clear_commit_hooks`` pops them from
# after the commit. If either changes, they answer "unknown" and the failures are only
# logged: a push is never skipped and no other callback is disturbed.


def _registered_as_expected(alias: str, callback: _OnCommit) -> bool:
    """Django queued ``callback`` as the tuple we can later find and extend."""
    from django.db import transaction

    queued = getattr(transaction.get_connection(alias), "run_on_commit", None)
    if not isinstance(queued, list) or not queued:
        return False
    last = queued[-1]
    return isinstance(last, tuple) and len(last) == 3 and last[1] is callback and last[2] is True


def _pending_callbacks() -> list[Any] | None:
    """The callbacks of this commit that Django has still to run (a list it pops from,
    so appending to it runs an entry last), or None if Django's hook runner is not the
    caller or keeps them some other way."""
    hooks = _hooks_code()
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None or hooks is None:
            return None
        if frame.f_code is hooks:
            pending = frame.f_locals.get(_HOOKS_LOCAL)
            if isinstance(pending, list) and all(_is_entry(entry) for entry in pending):
                return pending
            return None
        frame = frame.f_back
    return None


@functools.cache
def _hooks_code() -> CodeType | None:
    try:
        from django.db.backends.base.base import BaseDatabaseWrapper

        runner = inspect.unwrap(BaseDatabaseWrapper.run_and_clear_commit_hooks)
    except (ImportError, AttributeError):
        return None
    code = getattr(runner, "__code__", None)
    return code if isinstance(code, CodeType) else None


def _is_entry(entry: Any) -> bool:
    return isinstance(entry, tuple) and len(entry) == 3 and callable(entry[1])
