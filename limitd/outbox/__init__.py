"""The transactional outbox: jobs enqueued inside a database transaction are written
into a table of that database, in the same transaction, and a relay pushes them to
Redis and deletes them. A commit then never loses a job, even when Redis is down at
that moment or the process dies right after it (see ``limitd.outbox.relay``)."""
