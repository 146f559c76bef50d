"""What every admin command shares: exit codes, input checks, the Redis connection and
JSON output.

A command is a function ``run(args, connect) -> exit code``. ``connect`` resolves Redis
only when called, so bad input is reported (exit 64) before Redis is even looked for,
and a command that needs no Redis for a given input never opens a connection. ``bind``
turns it into the ``command(args) -> int`` that ``cli.main`` calls, and turns the three
expected failures into one line on stderr and a named exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

import redis as redis_py

from limitd.registry import import_app

EX_OK = 0
EX_NOT_FOUND = 1  # some of the named jobs were not found; the others were processed
EX_USAGE = 64
EX_UNAVAILABLE = 69

# What ``ArgumentParser.add_subparsers()`` returns (argparse names it privately).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
ResolveRedis = Callable[[argparse.Namespace], "redis_py.Redis | None"]
Connect = Callable[[], redis_py.Redis]
Run = Callable[[argparse.Namespace, Connect], int]


class UsageError(Exception):
    """Input argparse accepted but the command cannot use (a negative count): exit 64."""


class Unavailable(Exception):
    """No Redis to talk to: none configured, or it does not answer. Exit 69."""


def bind(parser: argparse.ArgumentParser, run: Run, resolve_redis: ResolveRedis) -> None:
    """Make ``run`` the command of ``parser``. Messages are prefixed with the
    subcommand's full name (``limitd limit set: ...``) so a script's log says which
    call failed."""
    prog = parser.prog

    def command(args: argparse.Namespace) -> int:
        def connect() -> redis_py.Redis:
            redis = resolve_redis(args)
            if redis is None:
                raise Unavailable(
                    "no Redis found: pass --redis URL or -C CONFIG, set LIMITD_REDIS_URL "
                    "or LIMITD_CONFIG, or run `limitd start` here or in conf/"
                )
            return redis

        try:
            return run(args, connect)
        except UsageError as exc:
            return fail(prog, str(exc), EX_USAGE)
        except Unavailable as exc:
            return fail(prog, str(exc), EX_UNAVAILABLE)
        except (redis_py.ConnectionError, redis_py.TimeoutError) as exc:
            return fail(prog, f"cannot reach Redis: {exc}", EX_UNAVAILABLE)

    parser.set_defaults(command=command)


def fail(prog: str, message: str, code: int) -> int:
    """One line on stderr, and the exit code to return."""
    print(f"{prog}: {message}", file=sys.stderr)
    return code


def parse_count(value: str, name: str, minimum: int = 0) -> int:
    """An integer argument, checked here rather than by argparse's ``type=``: argparse
    would exit with its own code 2, and bad input is EX_USAGE (64) for limitd."""
    try:
        number = int(value.strip())
    except ValueError:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def check_queue(name: str) -> str:
    """A queue name as typed; an empty one is a slip, not a queue."""
    if not name.strip():
        raise UsageError("a queue name cannot be empty")
    return name


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON document instead of a table, for scripts",
    )


def print_json(document: Any) -> None:
    """The document on stdout: numbers stay numbers, None becomes null."""
    print(json.dumps(document, indent=2, ensure_ascii=False))


def import_app_modules(modules: list[str]) -> None:
    """The ``-r MODULE`` modules of an admin command, from the current directory as
    ``limitd start`` imports them; one that cannot be imported is a usage error."""
    if not modules:
        return
    sys.path.insert(0, os.getcwd())
    try:
        import_app(modules)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
