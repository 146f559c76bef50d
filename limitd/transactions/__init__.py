"""Transaction-aware enqueue: a job pushed while a database transaction is open is held
and pushed right after that transaction commits, dropped if it rolls back (see
``limitd.transactions.hold``; the ORM adapters are ``sqlalchemy`` and ``django``)."""
