"""The transactional outbox as a feature: the ``outbox`` config section, a relay thread
in ``limitd start`` (in the first process of each capsule), and ``limitd outbox``.

What users call: ``limitd.transactions.sqlalchemy.transaction_aware(outbox=True)`` to
write enqueues into the table, ``limitd.outbox.table.create_table`` to create it.

Only the section is imported with ``import limitd``; the relay and the command when
``limitd start`` or the command line use them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from limitd.client import Client
from limitd.middleware.defaults import default_client_chain
from limitd.outbox import section
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers
    from limitd.outbox.relay import RelayService

log = logging.getLogger("limitd.outbox")


def outbox_services(context: ProcessContext) -> list[Service]:
    """A relay when the config has an ``outbox`` section, in process number 0 only:
    one relay per supervisor is enough (``SKIP LOCKED`` keeps more correct, and
    supervisors on several hosts each run one)."""
    settings: section.OutboxSettings | None = context.section(section.KEY)
    if settings is None or settings.url is None or context.capsule.process_number != 0:
        return []
    return [OutboxRelayService(settings, context)]


class OutboxRelayService:
    """The relay of one capsule process: its database engine is made at start (in the
    child, never shared over a fork) and disposed of at stop."""

    def __init__(self, settings: section.OutboxSettings, context: ProcessContext) -> None:
        self.settings = settings
        self.client = Client(context.redis, middleware=default_client_chain(context.sections))
        self.engine: Any = None
        self.service: RelayService | None = None

    def start(self) -> None:
        from sqlalchemy import create_engine

        from limitd.outbox.relay import Relay, RelayService

        engine = create_engine(str(self.settings.url), pool_size=1, pool_pre_ping=True)
        relay = Relay(engine, self.client, self.settings.table, self.settings.chunk)
        self.engine, self.service = engine, RelayService(relay, self.settings.poll_interval)
        self.service.start()
        log.info("outbox relay started: table %s", self.settings.table)

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.engine is not None:
            self.engine.dispose()


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd outbox``."""
    from limitd.outbox.commands import add_outbox_command

    add_outbox_command(subparsers, resolve_redis)


OUTBOX = Feature(
    name="outbox",
    section=ConfigSection(section.KEY, section.read_outbox, section.as_dict),
    add_commands=add_commands,
    process_services=outbox_services,
)
