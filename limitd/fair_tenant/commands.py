"""``limitd tenants``: the tenants tenant fairness tracks, busiest first.

"Who is crowding the queues, and is fairness acting on them?": per tenant and job, the
enqueues in each rule's window, the rule an enqueue made now would be routed by, and
how many jobs were rerouted so far, per queue. The rows come from ``top_tenants`` (three
round trips whatever the number of tenants). The enqueues sets are named by the
``fair_tenant`` settings of the files given with ``-C`` (under the
``LIMITD_FAIR_TENANT_*`` variables); ``-r`` imports the app, which the counts need when
``enqueues_key`` uses ``{queue}`` (see ``limitd.fair_tenant.admin``).
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
    import_app_modules,
    parse_count,
)
from limitd.config import load_config
from limitd.fair_tenant.admin import TenantStatus, top_tenants, window_label
from limitd.fair_tenant.section import KEY
from limitd.locate import named_config

HEADERS = ("TENANT", "JOB", "ENQUEUES", "RULE NOW", "REROUTED")
DEFAULT_LIMIT = "20"


def add_tenants_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "tenants",
        help="top tenants by recent enqueues, with the rule routing them now",
        description=(
            "List the tenants that enqueued jobs with fair_tenant_queues rules, most "
            "enqueues in the job's longest rule window first: enqueues in each rule's "
            "window (count/window), the queue an enqueue made now would be routed to "
            "(- for the job's own) and the jobs rerouted so far, per queue. --json prints "
            "a list of objects with fields job, tenant, last_enqueued_at, enqueues (a "
            "list of {queue, threshold, per, enqueues}), rule_now, rerouted."
        ),
    )
    parser.add_argument(
        "--limit", default=DEFAULT_LIMIT, metavar="N", help="show at most N tenants (20)"
    )
    parser.add_argument(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining the jobs, for their queues (repeatable)",
    )
    add_json_flag(parser)
    bind(parser, run_tenants, resolve_redis)


def run_tenants(args: argparse.Namespace, connect: Connect) -> int:
    limit = parse_count(args.limit, "--limit", minimum=1)
    import_app_modules(args.require)
    config = named_config(getattr(args, "config", None) or []) or load_config([])
    settings = config.section(KEY)
    rows = [tenant_row(status) for status in top_tenants(connect(), limit, settings=settings)]
    cells = [_cells(row) for row in rows]
    table.print_listing(args.json, rows, HEADERS, cells, "no tenants tracked")
    return EX_OK


def tenant_row(status: TenantStatus) -> dict[str, Any]:
    """One tenant as JSON: the ``TenantStatus`` fields, the time to milliseconds."""
    row = status.as_dict()
    row["last_enqueued_at"] = round(row["last_enqueued_at"], 3)
    return row


def _cells(row: dict[str, Any]) -> list[object]:
    """Text cells, "-" for none (None would align a column of them to the right)."""
    enqueues = " ".join(f"{w['enqueues']}/{window_label(w['per'])}" for w in row["enqueues"])
    rerouted = " ".join(f"{queue}={count}" for queue, count in row["rerouted"].items())
    return [row["tenant"], row["job"], enqueues or "-", row["rule_now"] or "-", rerouted or "-"]
