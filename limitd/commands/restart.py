"""``limitd restart IDENTITY``: a rolling restart of the supervisor that runs a process.

The request travels as the dashboard's Quiet and Stop do (``Processes.restart``): it
waits in Redis for the named process's next record write (within 5 s), and the process
passes it to its supervisor as USR2, so it works from any host that reaches Redis. The
supervisor then replaces every process it runs, one at a time, with one that imports the
app anew (see ``limitd.supervisor.rolling``). Name one process per supervisor: a second
request that reaches a supervisor while it rolls is ignored. On the supervisor's own
host, ``kill -USR2 PID`` does the same at once.
"""

from __future__ import annotations

import argparse
import sys

from limitd.api import Processes
from limitd.commands.common import EX_NOT_FOUND, EX_OK, Connect, ResolveRedis, Subparsers, bind


def add_restart_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser(
        "restart",
        help="rolling restart of the supervisor running a process",
        description=(
            "Ask the supervisor that runs the process IDENTITY (see 'limitd status') for "
            "a rolling restart, as USR2 to it would: it replaces each of its worker "
            "processes, one at a time, with one that imports the app's code anew, and "
            "stops the roll, keeping the old processes, if a new one fails to start. "
            "The process picks the request up within 5 s. Exits 1 if no live process "
            "has that identity."
        ),
    )
    parser.add_argument("identity", help="a process identity, as 'limitd status' lists it")
    bind(parser, run_restart, resolve_redis)


def run_restart(args: argparse.Namespace, connect: Connect) -> int:
    if not Processes(connect()).restart(args.identity):
        print(f"limitd restart: no live process {args.identity}", file=sys.stderr)
        return EX_NOT_FOUND
    print(f"rolling restart requested from the supervisor of {args.identity}")
    return EX_OK
