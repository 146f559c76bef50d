"""``limitd outbox relay`` and ``limitd outbox status``.

``relay`` runs a relay in the foreground (until SIGINT or SIGTERM), or with ``--once``
relays what waits and exits: for a cron job, a deploy step, or an app that does not run
``limitd start`` with an ``outbox:`` section. ``status`` says how many rows wait and
how old the oldest is: a growing age means no relay runs, or it cannot reach Redis.
The database comes from ``--url``, else from the config's ``outbox`` section (``-C``,
else ``LIMITD_CONFIG``).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
from typing import Any

from limitd.client import Client
from limitd.commands.common import (
    EX_OK,
    EX_UNAVAILABLE,
    Connect,
    ResolveRedis,
    Subparsers,
    UsageError,
    add_json_flag,
    bind,
    fail,
    import_app_modules,
    print_json,
)
from limitd.config.settings import Config
from limitd.locate import named_config
from limitd.middleware.defaults import default_client_chain
from limitd.outbox.relay import Relay, RelayService
from limitd.outbox.section import KEY, OutboxSettings
from limitd.outbox.table import backlog, name_problem


def add_outbox_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "outbox",
        help="the transactional outbox: relay its rows to Redis, or count them",
        description="Relay the jobs committed into the outbox table, or count them.",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    relay = actions.add_parser(
        "relay",
        help="push the outbox's rows to Redis and delete them",
        description=(
            "Push the rows of the outbox table to Redis, oldest first, each exactly "
            "once, and delete them; runs until SIGINT/SIGTERM, or with --once until the "
            "table is empty (prints the number of rows relayed)."
        ),
    )
    _add_database_flags(relay)
    relay.add_argument("--once", action="store_true", help="relay what waits, then exit")
    relay.add_argument(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining the jobs, for middleware that read them (repeatable)",
    )
    bind(relay, run_relay, resolve_redis)
    status = actions.add_parser(
        "status",
        help="rows waiting in the outbox, and the age of the oldest",
        description=(
            "Print the rows waiting in the outbox table and the age in seconds of the "
            "oldest; --json prints {rows, oldest_age} (oldest_age null when empty)."
        ),
    )
    _add_database_flags(status)
    add_json_flag(status)
    bind(status, run_status, resolve_redis)


def _add_database_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="SQLAlchemy URL of the database (default: outbox.url)")
    parser.add_argument("--table", help="the outbox table (default: outbox.table, limitd_outbox)")


def run_relay(args: argparse.Namespace, connect: Connect) -> int:
    config = named_config(getattr(args, "config", None) or [])
    settings = _settings(args, config)
    import_app_modules(args.require)
    client = Client(connect(), middleware=default_client_chain(config.sections if config else None))
    engine = _engine(settings)
    try:
        relay = Relay(engine, client, settings.table, settings.chunk)
        if args.once:
            print(relay.drain())
        else:
            _serve(RelayService(relay, settings.poll_interval))
        return EX_OK
    except _database_errors() as exc:
        return fail("limitd outbox relay", f"cannot use the database: {exc}", EX_UNAVAILABLE)
    finally:
        engine.dispose()


def _serve(service: RelayService) -> None:
    """Relay in this thread until SIGTERM or SIGINT. A signal between two chunks stops
    at once; one in the middle of a chunk rolls it back (its pushes are marked, so the
    next relay only deletes those rows)."""
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        service.run()


def run_status(args: argparse.Namespace, connect: Connect) -> int:
    del connect  # the database only
    settings = _settings(args, named_config(getattr(args, "config", None) or []))
    engine = _engine(settings)
    try:
        found = backlog(engine, settings.table)
    except _database_errors() as exc:
        return fail("limitd outbox status", f"cannot use the database: {exc}", EX_UNAVAILABLE)
    finally:
        engine.dispose()
    if args.json:
        print_json(found.as_dict())
    else:
        age = "-" if found.oldest_age is None else f"{found.oldest_age:.1f}s"
        print(f"rows waiting: {found.rows}\noldest: {age}")
    return EX_OK


def _settings(args: argparse.Namespace, config: Config | None) -> OutboxSettings:
    """The config's section under the flags."""
    configured: OutboxSettings = (config.section(KEY) if config else None) or OutboxSettings()
    url = args.url or configured.url
    if not url:
        raise UsageError("no database: pass --url, or name a config with an outbox.url (-C)")
    table = args.table or configured.table
    problem = name_problem(table)
    if problem is not None:
        raise UsageError(f"--table: {problem}")
    return OutboxSettings(url, table, configured.poll_interval, configured.chunk)


def _engine(settings: OutboxSettings) -> Any:
    try:
        from sqlalchemy import create_engine
    except ImportError:
        raise UsageError("the outbox needs SQLAlchemy: pip install 'limitd[sqlalchemy]'") from None
    try:
        return create_engine(str(settings.url), pool_size=1, pool_pre_ping=True)
    except Exception as exc:  # a URL SQLAlchemy cannot use, a driver not installed
        raise UsageError(f"--url: {exc}") from None


def _database_errors() -> type[Exception]:
    from sqlalchemy.exc import DBAPIError

    return DBAPIError
