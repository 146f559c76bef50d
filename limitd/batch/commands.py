"""``limitd batches [BID]``: batches, newest first, or one batch with its failures.

"Is the nightly import done, and what failed?": per batch its jobs (total, pending),
the jobs whose last run failed, its state and when it was created. ``STATE`` is
``building`` while a ``jobs()`` block is open, then ``running``, ``complete`` (every job
ran; some have not succeeded yet) and ``success``; ``+death`` marks a batch one of whose
jobs died.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from limitd.batch.admin import BatchStatus, batch_status, list_batches, state
from limitd.commands import table
from limitd.commands.common import (
    EX_NOT_FOUND,
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    add_json_flag,
    bind,
    fail,
    parse_count,
    print_json,
)

HEADERS = ("BID", "DESCRIPTION", "TOTAL", "PENDING", "FAILURES", "STATE", "CREATED")
DEFAULT_LIMIT = "20"


def add_batches_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "batches",
        help="batches, newest first, or one batch with its failures",
        description=(
            "List batches newest first, or show the batch BID with the error of each job "
            "whose last run failed. --json prints the status objects (bid, description, "
            "total, pending, failures {jid: error}, created_at, complete_at, success_at, "
            "death_at, parent, children, building, complete, success)."
        ),
    )
    parser.add_argument(
        "bid", nargs="?", help="show this batch only (write -- BID for a bid starting with -)"
    )
    parser.add_argument(
        "--limit", default=DEFAULT_LIMIT, metavar="N", help="show at most N batches (20)"
    )
    add_json_flag(parser)
    bind(parser, run_batches, resolve_redis)


def run_batches(args: argparse.Namespace, connect: Connect) -> int:
    limit = parse_count(args.limit, "--limit", minimum=1)
    if args.bid:
        return _show_one(args, connect)
    statuses = list_batches(connect(), limit)
    documents = [status.as_dict() for status in statuses]
    cells = [_cells(status) for status in statuses]
    table.print_listing(args.json, documents, HEADERS, cells, "no batches")
    return EX_OK


def _show_one(args: argparse.Namespace, connect: Connect) -> int:
    status = batch_status(connect(), args.bid)
    if status is None:
        return fail(
            "limitd batches", f"no batch {args.bid} (never created, or expired)", EX_NOT_FOUND
        )
    if args.json:
        print_json(status.as_dict())
        return EX_OK
    print(table.render(HEADERS, [_cells(status)]))
    for jid, error in sorted(status.failures.items()):
        print(f"  failed {jid}: {table.truncate(error, 120)}")
    return EX_OK


def _cells(status: BatchStatus) -> list[Any]:
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.created_at))
    return [
        status.bid,
        table.truncate(status.description, 40) or "-",
        status.total,
        status.pending,
        len(status.failures),
        state(status),
        created,
    ]
