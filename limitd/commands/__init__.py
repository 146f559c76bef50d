"""The ``limitd`` commands that inspect and steer a running system.

``limitd status``, ``limitd restart``, ``limitd queues``, ``limitd limit set|clear|reset``, ``limitd
pause|resume``, ``limitd retries|dead|scheduled list|retry|delete``, and each registered
feature's own (``limitd tenants``, ``limitd batches``, see ``limitd.plugins``): a thin
layer over ``limitd.api``, which does every read and write, so the command line and a Python
shell can never disagree. ``cli.py`` owns the parser and how Redis is found; it hands
both to :func:`add_admin_commands`. One module per command group, ``table`` for the
human output, ``common`` for exit codes and the Redis connection.

Exit codes: 0 done; 1 some jids were not found (the others were processed); 64 bad
input; 69 no Redis configured or reachable.
"""

from __future__ import annotations

from limitd.commands.common import ResolveRedis, Subparsers
from limitd.commands.limits import add_limit_commands, add_pause_commands
from limitd.commands.queues import add_queues_command
from limitd.commands.restart import add_restart_command
from limitd.commands.sets import add_set_commands
from limitd.commands.status import add_status_command
from limitd.plugins import registered

__all__ = ["ResolveRedis", "Subparsers", "add_admin_commands"]


def add_admin_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """Register the admin subcommands on ``subparsers`` (what the top-level parser's
    ``add_subparsers()`` returned). Each sets ``command`` to a ``(args) -> int``.
    ``resolve_redis(args)`` returns the client to use, or None when no Redis can be
    found; it is called only once input is checked, so bad input exits 64 without
    looking for Redis."""
    add_status_command(subparsers, resolve_redis)
    add_restart_command(subparsers, resolve_redis)
    add_queues_command(subparsers, resolve_redis)
    add_limit_commands(subparsers, resolve_redis)
    add_pause_commands(subparsers, resolve_redis)
    add_set_commands(subparsers, resolve_redis)
    for feature in registered():
        if feature.add_commands is not None:
            feature.add_commands(subparsers, resolve_redis)
