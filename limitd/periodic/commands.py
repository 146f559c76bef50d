"""``limitd periodic``: the periodic entries, when each last ran and when it runs next.

"Did the nightly import run, and when is the next one?": per entry its cron and zone,
its job, the jid and time of its last run as Redis records them, and its next tick. The
entries are the ``periodic`` section of the files given with ``-C`` (else
``LIMITD_CONFIG``); with no config, those the running schedulers recorded in Redis.
"""

from __future__ import annotations

import argparse

from limitd.commands import table
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    add_json_flag,
    bind,
)
from limitd.locate import named_config
from limitd.periodic.admin import PeriodicStatus, local_time, periodic_status
from limitd.periodic.section import KEY, PeriodicEntry, PeriodicSettings

HEADERS = ("NAME", "CRON", "TZ", "JOB", "LAST JID", "LAST RUN", "NEXT RUN")


def add_periodic_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "periodic",
        help="periodic (cron) jobs: last run and next run",
        description=(
            "List the periodic entries of the config (-C, else LIMITD_CONFIG; without a "
            "config, those the running schedulers recorded in Redis): name, cron, time "
            "zone, job, the jid and time of the last run, and the next run, in the "
            "entry's time zone. --json prints a list of objects with fields name, cron, "
            "tz, job, last_tick, last_jid, last_run_at, next_run (times in epoch "
            "seconds, null when it never ran)."
        ),
    )
    add_json_flag(parser)
    bind(parser, run_periodic, resolve_redis)


def run_periodic(args: argparse.Namespace, connect: Connect) -> int:
    statuses = periodic_status(connect(), _configured(args))
    documents = [status.as_dict() for status in statuses]
    cells = [_cells(status) for status in statuses]
    table.print_listing(args.json, documents, HEADERS, cells, "no periodic entries")
    return EX_OK


def _configured(args: argparse.Namespace) -> list[PeriodicEntry] | None:
    """The config's entries; None when no config is named (read Redis's instead)."""
    config = named_config(getattr(args, "config", None) or [])
    if config is None:
        return None
    settings: PeriodicSettings | None = config.section(KEY)
    return [] if settings is None else list(settings.entries)


def _cells(status: PeriodicStatus) -> list[object]:
    return [
        status.name,
        status.cron,
        status.tz,
        status.job,
        status.last_jid or "-",
        local_time(status.last_run_at, status.tz),
        local_time(status.next_run, status.tz),
    ]
