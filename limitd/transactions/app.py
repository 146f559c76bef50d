"""``limitd.transaction_aware``: one plain entry point for every ORM adapter.

::

    limitd.transaction_aware("django")                 # every alias in DATABASES
    limitd.transaction_aware("django", using="default")
    limitd.transaction_aware("sqlalchemy")             # every Session, async ones too
    limitd.transaction_aware(SessionLocal)             # one sessionmaker (or session class,
                                                       # session, AsyncSession, async_sessionmaker)
    limitd.transaction_aware(SessionLocal, outbox=True)  # through the outbox table
    limitd.transaction_aware("django", outbox=True)      # Django, through the outbox

The adapters are imported only when asked for, so limitd runs without either ORM.
"""

from __future__ import annotations

from typing import Any


def transaction_aware(orm: Any, /, **options: Any) -> Any:
    """Hold jobs enqueued inside the ORM's transactions until they commit, and drop them
    when they roll back. ``options`` go to the adapter (``using`` for Django, ``outbox``
    for both). Returns what the adapter returns (Django: its provider)."""
    if orm == "django":
        from limitd.transactions import django

        return django.transaction_aware(**options)
    if orm == "sqlalchemy" or _from_sqlalchemy(orm):
        from limitd.transactions import sqlalchemy

        return sqlalchemy.transaction_aware(None if orm == "sqlalchemy" else orm, **options)
    raise TypeError(
        f"transaction_aware: expected 'django', 'sqlalchemy' or a SQLAlchemy session, "
        f"session class or session maker, not {orm!r}"
    )


def _from_sqlalchemy(orm: Any) -> bool:
    kind = orm if isinstance(orm, type) else type(orm)
    return any(base.__module__.startswith("sqlalchemy.") for base in kind.__mro__)
