"""``limitd queues``: every queue an operator can steer, one line each.

Size and latency say whether a queue keeps up; limit, process limit and busy say
whether its limit is what holds it back; paused says whether someone stopped it. The
rows come from ``queue_overview`` (three round trips whatever the number of queues),
so it is cheap enough to run in a ``watch`` loop.
"""

from __future__ import annotations

import argparse
from typing import Any

from limitd.api import QueueStatus, queue_overview
from limitd.commands import table
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    add_json_flag,
    bind,
)

HEADERS = ("QUEUE", "SIZE", "LATENCY", "LIMIT", "PROCESS LIMIT", "RATE", "BUSY", "PAUSED")


def add_queues_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "queues",
        help="queues with size, latency, limits, busy and paused",
        description=(
            "List every queue: jobs waiting (size), age in seconds of the oldest one "
            "(latency), the limit across all processes and within each process (- for "
            "unlimited), the rate limit (e.g. 100/minute), jobs running now (busy) and "
            "whether it is paused. --json prints a list of objects with fields name, "
            "size, latency, limit, process_limit, busy, paused, rate_limit."
        ),
    )
    add_json_flag(parser)
    bind(parser, run_queues, resolve_redis)


def run_queues(args: argparse.Namespace, connect: Connect) -> int:
    rows = [queue_row(status) for status in queue_overview(connect())]
    table.print_listing(args.json, rows, HEADERS, [_cells(row) for row in rows], "no queues")
    return EX_OK


def queue_row(status: QueueStatus) -> dict[str, Any]:
    """One queue as JSON; latency rounded to milliseconds."""
    row = status.as_dict()
    row["latency"] = round(row["latency"], 3)
    return row


def _cells(row: dict[str, Any]) -> list[object]:
    return [
        row["name"],
        row["size"],
        row["latency"],
        row["limit"],
        row["process_limit"],
        row["rate_limit"],
        row["busy"],
        "paused" if row["paused"] else "",
    ]
