"""Limiters as a feature: ``limitd.Limiter`` in job code, a server middleware that
reschedules a job ``OverLimit`` escapes, and ``limitd limiters``. The admin call is
``limitd.limiters.admin.limiters`` (``limitd.api.limiters``).

The middleware is imported with ``import limitd``; the command when the command line
builds its parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from limitd.limiters.middleware import OverLimitReschedule
from limitd.plugins import Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd limiters``."""
    from limitd.limiters.commands import add_limiters_command

    add_limiters_command(subparsers, resolve_redis)


LIMITERS = Feature(
    name="limiters",
    server_middleware=OverLimitReschedule,
    add_commands=add_commands,
)
