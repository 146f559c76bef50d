"""The ``limitd`` command line: run workers, enqueue, inspect and steer.

The commands live in ``limitd.commands``; this module owns the global options, logging,
and how a command finds Redis (:func:`resolve_redis`: the order of ``limitd.locate``,
which app code follows too). ``-C`` names the config for every command, ``start`` and
``check`` included, like ``LIMITD_CONFIG`` does when no ``-C`` is given. It may come
before the command (``limitd -C app.yml start``) or, as Sidekiq users type it, after
(``limitd start -C app.yml``, ``limitd limit set -C app.yml ...``): every ``-C`` counts,
in the order given.
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


CONFIG_HELP = (
    "config file for every command, start and check included: its Redis, its jobs "
    "(repeatable, merged in order; default: LIMITD_CONFIG)"
)
_CONFIG_AFTER = "config_after_"  # dest prefix of -C given after the command, by depth


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
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
    parser.add_argument("-V", "--version", action="version", version=f"limitd {__version__}")
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
        help=CONFIG_HELP,
    )
    commands = parser.add_subparsers(title="commands", required=True)
    add_start_commands(commands)
    add_enqueue_command(commands, resolve_redis)
    add_admin_commands(commands, resolve_redis)
    accept_config_after_commands(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with every ``-C`` (before the command or after it, at any
    depth) in ``args.config``, in the order typed."""
    args = build_parser().parse_args(argv)
    after = sorted(
        (name for name in vars(args) if name.startswith(_CONFIG_AFTER)),
        key=lambda name: int(name.removeprefix(_CONFIG_AFTER)),
    )
    for name in after:
        args.config = [*args.config, *getattr(args, name)]
        delattr(args, name)
    return args


def accept_config_after_commands(parser: argparse.ArgumentParser, depth: int = 1) -> None:
    """Give every (sub)command its own ``-C/--config``, the one a Sidekiq user types
    after the command (``sidekiq -C config/sidekiq.yml``). argparse copies a
    subcommand's namespace over its parent's, so each depth keeps its files under a
    dest of its own, unset unless given; :func:`parse_args` joins them."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in {id(sub): sub for sub in action.choices.values()}.values():  # aliases
            sub.add_argument(
                "-C",
                "--config",
                action="append",
                dest=f"{_CONFIG_AFTER}{depth}",
                default=argparse.SUPPRESS,
                metavar="FILE",
                help=CONFIG_HELP + "; after the command as before it",
            )
            accept_config_after_commands(sub, depth + 1)


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
