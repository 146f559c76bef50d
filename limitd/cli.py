"""The ``limitd`` command line: run workers, enqueue, inspect and steer.

The commands live in ``limitd.commands``; this module owns the global options, logging,
and how a command finds Redis: ``--redis``, else ``LIMITD_REDIS_URL`` / ``REDIS_URL``,
else the ``redis.url`` of the files given with ``-C``, else the embedded Redis that a
``limitd start`` runs beside those files (or in this directory).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import redis as redis_py

from limitd import __version__
from limitd.commands import add_admin_commands
from limitd.commands.enqueue import add_enqueue_command
from limitd.commands.start import EX_CONFIG, add_start_commands
from limitd.config import ConfigError, RedisSettings
from limitd.config_loader import load_config
from limitd.configure import redis_url
from limitd.redis import connect

LOG_FORMAT = "%(asctime)s pid=%(process)d %(threadName)s %(levelname)s %(name)s: %(message)s"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format=LOG_FORMAT)
    try:
        return int(args.command(args))
    except ConfigError as exc:
        print(f"limitd: {exc}", file=sys.stderr)
        return EX_CONFIG


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limitd", description=__doc__.splitlines()[0])
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
        help="config file naming the Redis to use (repeatable)",
    )
    commands = parser.add_subparsers(title="commands", required=True)
    add_start_commands(commands)
    add_enqueue_command(commands, resolve_redis)
    add_admin_commands(commands, resolve_redis)
    return parser


def resolve_redis(args: argparse.Namespace) -> redis_py.Redis | None:
    """The Redis an inspection command talks to; None if there is none."""
    config = load_config(args.config) if args.config else None
    url = redis_url(config, args.redis)
    if url is None:
        return None
    settings = config.redis if config is not None else RedisSettings()
    return connect(
        url, socket_timeout=settings.socket_timeout, connect_timeout=settings.connect_timeout
    )


if __name__ == "__main__":
    sys.exit(main())
