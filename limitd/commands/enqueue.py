"""``limitd enqueue JOB [ARGS_JSON]``: push one job by its wire name, for trying things
and for scripts. The job's options apply when its module is given with ``-r``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from limitd.client import Client
from limitd.commands.common import EX_UNAVAILABLE, EX_USAGE, ResolveRedis, Subparsers
from limitd.supervisor.capsule import import_app


def add_enqueue_command(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    enqueue = subparsers.add_parser(
        "enqueue", help="push one job", description=__doc__.splitlines()[0]
    )
    enqueue.add_argument("job", help="the job's wire name, e.g. examples.demo.greet")
    enqueue.add_argument("args", nargs="?", default="[]", help="JSON list of arguments")
    enqueue.add_argument("--queue", help="queue (default: the job's, else 'default')")
    enqueue.add_argument(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining the job, for its options (repeatable)",
    )
    enqueue.set_defaults(command=lambda args: cmd_enqueue(args, resolve_redis))


def cmd_enqueue(args: argparse.Namespace, resolve_redis: ResolveRedis) -> int:
    try:
        job_args = json.loads(args.args)
    except ValueError as exc:
        print(f"limitd enqueue: ARGS must be a JSON list: {exc}", file=sys.stderr)
        return EX_USAGE
    if not isinstance(job_args, list):
        print("limitd enqueue: ARGS must be a JSON list, e.g. '[1, \"a\"]'", file=sys.stderr)
        return EX_USAGE
    sys.path.insert(0, os.getcwd())
    import_app(args.require)
    redis = resolve_redis(args)
    if redis is None:
        print(
            "limitd enqueue: no Redis configured (--redis, -C CONFIG or LIMITD_REDIS_URL) "
            "and no embedded Redis running",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    item = {"class": args.job, "args": job_args}
    if args.queue:
        item["queue"] = args.queue
    print(Client(redis).push(item))
    return 0
