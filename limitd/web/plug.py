"""The web dashboard as a feature: ``limitd web`` (``limitd.web.commands``), imported
only when the command line builds its parser; the dashboard itself
(``limitd.web.application``) only when the command runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from limitd.plugins import Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd web``."""
    from limitd.web.commands import add_web_command

    add_web_command(subparsers, resolve_redis)


WEB = Feature(name="web", add_commands=add_commands)
