"""``limitd retries|dead|scheduled list|retry|delete``: look at and act on the sorted sets.

The three sets hold the same thing (payloads scored by a time), so one set of commands
serves all three, described by a ``SetKind``. ``list`` shows the newest entries first
(highest score: the latest due, or the most recently dead). ``retry`` and ``delete``
take jids or ``--all`` and never ask for confirmation: they run in CI and scripts,
where there is no one to answer. A jid that is not in the set is named on stderr and
makes the exit code 1, after every other jid has been processed, so one stale jid in a
list does not stop the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

from limitd.api import DeadSet, RetrySet, ScheduledSet, SortedEntry, SortedSet
from limitd.commands import table
from limitd.commands.common import (
    EX_NOT_FOUND,
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    UsageError,
    add_json_flag,
    bind,
    parse_count,
)

DEFAULT_LIST_LIMIT = 20
ARGS_WIDTH = 40
ERROR_WIDTH = 60
PAST = {"retry": "retried", "delete": "deleted"}


@dataclasses.dataclass(frozen=True)
class SetKind:
    """One sorted set as the command line names it. ``errors``: its entries failed, so
    the listing shows their error and retry count."""

    command: str
    label: str
    set_class: type[SortedSet[Any]]
    errors: bool
    retry_help: str


KINDS = (
    SetKind("retries", "retry set", RetrySet, True, "enqueue now, not at the next retry time"),
    SetKind("dead", "dead set", DeadSet, True, "enqueue again (retry count unchanged)"),
    SetKind("scheduled", "scheduled set", ScheduledSet, False, "enqueue now, ahead of time"),
)


def add_set_commands(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    for kind in KINDS:
        group = commands.add_parser(
            kind.command,
            help=f"list, retry or delete jobs in the {kind.label}",
            description=f"Look at and act on the jobs in the {kind.label}.",
        )
        actions = group.add_subparsers(title="actions", required=True, metavar="ACTION")
        _add_list(actions, kind, resolve_redis)
        _add_action(actions, kind, "retry", kind.retry_help, resolve_redis)
        _add_action(actions, kind, "delete", "remove for good", resolve_redis)


def _add_list(actions: Subparsers, kind: SetKind, resolve_redis: ResolveRedis) -> None:
    fields = "jid, class, queue, at, score, args"
    if kind.errors:
        fields += ", retry_count, error_class, error_message"
    fields += ", malformed"
    parser = actions.add_parser(
        "list",
        help="show the newest jobs",
        description=(
            f"Show the jobs in the {kind.label}, newest first: jid, class, queue, when "
            "(UTC, ISO 8601), "
            + ("retry count, error, " if kind.errors else "")
            + f"arguments (cut to {ARGS_WIDTH} characters). --json prints a list of "
            f"objects with fields {fields} (arguments in full)."
        ),
    )
    parser.add_argument(
        "--limit",
        default=str(DEFAULT_LIST_LIMIT),
        metavar="N",
        help=f"show at most N jobs ({DEFAULT_LIST_LIMIT})",
    )
    add_json_flag(parser)
    bind(parser, lambda args, connect: run_list(kind, args, connect), resolve_redis)


def _add_action(
    actions: Subparsers, kind: SetKind, verb: str, what: str, resolve_redis: ResolveRedis
) -> None:
    parser = actions.add_parser(
        verb,
        help=f"{what}: jobs by jid, or --all",
        description=(
            f"{verb.capitalize()} jobs of the {kind.label} by jid, or all of them with "
            f"--all, without asking: {what}. Exit code 1 if a jid is not in the set "
            "(the others are still processed)."
        ),
    )
    parser.add_argument("jids", nargs="*", metavar="JID", help="job id (repeatable)")
    parser.add_argument("--all", action="store_true", help=f"{verb} every job in the set")
    run = run_retry if verb == "retry" else run_delete
    bind(parser, lambda args, connect: run(kind, args, connect), resolve_redis)


def run_list(kind: SetKind, args: argparse.Namespace, connect: Connect) -> int:
    limit = parse_count(args.limit, "--limit", minimum=1)
    zset = kind.set_class(connect())
    rows = [entry_row(entry, kind) for entry in itertools.islice(zset, limit)]
    cells = [_cells(row, kind) for row in rows]
    table.print_listing(args.json, rows, _headers(kind), cells, f"the {kind.label} is empty")
    if args.json or not rows:
        return EX_OK
    total = zset.size()
    if total > len(rows):
        print(f"\nshowing {len(rows)} of {total}, newest first (--limit N for more)")
    return EX_OK


def run_retry(kind: SetKind, args: argparse.Namespace, connect: Connect) -> int:
    jids = _targets(args)
    zset = kind.set_class(connect())
    if args.all:
        print(f"retried {_jobs(zset.retry_all())} from the {kind.label}")
        _report_leftovers(zset, kind)
        return EX_OK
    return _each_jid(zset, kind, jids, "retry", lambda entry: entry.retry())


def run_delete(kind: SetKind, args: argparse.Namespace, connect: Connect) -> int:
    jids = _targets(args)
    zset = kind.set_class(connect())
    if args.all:
        print(f"deleted {_jobs(zset.clear())} from the {kind.label}")
        return EX_OK
    return _each_jid(zset, kind, jids, "delete", lambda entry: entry.delete())


def entry_row(entry: SortedEntry, kind: SetKind) -> dict[str, Any]:
    """One entry as JSON. A malformed entry (bytes no server could run) has a null
    class and its reason in ``malformed``, so it can still be found and deleted."""
    row: dict[str, Any] = {
        "jid": entry.jid,
        "class": entry.klass,
        "queue": entry.queue,
        "at": entry.at.isoformat(timespec="seconds"),
        "score": entry.score,
        "args": entry.args,
    }
    if kind.errors:
        row["retry_count"] = entry.retry_count
        row["error_class"] = entry.error_class
        row["error_message"] = entry.error_message
    row["malformed"] = entry.parse_error
    return row


def _targets(args: argparse.Namespace) -> list[str]:
    """The jids to act on, each once, in the order given; exactly one of jids and
    ``--all``, since an empty list must not silently mean "nothing" or "everything"."""
    if args.all and args.jids:
        raise UsageError("give job ids or --all, not both")
    if not args.all and not args.jids:
        raise UsageError("give at least one job id, or --all")
    return list(dict.fromkeys(args.jids))


def _each_jid(
    zset: SortedSet[Any],
    kind: SetKind,
    jids: list[str],
    verb: str,
    act: Callable[[SortedEntry], bool],
) -> int:
    """Apply ``act`` to the entry of each jid. An entry found but gone before ``act``
    (a poller or another operator moved it) counts as not found."""
    count, missing = 0, 0
    for jid in jids:
        entry = zset.find_job(jid)
        if entry is not None and act(entry):
            count += 1
            continue
        missing += 1
        message = f"no job with jid {jid} in the {kind.label}"
        print(f"limitd {kind.command} {verb}: {message}", file=sys.stderr)
    print(f"{PAST[verb]} {_jobs(count)} from the {kind.label}")
    return EX_NOT_FOUND if missing else EX_OK


def _report_leftovers(zset: SortedSet[Any], kind: SetKind) -> None:
    """``retry_all`` leaves malformed entries (no server could run them): say so, as
    the set is not empty afterwards."""
    left = sum(1 for entry in zset if entry.payload is None)
    if left:
        print(
            f"limitd {kind.command} retry: {left} malformed entries stay in the "
            f"{kind.label} (no server could run them); `limitd {kind.command} list` "
            "shows them",
            file=sys.stderr,
        )


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _headers(kind: SetKind) -> list[str]:
    errors = ["RETRIES", "ERROR"] if kind.errors else []
    return ["JID", "CLASS", "QUEUE", "AT", *errors, "ARGS"]


def _cells(row: dict[str, Any], kind: SetKind) -> list[object]:
    klass = row["class"] if row["malformed"] is None else "(malformed)"
    cells: list[object] = [row["jid"], klass, row["queue"], row["at"]]
    if kind.errors:
        error = ": ".join(part for part in (row["error_class"], row["error_message"]) if part)
        cells += [row["retry_count"], table.truncate(error, ERROR_WIDTH) or None]
    args = json.dumps(row["args"], ensure_ascii=False)
    return [*cells, table.truncate(args, ARGS_WIDTH)]
