"""limitd fair: see and steer fair queues.

    limitd fair status QUEUE [--top N] [--json]   jobs and tenants waiting, largest tenants
    limitd fair on QUEUE [--tenant-limit N]        make it fair now
    limitd fair off QUEUE                          make it plain; its tenants' jobs go back
    limitd fair weight QUEUE TENANT WEIGHT         a tenant's turns per round
    limitd fair reset QUEUE                        back to the configured setting
"""

from __future__ import annotations

import argparse
import json

from limitd.commands import table
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Subparsers,
    UsageError,
    add_json_flag,
    bind,
    parse_count,
)
from limitd.fair_queues import admin

HEADERS = ("TENANT", "WAITING", "RUNNING")


def add_fair_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "fair",
        help="fair queues: tenants served in turn (status, on, off, weight, reset)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    status = actions.add_parser("status", help="jobs and tenants waiting, largest tenants")
    status.add_argument("queue")
    status.add_argument("--top", default="10", metavar="N", help="largest tenants shown (10)")
    add_json_flag(status)
    bind(status, run_status, resolve_redis)

    on = actions.add_parser("on", help="make the queue fair now")
    on.add_argument("queue")
    on.add_argument("--tenant-limit", metavar="N", help="jobs of one tenant running at once")
    bind(on, run_on, resolve_redis)

    off = actions.add_parser("off", help="make the queue plain; its tenants' jobs go back")
    off.add_argument("queue")
    bind(off, run_off, resolve_redis)

    weight = actions.add_parser("weight", help="a tenant's turns per round (default 1)")
    weight.add_argument("queue")
    weight.add_argument("tenant")
    weight.add_argument("weight")
    bind(weight, run_weight, resolve_redis)

    reset = actions.add_parser("reset", help="forget the run-time setting (config applies)")
    reset.add_argument("queue")
    bind(reset, run_reset, resolve_redis)


def run_status(args: argparse.Namespace, connect: Connect) -> int:
    top = parse_count(args.top, "--top", minimum=1)
    found = admin.fair_queue_status(args.queue, top=top, redis=connect())
    if found is None:
        raise UsageError(f"queue {args.queue!r} is not fair (limitd fair on {args.queue})")
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
        return EX_OK
    limit = found.tenant_limit if found.tenant_limit is not None else "none"
    print(
        f"{found.queue}: {found.jobs_waiting} jobs waiting in {found.tenants_waiting} "
        f"tenants' lines, {found.arrivals} not sorted yet; tenant limit {limit}"
    )
    rows = [[load.tenant, load.waiting, load.running] for load in found.largest]
    if rows:
        print(table.render(HEADERS, rows))
    if not found.largest_exact:
        print("(many tenants drained since the last status: the largest of those read so far)")
    return EX_OK


def run_on(args: argparse.Namespace, connect: Connect) -> int:
    limit = None
    if args.tenant_limit is not None:
        limit = parse_count(args.tenant_limit, "--tenant-limit", minimum=1)
    admin.make_fair(args.queue, tenant_limit=limit, redis=connect())
    print(f"{args.queue}: fair" + (f", at most {limit} jobs per tenant at once" if limit else ""))
    return EX_OK


def run_off(args: argparse.Namespace, connect: Connect) -> int:
    moved = admin.make_plain(args.queue, redis=connect())
    print(f"{args.queue}: plain; {moved} jobs moved back from the tenants' lines")
    return EX_OK


def run_weight(args: argparse.Namespace, connect: Connect) -> int:
    weight = parse_count(args.weight, "WEIGHT", minimum=1)
    admin.set_tenant_weight(args.queue, args.tenant, weight, redis=connect())
    print(f"{args.queue}: tenant {args.tenant!r} takes {weight} turns per round")
    return EX_OK


def run_reset(args: argparse.Namespace, connect: Connect) -> int:
    admin.reset_fairness(args.queue, redis=connect())
    print(f"{args.queue}: the configured setting applies again")
    return EX_OK
