"""``limitd enqueue JOB [ARGS_JSON]``: push one job by its wire name, for trying things
and for scripts.

The name is checked against the jobs that the config's ``require`` modules (``-C``, else
``LIMITD_CONFIG``) and ``-r`` modules define, and the job's own options apply: a typo
would otherwise return a jid for a job no worker can run. ``--force`` pushes a name
nobody here defines, for jobs that only another language's workers (Ruby Sidekiq) run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from limitd.client import Client
from limitd.commands.common import EX_UNAVAILABLE, EX_USAGE, ResolveRedis, Subparsers
from limitd.config import app_modules
from limitd.locate import named_config
from limitd.middleware.defaults import default_client_chain
from limitd.registry import import_app, registry


def add_enqueue_command(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    enqueue = subparsers.add_parser(
        "enqueue",
        help="push one job",
        description=(
            "Push one job by its wire name, for trying things and for scripts. The name "
            "must be a job that the config's require modules (-C, else LIMITD_CONFIG) or "
            "-r modules define, whose options then apply; otherwise exit 64 listing the "
            "jobs that exist, unless --force."
        ),
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
        help="module defining the job, besides the config's require (repeatable)",
    )
    enqueue.add_argument(
        "--force",
        action="store_true",
        help="push even if no module here defines the job (for other languages' workers)",
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
    try:
        modules = import_jobs(args)
    except ImportError as exc:
        print(f"limitd enqueue: {exc}", file=sys.stderr)
        return EX_USAGE
    if registry.resolve(args.job) is None and not args.force:
        print(f"limitd enqueue: {unknown_job(args.job, modules)}", file=sys.stderr)
        return EX_USAGE
    redis = resolve_redis(args)
    if redis is None:
        print(
            "limitd enqueue: no Redis configured (--redis, LIMITD_REDIS_URL, -C CONFIG or "
            "LIMITD_CONFIG) and no embedded Redis running here or in conf/",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    item = {"class": args.job, "args": job_args}
    if args.queue:
        item["queue"] = args.queue
    return push(args, redis, item)


def push(args: argparse.Namespace, redis: Any, item: dict[str, Any]) -> int:
    """Push through a client with the config's feature settings, as the app's own has
    them (the encryption keys of an ``encrypt`` job, tenant fairness...)."""
    config = named_config(args.config)
    client = Client(redis, middleware=default_client_chain(config.sections if config else None))
    try:
        print(client.push(item))
    except (ValueError, TypeError) as exc:  # a missing key, an argument JSON cannot carry
        print(f"limitd enqueue: {exc}", file=sys.stderr)
        return EX_USAGE
    return 0


def import_jobs(args: argparse.Namespace) -> list[str]:
    """Import the config's ``require`` modules and the ``-r`` ones; return their names."""
    sys.path.insert(0, os.getcwd())
    config = named_config(args.config)
    modules = [*(app_modules(config) if config is not None else []), *args.require]
    import_app(modules)
    return list(dict.fromkeys(modules))


def unknown_job(name: str, modules: list[str]) -> str:
    force = "--force pushes it anyway (for a job only another language's workers run)"
    if not modules:
        return (
            f"no job named {name!r}: no job modules imported (give -C CONFIG, set "
            f"LIMITD_CONFIG or add -r MODULE); {force}"
        )
    known = ", ".join(registry.names()) or "none"
    return f"no job named {name!r} in {', '.join(modules)}; jobs defined there: {known}; {force}"
