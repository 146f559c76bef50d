"""The ``limitd`` command line: run workers, enqueue, inspect and steer.

``limitd start`` runs one capsule in the foreground; ``limitd enqueue`` pushes a job.
Without a configured Redis (``--redis``, ``LIMITD_REDIS_URL`` or ``REDIS_URL``),
``start`` runs a private redis-server with its data in ``./.limitd/`` and writes its
address to ``./.limitd/redis.url``, where ``enqueue`` finds it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import redis as redis_py

from limitd import __version__
from limitd.client import Client, set_default_client
from limitd.commands import add_admin_commands
from limitd.config import CapsuleConfig, CapsuleSpec
from limitd.embedded import RedisServer
from limitd.redis import configured_url, connect
from limitd.supervisor.capsule import Capsule, import_app
from limitd.supervisor.launcher import Launcher
from limitd.supervisor.supervisor import Supervisor

EMBEDDED_DIR = Path(".limitd")
EMBEDDED_URL_FILE = EMBEDDED_DIR / "redis.url"
MAX_SOCKET_PATH = 100  # unix socket paths are limited to ~107 bytes
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_CONFIG = 78

log = logging.getLogger("limitd.cli")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s pid=%(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.command(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="limitd", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"limitd {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL (default: LIMITD_REDIS_URL, REDIS_URL, else the embedded Redis)",
    )
    commands = parser.add_subparsers(title="commands", required=True)

    start = commands.add_parser("start", help="run a capsule of worker threads")
    start.add_argument(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining jobs (repeatable)",
    )
    start.add_argument(
        "-q",
        "--queue",
        action="append",
        metavar="NAME[,WEIGHT]",
        help="queue to fetch, in order, optionally weighted (repeatable; default: default)",
    )
    start.add_argument("-c", "--concurrency", type=int, default=10, help="threads (10)")
    start.add_argument(
        "-t",
        "--timeout",
        type=float,
        default=25.0,
        help="seconds to finish jobs on TERM before requeueing them (25)",
    )
    start.add_argument("--tag", default="", help="label shown in process lists")
    start.add_argument(
        "-p",
        "--processes",
        type=int,
        default=1,
        help="capsule processes to fork, each with its own threads (1)",
    )
    start.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in all processes (repeatable)",
    )
    start.add_argument(
        "--process-limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in each process (repeatable)",
    )
    start.add_argument(
        "--blocking",
        action="append",
        default=[],
        metavar="QUEUE",
        help="QUEUE at its limit with jobs waiting holds back later queues",
    )
    start.add_argument(
        "--dynamic",
        action="store_true",
        help="also fetch queues that exist in Redis but are not listed",
    )
    start.add_argument(
        "--heartbeat-period",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="liveness beat; a silent capsule is reaped after 4 periods (15)",
    )
    start.add_argument(
        "--fetch",
        choices=("limit", "basic"),
        default="limit",
        help="limit-aware reliable fetch (default) or plain BRPOP",
    )
    start.set_defaults(command=cmd_start)

    enqueue = commands.add_parser("enqueue", help="push one job")
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
    enqueue.set_defaults(command=cmd_enqueue)
    add_admin_commands(commands, resolve_redis)
    return parser


def resolve_redis(args: argparse.Namespace) -> redis_py.Redis | None:
    """The Redis an inspection command talks to: ``--redis``, the environment, or the
    embedded Redis a ``limitd start`` in this directory runs; None if there is none."""
    url = configured_url(args.redis) or embedded_url()
    return connect(url) if url else None


def cmd_start(args: argparse.Namespace) -> int:
    sys.path.insert(0, os.getcwd())
    try:
        import_app(args.require)
        config = capsule_config(args)
    except (ImportError, ValueError) as exc:
        print(f"limitd: {exc}", file=sys.stderr)
        return EX_CONFIG
    url = configured_url(args.redis)
    server = None if url else start_embedded_redis()
    url = url or server.url  # type: ignore[union-attr]
    try:
        supervisor = Supervisor(
            [CapsuleSpec(config, args.processes)],
            connect(url),
            lambda child_config: run_capsule(child_config, url),
            tag=args.tag,
        )
        return supervisor.run()
    finally:
        if server is not None:
            server.stop()
            EMBEDDED_URL_FILE.unlink(missing_ok=True)


def capsule_config(args: argparse.Namespace) -> CapsuleConfig:
    if args.processes < 1:
        raise ValueError(f"--processes must be >= 1, got {args.processes}")
    return CapsuleConfig(
        queues=args.queue or ["default"],
        concurrency=args.concurrency,
        timeout=args.timeout,
        tag=args.tag,
        fetch=args.fetch,
        limits=parse_limits(args.limit, "--limit"),
        process_limits=parse_limits(args.process_limit, "--process-limit"),
        blocking=args.blocking,
        dynamic=args.dynamic,
        heartbeat_period=args.heartbeat_period,
    )


def parse_limits(values: list[str], flag: str) -> dict[str, int]:
    limits: dict[str, int] = {}
    for value in values:
        queue, sep, number = value.partition("=")
        if not sep or not queue or not number.strip().isdigit():
            raise ValueError(f"{flag} {value!r}: expected QUEUE=N with N an integer >= 0")
        limits[queue] = int(number)
    return limits


def run_capsule(config: CapsuleConfig, url: str) -> int:
    """A supervisor's child: its own connections (never the parent's), one capsule."""
    redis = connect(url, max_connections=config.concurrency + 8)
    set_default_client(Client(redis))  # jobs that enqueue jobs use the same Redis
    return Launcher(Capsule(config, redis=redis), titles=True).run()


def cmd_enqueue(args: argparse.Namespace) -> int:
    sys.path.insert(0, os.getcwd())
    import_app(args.require)
    try:
        job_args = json.loads(args.args)
    except ValueError as exc:
        print(f"limitd enqueue: ARGS must be a JSON list: {exc}", file=sys.stderr)
        return EX_USAGE
    if not isinstance(job_args, list):
        print("limitd enqueue: ARGS must be a JSON list, e.g. '[1, \"a\"]'", file=sys.stderr)
        return EX_USAGE
    url = configured_url(args.redis) or embedded_url()
    if url is None:
        print(
            "limitd enqueue: no Redis configured (--redis or LIMITD_REDIS_URL) and no "
            f"embedded Redis running ({EMBEDDED_URL_FILE} not found)",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    item = {"class": args.job, "args": job_args}
    if args.queue:
        item["queue"] = args.queue
    print(Client(connect(url)).push(item))
    return 0


def start_embedded_redis() -> RedisServer:
    """A private, persistent redis-server for this directory (append-only file on)."""
    EMBEDDED_DIR.mkdir(exist_ok=True)
    data_dir = EMBEDDED_DIR.resolve()
    socket_path = data_dir / "redis.sock"
    use_socket = len(str(socket_path)) <= MAX_SOCKET_PATH
    server = RedisServer(
        unix_socket=str(socket_path) if use_socket else None,
        data_dir=str(data_dir),
        appendonly=True,
    )
    server.start()
    EMBEDDED_URL_FILE.write_text(server.url + "\n")
    log.info("embedded redis-server running at %s (data in %s)", server.url, data_dir)
    return server


def embedded_url() -> str | None:
    if EMBEDDED_URL_FILE.exists():
        return EMBEDDED_URL_FILE.read_text().strip() or None
    return None


if __name__ == "__main__":
    sys.exit(main())
