"""The ``limitd`` command line: run workers, enqueue, inspect and steer.

The commands live in ``limitd.commands``; this module owns the global options, logging,
and how a command finds Redis (:func:`resolve_redis`: the order of ``limitd.locate``,
which app code follows too). ``-C`` names the config for every command, ``start`` and
``check`` included, like ``LIMITD_CONFIG`` does when no ``-C`` is given.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import redis as redis_py

from limitd import logs
from limitd.commands import add_admin_commands
from limitd.commands.common import EX_UNAVAILABLE
from limitd.commands.enqueue import add_enqueue_command
from limitd.commands.start import EX_CONFIG, add_start_commands
from limitd.config import ConfigError, LoggingSettings
from limitd.locate import RedisNotFound, connect_to, locate, named_config, not_running
from limitd.version import __version__

DESCRIPTION = (
    "limitd runs background jobs stored in Redis, in the style of Sidekiq. Run workers "
    "with 'limitd start', push a job with 'limitd enqueue', and inspect and steer queues, "
    "limits and the retry, dead and scheduled sets with the other commands."
)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(  # until 'limitd start' applies the config's logging section
        level=logging.DEBUG if args.verbose else logging.INFO,
        handlers=[logs.handler_for(LoggingSettings())],
    )
    try:
        return int(args.command(args))
    except ConfigError as exc:
        print(f"limitd: {exc}", file=sys.stderr)
        return EX_CONFIG
    except RedisNotFound as exc:
        print(f"limitd: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limitd", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"limitd {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--redis", metavar="URL", help="Redis URL (default: environment, config, embedded Redis)"
    )
    parser.add_argument(
        "-C",
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="config file for every command, start and check included: its Redis, its "
        "jobs (repeatable, merged in order; default: LIMITD_CONFIG)",
    )
    commands = parser.add_subparsers(title="commands", required=True)
    add_start_commands(commands)
    add_enqueue_command(commands, resolve_redis)
    add_admin_commands(commands, resolve_redis)
    return parser


def resolve_redis(args: argparse.Namespace) -> redis_py.Redis | None:
    """The Redis every command but ``start`` talks to (the web and metrics front ends
    too): ``--redis``, the environment, the ``-C`` files (else ``LIMITD_CONFIG``), a
    running embedded Redis here or in ``conf/``. None if nothing is configured; raises
    ``RedisNotFound`` when a named config's Redis is not running."""
    where = locate(args.redis, named_config(args.config))
    if where.url is not None:
        return connect_to(where)
    if where.config is not None:
        raise not_running(where.config)
    return None


if __name__ == "__main__":
    sys.exit(main())
