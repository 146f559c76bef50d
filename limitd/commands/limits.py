"""``limitd limit set|clear|reset|rate`` and ``limitd pause|resume``: steer queues at run
time.

Everything goes through ``limitd.api.Queue``, which stores limits and the pause flag
where the limit fetcher reads them, so running processes follow at their next fetch
without a restart. ``clear`` (unlimited, even where configuration sets a limit) and
``reset`` (back to the configured value at the next heartbeat) differ on purpose: see
``limitd.fetch.limits``. ``limit rate QUEUE [RATE | --clear | --reset]`` does the same
for a rate limit, whose value is not a count (hence one action of its own, with the same
clear / reset meanings as flags); without a change it shows the rate in force.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from limitd.api import Queue
from limitd.commands.common import (
    EX_OK,
    Connect,
    ResolveRedis,
    Run,
    Subparsers,
    UsageError,
    bind,
    check_queue,
    parse_count,
)
from limitd.queues.rates import Rate, parse_rate

PROCESS_HELP = "the limit within each process (default: the limit across all processes)"
CLEAR_DESCRIPTION = (
    "Make QUEUE unlimited, and keep it so even where configuration sets a limit "
    "(until 'limit set' or 'limit reset')."
)
RESET_DESCRIPTION = (
    "Forget run-time changes to QUEUE's limit: the configured value (if any) comes "
    "back at the next process heartbeat, else the queue is unlimited."
)


def add_limit_commands(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    limit = commands.add_parser(
        "limit",
        help="set, clear or reset a queue's limit or rate limit",
        description=(
            "Change how many jobs of a queue may run at once. Running processes apply "
            "the change at their next fetch."
        ),
    )
    actions = limit.add_subparsers(title="actions", required=True, metavar="ACTION")
    set_parser = actions.add_parser(
        "set", help="set a limit", description="Set QUEUE's limit to N (0 runs nothing)."
    )
    set_parser.add_argument("queue", metavar="QUEUE", help="queue name")
    set_parser.add_argument("n", metavar="N", help="jobs at once, an integer >= 0")
    _add_process_flag(set_parser)
    bind(set_parser, run_limit_set, resolve_redis)
    clear = actions.add_parser(
        "clear", help="make a queue unlimited", description=CLEAR_DESCRIPTION
    )
    _add_limit_action(clear, run_limit_clear, resolve_redis)
    reset = actions.add_parser(
        "reset", help="go back to the configured limit", description=RESET_DESCRIPTION
    )
    _add_limit_action(reset, run_limit_reset, resolve_redis)
    _add_rate_action(actions, resolve_redis)


def _add_rate_action(actions: Subparsers, resolve_redis: ResolveRedis) -> None:
    rate = actions.add_parser(
        "rate",
        help="show, set, clear or reset a queue's rate limit",
        description=(
            "Show QUEUE's rate limit, or set it to RATE: at most N jobs start in any "
            "window of the interval, across all processes, one every interval/N seconds "
            "(N/second, N/minute, N/hour, N/day or N/<seconds>s, N >= 1). Running "
            "processes apply it at their next fetch."
        ),
    )
    rate.add_argument("queue", metavar="QUEUE", help="queue name")
    rate.add_argument("rate", metavar="RATE", nargs="?", help="e.g. 100/minute or 10/30s")
    change = rate.add_mutually_exclusive_group()
    change.add_argument(
        "--clear",
        action="store_true",
        help="no rate limit, even where configuration sets one (until set or reset)",
    )
    change.add_argument(
        "--reset",
        action="store_true",
        help="forget run-time changes: the configured rate comes back at the next heartbeat",
    )
    bind(rate, run_limit_rate, resolve_redis)


def add_pause_commands(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    pause = commands.add_parser(
        "pause",
        help="stop fetching from queues",
        description=(
            "Stop starting jobs of each QUEUE: running jobs finish, new jobs keep "
            "arriving, limits are kept."
        ),
    )
    pause.add_argument("queues", nargs="+", metavar="QUEUE", help="queue name (repeatable)")
    bind(pause, run_pause, resolve_redis)
    resume = commands.add_parser(
        "resume",
        help="fetch from paused queues again",
        description="Start fetching from each QUEUE again, waking idle processes at once.",
    )
    resume.add_argument("queues", nargs="+", metavar="QUEUE", help="queue name (repeatable)")
    bind(resume, run_resume, resolve_redis)


def run_limit_set(args: argparse.Namespace, connect: Connect) -> int:
    queue_name, value = check_queue(args.queue), parse_count(args.n, "N")
    queue = Queue(queue_name, connect())
    if args.process:
        queue.process_limit = value
    else:
        queue.limit = value
    print(f"{_kind(args)} of queue {queue_name!r} set to {value}")
    return EX_OK


def run_limit_clear(args: argparse.Namespace, connect: Connect) -> int:
    queue_name = check_queue(args.queue)
    Queue(queue_name, connect()).clear_limit(process=args.process)
    print(f"{_kind(args)} of queue {queue_name!r} cleared: unlimited")
    return EX_OK


def run_limit_reset(args: argparse.Namespace, connect: Connect) -> int:
    queue_name = check_queue(args.queue)
    Queue(queue_name, connect()).reset_limit(process=args.process)
    print(
        f"{_kind(args)} of queue {queue_name!r} reset: the configured value applies "
        "from the next heartbeat"
    )
    return EX_OK


def run_limit_rate(args: argparse.Namespace, connect: Connect) -> int:
    queue_name = check_queue(args.queue)
    if args.rate is not None and (args.clear or args.reset):
        raise UsageError("give a RATE or --clear or --reset, not both")
    rate = _parse_rate(args.rate) if args.rate is not None else None
    queue = Queue(queue_name, connect())
    if rate is not None:
        queue.rate_limit = rate
        print(f"rate limit of queue {queue_name!r} set to {rate}")
    elif args.clear:
        queue.clear_rate_limit()
        print(f"rate limit of queue {queue_name!r} cleared: none")
    elif args.reset:
        queue.reset_rate_limit()
        print(
            f"rate limit of queue {queue_name!r} reset: the configured value applies "
            "from the next heartbeat"
        )
    else:
        current = queue.rate_limit
        print(f"rate limit of queue {queue_name!r}: {current if current else 'none'}")
    return EX_OK


def _parse_rate(text: str) -> Rate:
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise UsageError(f"RATE: {exc}") from None


def run_pause(args: argparse.Namespace, connect: Connect) -> int:
    return _for_each_queue(args, connect, Queue.pause, "paused")


def run_resume(args: argparse.Namespace, connect: Connect) -> int:
    return _for_each_queue(args, connect, Queue.resume, "resumed")


def _for_each_queue(
    args: argparse.Namespace, connect: Connect, action: Callable[[Queue], None], done: str
) -> int:
    names = [check_queue(name) for name in args.queues]
    redis = connect()
    for name in names:
        action(Queue(name, redis))
        print(f"queue {name!r} {done}")
    return EX_OK


def _add_limit_action(
    parser: argparse.ArgumentParser, run: Run, resolve_redis: ResolveRedis
) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="queue name")
    _add_process_flag(parser)
    bind(parser, run, resolve_redis)


def _add_process_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--process", action="store_true", help=PROCESS_HELP)


def _kind(args: argparse.Namespace) -> str:
    return "process limit" if args.process else "limit"
