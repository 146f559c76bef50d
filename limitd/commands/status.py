"""``limitd status``: which processes run, how busy they are, and the global totals.

The first question in an incident is "is anything running, and is it alive?": one line
per process with its busy threads and the age of its last heartbeat (a healthy process
beats every ``--heartbeat-period``, 15 s by default), then the counters from ``Stats``.
Read in four round trips (``Processes`` two, ``Stats`` two) however large the cluster.
"""

from __future__ import annotations

import argparse
from typing import Any

from limitd.api import Processes, ProcessStatus, Stats
from limitd.commands import table
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    add_json_flag,
    bind,
    print_json,
)

PROCESS_HEADERS = (
    "IDENTITY",
    "TAG",
    "CAPSULE",
    "PID",
    "CPUS",
    "BUSY",
    "QUEUES",
    "QUIET",
    "LAST BEAT",
)
TOTAL_HEADERS = ("PROCESSED", "FAILED", "ENQUEUED", "SCHEDULED", "RETRIES", "DEAD")


def add_status_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "status",
        help="processes and global totals",
        description=(
            "List the live worker processes (identity, tag, capsule, pid, the CPUs it may "
            "run on, busy threads "
            "out of concurrency, queues, quiet flag, seconds since the last heartbeat), "
            "then the totals: jobs processed and failed, enqueued, scheduled, waiting "
            'for a retry and dead. --json prints {"processes": [...], "totals": {...}}.'
        ),
    )
    add_json_flag(parser)
    bind(parser, run_status, resolve_redis)


def run_status(args: argparse.Namespace, connect: Connect) -> int:
    redis = connect()
    processes = [process_row(process) for process in Processes(redis)]
    totals = totals_row(Stats(redis))
    if args.json:
        print_json({"processes": processes, "totals": totals})
        return EX_OK
    if processes:
        print(table.render(PROCESS_HEADERS, [_process_cells(row) for row in processes]))
    else:
        print("no processes running")
    print()
    print(table.render(TOTAL_HEADERS, [list(totals.values())]))
    return EX_OK


def process_row(process: ProcessStatus) -> dict[str, Any]:
    """One process as JSON: the ``ProcessStatus`` fields, ages rounded to milliseconds."""
    row = process.as_dict()
    if row["seconds_since_beat"] is not None:
        row["seconds_since_beat"] = round(row["seconds_since_beat"], 3)
    return row


def totals_row(stats: Stats) -> dict[str, int]:
    """The totals, keyed in the order the table shows them."""
    return {
        "processed": stats.processed,
        "failed": stats.failed,
        "enqueued": stats.enqueued,
        "scheduled": stats.scheduled_size,
        "retries": stats.retry_size,
        "dead": stats.dead_size,
    }


def _process_cells(row: dict[str, Any]) -> list[object]:
    concurrency = "?" if row["concurrency"] is None else row["concurrency"]
    return [
        row["identity"],
        row["tag"] or None,
        row["capsule"],
        row["pid"],
        row["cpus"],
        f"{row['busy']}/{concurrency}",
        ",".join(row["queues"]),
        row["quiet"],
        None if row["seconds_since_beat"] is None else f"{row['seconds_since_beat']:.1f}s",
    ]
