"""``limitd cancel JID...`` and ``limitd progress JID...``."""

from __future__ import annotations

import argparse
import datetime as dt

from limitd.api.cancel import Cancellation, cancel
from limitd.commands import table
from limitd.commands.common import (
    EX_NOT_FOUND,
    EX_OK,
    Connect,
    ResolveRedis,
    Run,
    Subparsers,
    add_json_flag,
    bind,
    print_json,
)
from limitd.iteration.admin import IterationProgress, iteration_progress_of

PROGRESS_HEADERS = ("JID", "CLASS", "STATE", "ITEMS", "RUNS", "RUNTIME_S", "CURSOR", "UPDATED")


def add_iteration_commands(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    add_jids_command(
        commands,
        resolve_redis,
        "cancel",
        run_cancel,
        help="cancel jobs: remove them from queues and sets, stop iterable ones",
        description=(
            "For each JID: set the job's cancel flag, then remove the job from any queue, "
            "the schedule and the retry set. A running iterable job stops after its "
            "current item; a running plain job goes on unless its code checks "
            "limitd.cancelled(). Exit status 1 when a job was found nowhere (it may have "
            "finished; its flag is set anyway). --json prints one object per jid "
            "(jid, removed_from, running)."
        ),
    )
    add_jids_command(
        commands,
        resolve_redis,
        "progress",
        run_progress,
        help="where iterable jobs are: state, items done, cursor",
        description=(
            "For each JID of an iterable job: its state (running, interrupted, failed, expired, "
            "completed, cancelled), the items done and runs over all its runs, their total "
            "time, and the cursor of the last item done. Exit status 1 when a job has no "
            "progress recorded (not iterable, not started, or finished over a day ago)."
        ),
    )


def add_jids_command(
    commands: Subparsers,
    resolve_redis: ResolveRedis,
    name: str,
    run: Run,
    *,
    help: str,
    description: str,
) -> None:
    """A command taking one or more JIDs and ``--json``."""
    parser = commands.add_parser(name, help=help, description=description)
    parser.add_argument("jids", nargs="+", metavar="JID")
    add_json_flag(parser)
    bind(parser, run, resolve_redis)


def run_cancel(args: argparse.Namespace, connect: Connect) -> int:
    redis = connect()
    done = [cancel(jid, redis) for jid in args.jids]
    if args.json:
        print_json([one.as_dict() for one in done])
    else:
        for one in done:
            print(_cancel_line(one))
    return EX_OK if all(one.found for one in done) else EX_NOT_FOUND


def _cancel_line(one: Cancellation) -> str:
    said = []
    if one.removed_from:
        said.append("removed from " + ", ".join(one.removed_from))
    if one.running:
        said.append("running: an iterable job stops after its current item")
    return f"{one.jid}: " + ("; ".join(said) if said else "not found (flag set)")


def run_progress(args: argparse.Namespace, connect: Connect) -> int:
    found = iteration_progress_of(args.jids, connect())
    rows = [found[jid] for jid in args.jids if jid in found]
    documents = [row.as_dict() for row in rows]
    table.print_listing(args.json, documents, PROGRESS_HEADERS, [_cells(r) for r in rows], "none")
    return EX_OK if len(rows) == len(args.jids) else EX_NOT_FOUND


def _cells(row: IterationProgress) -> list[object]:
    return [
        row.jid,
        table.truncate(row.job_class or "-", 40),
        row.state,
        row.items,
        row.runs,
        round(row.runtime, 1),
        table.truncate(table.cell(row.cursor), 30),
        _when(row.updated_at),
    ]


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
