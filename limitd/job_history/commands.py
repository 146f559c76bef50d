"""``limitd history``: per job class, the jobs processed and failed over the last
minutes, and their total and average time (what the dashboard's Metrics page shows)."""

from __future__ import annotations

import argparse

from limitd.commands import table
from limitd.commands.common import EX_OK, Connect, ResolveRedis, Subparsers, add_json_flag, bind
from limitd.job_history.admin import DEFAULT_MINUTES, LONGEST, ClassHistory, job_history

HEADERS = ("CLASS", "PROCESSED", "FAILED", "TOTAL_MS", "AVERAGE_MS")


def add_history_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "history",
        help="job metrics history: processed, failed and time per job class",
        description=(
            "List the job classes that ran in the last --minutes minutes (default 60), "
            "busiest first, with their processed and failed jobs and their total and "
            "average time, from the history the capsules write when job_history.enabled "
            "is set. --json prints the class objects (job_class, processed, failed, "
            "milliseconds, average_ms, buckets, minutes)."
        ),
    )
    parser.add_argument(
        "--minutes",
        type=_minutes,
        default=DEFAULT_MINUTES,
        help=f"how many minutes back, 1 to {LONGEST} (default {DEFAULT_MINUTES})",
    )
    add_json_flag(parser)
    bind(parser, run_history, resolve_redis)


def _minutes(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= LONGEST:
        raise argparse.ArgumentTypeError(f"expected a number of minutes from 1 to {LONGEST}")
    return int(text)


def run_history(args: argparse.Namespace, connect: Connect) -> int:
    rows = job_history(connect(), args.minutes)
    documents = [row.as_dict() for row in rows]
    table.print_listing(args.json, documents, HEADERS, [_cells(row) for row in rows], "none")
    return EX_OK


def _cells(row: ClassHistory) -> list[object]:
    return [
        table.truncate(row.job_class, 50),
        row.processed,
        row.failed,
        row.milliseconds,
        round(row.average_ms, 1),
    ]
