"""Batches as a feature: jobs pushed inside ``Batch.jobs()`` join the batch (client
middleware), each run is recorded with the job's acknowledgement (server middleware),
and ``limitd batches`` shows them. The admin calls are in ``batch.admin``."""

from limitd.batch.commands import add_batches_command
from limitd.batch.middleware import BatchMembership, BatchProgress
from limitd.plugins import Feature

BATCH = Feature(
    name="batch",
    client_middleware=lambda _settings: BatchMembership(),
    server_middleware=lambda _redis: BatchProgress(),
    add_commands=add_batches_command,
)
