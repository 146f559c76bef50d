"""``limitd capacity``: how full each limited-capacity job class is."""

from __future__ import annotations

import argparse
import datetime as dt

from limitd.capacity.admin import CapacityStatus, capacity
from limitd.commands import table
from limitd.commands.common import EX_OK, Connect, ResolveRedis, Subparsers, add_json_flag, bind

HEADERS = ("NAME", "RUNNING", "QUEUED", "MAX", "REMAINING", "UPDATED")


def add_capacity_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "capacity",
        help="limited-capacity jobs: copies running and queued against their maximum",
        description=(
            "List the limited-capacity job classes used in the last 30 days: copies "
            "running and queued now, and max_running_jobs and remaining_work_count as "
            "the last refill or copy read them (UPDATED, UTC). --json prints the status "
            "objects (name, running, queued, max_running_jobs, remaining_work_count, "
            "updated_at)."
        ),
    )
    add_json_flag(parser)
    bind(parser, run_capacity, resolve_redis)


def run_capacity(args: argparse.Namespace, connect: Connect) -> int:
    statuses = capacity(connect())
    documents = [status.as_dict() for status in statuses]
    table.print_listing(args.json, documents, HEADERS, [_cells(s) for s in statuses], "none")
    return EX_OK


def _cells(status: CapacityStatus) -> list[object]:
    updated = (
        "-"
        if status.updated_at is None
        else f"{dt.datetime.fromtimestamp(status.updated_at, dt.timezone.utc):%Y-%m-%d %H:%M:%S}"
    )
    return [
        table.truncate(status.name, 40),
        status.running,
        status.queued,
        _or_dash(status.max_running_jobs),
        _or_dash(status.remaining_work_count),
        updated,
    ]


def _or_dash(value: int | None) -> object:
    return "-" if value is None else value
