"""Batches as a feature: jobs pushed inside ``Batch.jobs()`` join the batch (client
middleware), each run is recorded with the job's acknowledgement (server middleware),
``limitd batches`` shows them, and the pollers' housekeeping drops expired batches from
the index once an hour. The admin calls are in ``batch.admin``.

The middleware is imported with ``import limitd`` (enqueueing needs it); the command
is imported by :func:`add_commands` when the command line builds its parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from limitd.batch.middleware import BatchMembership, BatchProgress
from limitd.batch.store import prune_index_hourly
from limitd.plugins import Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd batches``."""
    from limitd.batch.commands import add_batches_command

    add_batches_command(subparsers, resolve_redis)


BATCH = Feature(
    name="batch",
    client_middleware=lambda _settings: BatchMembership(),
    server_middleware=BatchProgress,
    add_commands=add_commands,
    housekeeping=prune_index_hourly,
)
