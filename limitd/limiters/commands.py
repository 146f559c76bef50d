"""``limitd limiters``: the limiters in use and how they are doing.

"Is the Stripe limiter the reason imports are slow?": per limiter its kind and limit,
its calls, how many got in at once, after waiting, or not at all (over limit), the
average wait and hold, and (concurrent) how many hold a slot now.
"""

from __future__ import annotations

import argparse
from typing import Any

from limitd.commands import table
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    add_json_flag,
    bind,
)
from limitd.limiters.admin import LimiterStatus, limiters

HEADERS = (
    "NAME", "KIND", "LIMIT", "PER", "CALLS", "IMMEDIATE", "WAITED", "OVER", "AVG WAIT",
    "AVG HOLD", "HELD",
)  # fmt: skip


def add_limiters_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "limiters",
        help="limiters used in job code, with their statistics",
        description=(
            "List the limiters used within their ttl, most recently used first. PER is "
            "the interval (the lock timeout for concurrent limiters); HELD the slots held "
            "now. --json prints the status objects (name, kind, limit, period, calls, "
            "immediate, waited, over_limit, average_wait, average_hold, expired, held, "
            "last_used)."
        ),
    )
    add_json_flag(parser)
    bind(parser, run_limiters, resolve_redis)


def run_limiters(args: argparse.Namespace, connect: Connect) -> int:
    statuses = limiters(connect())
    documents = [status.as_dict() for status in statuses]
    cells = [_cells(status) for status in statuses]
    table.print_listing(args.json, documents, HEADERS, cells, "no limiters")
    return EX_OK


def _cells(status: LimiterStatus) -> list[Any]:
    return [
        table.truncate(status.name, 40),
        status.kind,
        status.limit,
        f"{status.period:g}s",
        status.calls,
        status.immediate,
        status.waited,
        status.over_limit,
        f"{status.average_wait:.3f}s",
        f"{status.average_hold:.3f}s" if status.kind == "concurrent" else "-",
        "-" if status.held is None else status.held,
    ]
