"""``limitd metrics [CONFIG...] [--port 9191] [--bind 127.0.0.1]``: the Prometheus
exporter of the cluster's state (``limitd.metrics.exporter``).

Its Redis is found as every admin command finds it (``--redis``, the environment, the
config files, a running embedded Redis); config files may be given after the command
like ``limitd start``'s, or with ``-C``. Redis is pinged before the port opens, so a
wrong address exits at once (69) instead of serving empty scrapes.
"""

from __future__ import annotations

import argparse

from limitd.commands.common import (
    EX_OK,
    EX_UNAVAILABLE,
    Connect,
    ResolveRedis,
    Subparsers,
    UsageError,
    bind,
    fail,
    parse_count,
)
from limitd.metrics.section import DEFAULT_BIND, HIGHEST_PORT

DEFAULT_PORT = "9191"

DESCRIPTION = (
    "Serve the cluster's state to Prometheus on http://BIND:PORT/metrics: per queue its "
    "size, latency, busy jobs, limits and pause flag; the processed and failed counters; "
    "the retry, scheduled and dead set sizes; live processes and their busy threads; "
    "and each feature's figures. Everything is read from Redis at each scrape, so run one "
    "exporter per cluster, not one per supervisor. Stops on INT or TERM."
)


def add_metrics_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "metrics", help="serve cluster metrics to Prometheus", description=DESCRIPTION
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="CONFIG",
        help="config files naming the Redis (after any -C files), as for 'limitd start'",
    )
    parser.add_argument(
        "--port", default=DEFAULT_PORT, help=f"TCP port to serve on ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="ADDRESS",
        help=f"address to listen on ({DEFAULT_BIND}; 0.0.0.0 for every interface)",
    )
    bind(parser, run_metrics, resolve_redis)


def run_metrics(args: argparse.Namespace, connect: Connect) -> int:
    from limitd.metrics.exporter import serve  # prometheus-client: only for this command

    port = parse_count(args.port, "--port", minimum=1)
    if port > HIGHEST_PORT:
        raise UsageError(f"--port must be a TCP port from 1 to {HIGHEST_PORT}, got {port}")
    args.config = [*args.config, *args.files]  # where resolve_redis looks for files
    redis = connect()
    redis.ping()
    try:
        serve(redis, args.bind, port)
    except OSError as exc:
        return fail("limitd metrics", f"cannot listen on {args.bind}:{port}: {exc}", EX_UNAVAILABLE)
    return EX_OK
