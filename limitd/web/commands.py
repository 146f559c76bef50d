"""``limitd web [CONFIG...] [--bind 127.0.0.1] [--port 9292] [--auth USER:PASSWORD]``: the
dashboard (``limitd.web``) served by uvicorn.

Its Redis is found as every admin command finds it. It listens on loopback unless told
otherwise, and refuses to listen anywhere else without credentials (``--auth``, or
``--auth-env VAR`` naming a variable that holds ``USER:PASSWORD``, so the password stays
out of ``ps``): job arguments and the power to delete jobs are not for the network at
large. It says at start where it listens and whether it asks for a password.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import sys
from collections.abc import Iterator

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
from limitd.locate import named_config
from limitd.web.credentials import Credentials

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = "9292"
HIGHEST_PORT = 65535

DESCRIPTION = (
    "Serve the dashboard on http://BIND:PORT/: queues, limits, busy processes, retries, "
    "scheduled and dead jobs, batches, tenants, limiters, periodic and limited-capacity "
    "jobs, live, with the actions the CLI has. Needs the web extra (pip install "
    "'limitd[web]'). Listening beyond loopback requires --auth or --auth-env."
)


def add_web_command(commands: Subparsers, resolve_redis: ResolveRedis) -> None:
    parser = commands.add_parser("web", help="serve the web dashboard", description=DESCRIPTION)
    parser.add_argument(
        "files",
        nargs="*",
        metavar="CONFIG",
        help="config files naming the Redis (after any -C files), as for 'limitd start'",
    )
    parser.add_argument("--port", default=DEFAULT_PORT, help=f"TCP port ({DEFAULT_PORT})")
    parser.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="ADDRESS",
        help=f"address to listen on ({DEFAULT_BIND}; others need --auth)",
    )
    parser.add_argument(
        "--auth", metavar="USER:PASSWORD", help="ask every request for this user and password"
    )
    parser.add_argument(
        "--auth-env", metavar="VAR", help="the same, read from the environment variable VAR"
    )
    bind(parser, run_web, resolve_redis)


def run_web(args: argparse.Namespace, connect: Connect) -> int:
    port = parse_count(args.port, "--port", minimum=1)
    if port > HIGHEST_PORT:
        raise UsageError(f"--port must be a TCP port from 1 to {HIGHEST_PORT}, got {port}")
    credentials = _credentials(args)
    if credentials is None and not _loopback(args.bind):
        raise UsageError(
            f"--bind {args.bind} listens beyond this machine: give --auth USER:PASSWORD or "
            "--auth-env VAR, or bind to 127.0.0.1"
        )
    try:
        import uvicorn

        from limitd.web.application import build
    except ImportError as exc:
        missing = f"the web extra is missing ({exc}): pip install 'limitd[web]'"
        return fail("limitd web", missing, EX_UNAVAILABLE)
    args.config = [*args.config, *args.files]  # where resolve_redis looks for files
    redis = connect()
    redis.ping()
    dashboard = build(redis, credentials=credentials, config=named_config(args.config))
    guarded = "asks for a user and password" if credentials else "no password (loopback only)"
    print(f"limitd web on http://{args.bind}:{port}/ ({guarded})", file=sys.stderr, flush=True)
    try:
        with _stop_signals_end_cleanly():
            uvicorn.run(dashboard, host=args.bind, port=port, log_level="warning")
    except OSError as exc:
        return fail("limitd web", f"cannot listen on {args.bind}:{port}: {exc}", EX_UNAVAILABLE)
    return EX_OK


@contextlib.contextmanager
def _stop_signals_end_cleanly() -> Iterator[None]:
    """uvicorn handles TERM and INT itself, shuts down gracefully, then raises the signal
    again under the handler it found. With the default handler the process would die of
    its own clean stop (status 143 for a service manager); with this one the re-raised
    signal is a no-op and the command returns 0, as ``limitd start`` does."""
    previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stopped(signum: int, frame: object) -> None:
    """The graceful stop already happened (see :func:`_stop_signals_end_cleanly`)."""


def _credentials(args: argparse.Namespace) -> Credentials | None:
    if args.auth and args.auth_env:
        raise UsageError("give --auth or --auth-env, not both")
    try:
        if args.auth:
            return Credentials.parse(args.auth, "--auth")
        if args.auth_env:
            value = os.environ.get(args.auth_env)
            if not value:
                raise UsageError(f"--auth-env {args.auth_env}: the variable is not set")
            return Credentials.parse(value, f"--auth-env {args.auth_env}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return None


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: may resolve anywhere
