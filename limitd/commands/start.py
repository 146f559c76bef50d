"""``limitd start [CONFIG...]`` and ``limitd check CONFIG...``.

``start`` loads and checks the configuration (files merged, then command-line flags on
top: queue flags shape the default capsule, timing flags every capsule), imports the
app once and checks it against the configuration (``limitd.config.app_checks``), starts an embedded
Redis beside the config when none is configured, and runs the supervisor until it is
stopped. Its signal handlers are the first thing ``start`` sets up: a TERM that arrives
while it loads is never the default action, and makes it exit 0 with nothing started.
Any configuration mistake exits 78 before anything starts, with one line naming
the file (or flag), the key and what was expected. ``check`` does the same checks, then
prints the effective configuration instead of starting.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis as redis_py
import yaml

from limitd import logs
from limitd.client import Client, set_default_client
from limitd.commands.common import EX_UNAVAILABLE, EX_USAGE, Subparsers
from limitd.commands.start_flags import (
    CONFIG_FLAGS,
    add_override_flags,
    add_sidekiq_flags,
    add_timing_flags,
    apply_flags,
)
from limitd.config import (
    CapsuleConfig,
    Config,
    ConfigError,
    RedisSettings,
    app_modules,
    check_app,
    config_as_dict,
    load_config,
)
from limitd.connection import URL_ENV_VARS, cluster, connect, masked, unreachable
from limitd.connection.embedded import RedisServer, start_embedded, stop_embedded
from limitd.locate import (
    CONFIG_ENV,
    CONFIGURED,
    EMBEDDED,
    ENVIRONMENT,
    Location,
    config_files,
    locate,
)
from limitd.middleware.defaults import default_client_chain, default_server_chain
from limitd.plugins import ProcessContext, start_process_services, stop_process_services
from limitd.registry import import_app
from limitd.supervisor import cpu_affinity, cpu_scheduling
from limitd.supervisor.capsule import Capsule
from limitd.supervisor.launcher import Launcher
from limitd.supervisor.signals import SignalQueue
from limitd.supervisor.spawn import FreshStart, python_command
from limitd.supervisor.supervisor import HANDLED, Supervisor

EX_CONFIG = 78
POOL_EXTRA = 6  # heartbeat, poller, wake-up listener, feature services, spares

log = logging.getLogger("limitd.cli")

START_DESCRIPTION = (
    "Run jobs: read the config files (later files win, flags on top), import the app's "
    "job modules, check both, then run one worker process per capsule copy and restart "
    "any that dies. TERM, INT or QUIT stops gracefully, TSTP (or USR1) stops fetching, "
    "TTIN dumps threads, HUP reopens the log file, USR2 replaces the worker processes "
    "one at a time with ones that import the app anew (a rolling restart). A config "
    "mistake exits with status 78 and one line naming the file, the key and what was "
    "expected."
)
CHECK_DESCRIPTION = (
    "Read and check the config files and the app's jobs as 'limitd start' would, then "
    "print the effective configuration as YAML (the Redis password masked) instead of "
    "starting. A mistake exits with status 78."
)


FILES_HELP = (
    "YAML files, later ones override earlier; after any -C files ('limitd -C a.yml "
    "start b.yml' reads a.yml then b.yml); none: LIMITD_CONFIG's"
)


def add_start_commands(subparsers: Subparsers) -> None:
    start = subparsers.add_parser(
        "start", help="run the supervisor and its capsules", description=START_DESCRIPTION
    )
    start.add_argument("files", nargs="*", metavar="CONFIG", help=FILES_HELP)
    add_override_flags(start)
    add_timing_flags(start)
    add_sidekiq_flags(start)
    start.set_defaults(command=cmd_start)
    check = subparsers.add_parser(
        "check",
        help="validate config files and the app's jobs, print the result",
        description=CHECK_DESCRIPTION,
    )
    check.add_argument("files", nargs="*", metavar="CONFIG", help=FILES_HELP)
    check.set_defaults(command=cmd_check)


def given_files(args: argparse.Namespace) -> list[str]:
    """The config of ``start`` and ``check``: the ``-C`` files then the command's own,
    merged in that order, as every other command reads ``-C``; none given:
    ``LIMITD_CONFIG``'s."""
    return config_files([*getattr(args, "config", []), *args.files])


def cmd_check(args: argparse.Namespace) -> int:
    files = given_files(args)
    if not files:
        print(
            "limitd check: no config: give CONFIG files, -C CONFIG or LIMITD_CONFIG",
            file=sys.stderr,
        )
        return EX_USAGE
    sys.path.insert(0, os.getcwd())
    try:
        config = load_config(files)
        import_app(app_modules(config))
        check_app(config)
    except (ConfigError, ImportError) as exc:
        print(f"limitd check: {exc}", file=sys.stderr)
        return EX_CONFIG
    effective = config_as_dict(config)
    if effective.get("redis", {}).get("url"):
        effective["redis"]["url"] = masked(effective["redis"]["url"])
    print(yaml.safe_dump(effective, sort_keys=False), end="")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    # First of all: from here on a signal is recorded for the supervisor's loop, never
    # the default action (which for TERM would leave whatever start-up made behind).
    signals = SignalQueue()
    signals.install(HANDLED)
    sys.path.insert(0, os.getcwd())
    try:
        config = apply_flags(load_config(given_files(args)), args)
        import_app(app_modules(config))
        check_app(config)
    except (ConfigError, ImportError) as exc:
        print(f"limitd start: {exc}", file=sys.stderr)
        return EX_CONFIG
    configure_logging(config, verbose=args.verbose)
    if signals.stop_requested:
        log.info("stopped while starting: nothing started")
        return 0
    where, server = locate_for_start(config, args.redis)
    url = str(where.url)
    share_location(where, config.files)
    try:
        problem = unreachable(url, config.redis.connect_timeout)
        if problem is not None:
            print(f"limitd start: cannot reach Redis: {problem}", file=sys.stderr)
            return EX_UNAVAILABLE
        redis = connect_for(config.redis, url)
        try:
            cluster.check_layout(redis, cluster_mode=cluster.is_cluster(redis))
        except cluster.LayoutMismatch as exc:
            print(f"limitd start: {exc}", file=sys.stderr)
            return EX_CONFIG
        set_default_client(Client(redis, middleware=default_client_chain(config.sections)))
        supervisor = Supervisor(
            config.capsules,
            redis,
            lambda child: run_capsule(child, config.redis, url, config.sections),
            tag=config.tag,
            signals=signals,
            fresh=fresh_start(config, args, url),
        )
        return supervisor.run()
    finally:
        if server is not None:
            stop_embedded(server, config.base_dir)


def fresh_start(config: Config, args: argparse.Namespace, url: str) -> FreshStart:
    """How the supervisor starts a process that imports the app anew (rolling restart):
    it reads the same files and flags, and must find the same configuration."""
    return FreshStart(
        python_command("limitd.commands.fresh"),
        {
            "files": given_files(args),
            "flags": {flag: getattr(args, flag) for flag in CONFIG_FLAGS},
            "verbose": bool(args.verbose),
            "url": url,
            "digest": config_digest(config),
        },
    )


def config_digest(config: Config) -> str:
    """What tells the supervisor's configuration from one read later from the files."""
    text = json.dumps(config_as_dict(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def locate_for_start(config: Config, url: str | None) -> tuple[Location, RedisServer | None]:
    """The Redis of the order every entry point follows (``limitd.locate``); found
    nothing: an embedded Redis started beside the first file (or here), returned to be
    stopped at exit."""
    where = locate(url, config if config.files else None, os.getcwd())
    if where.url is not None:
        return where, None
    server = start_embedded(config.base_dir)
    log.info("embedded redis-server running at %s", server.url)
    return Location(server.url, EMBEDDED, "the embedded Redis", where.config), server


def share_location(where: Location, files: list[str]) -> None:
    """Make the children (and whatever their jobs start) find this Redis by the same
    order, and log the one line that makes the user's app find it too: the config's
    absolute paths when the Redis is the config's, else the URL."""
    if files:
        os.environ[CONFIG_ENV] = os.pathsep.join(str(Path(file).resolve()) for file in files)
    if files and where.step in (CONFIGURED, EMBEDDED):
        var, value = CONFIG_ENV, os.environ[CONFIG_ENV]
    elif where.step == ENVIRONMENT:
        var, value = where.source, masked(str(where.url))
    else:
        var, value = URL_ENV_VARS[0], masked(str(where.url))
        os.environ[var] = str(where.url)
    log.info("app code finds this Redis with: export %s=%s", var, shlex.quote(value))


def run_capsule(
    config: CapsuleConfig,
    settings: RedisSettings,
    url: str,
    sections: Mapping[str, Any] | None = None,
    ready: Callable[[], None] | None = None,
) -> int:
    """A supervisor's child: its own connections (never the parent's), one capsule, and
    the features' services for this process (``limitd.plugins.ProcessContext``). Jobs
    that enqueue jobs use the same Redis and the config's feature settings
    (``sections``, e.g. ``fair_tenant``). ``ready`` is called once the capsule runs."""
    cpu_scheduling.apply(config.cpu_scheduling)  # before any thread: they inherit it
    cpu_affinity.apply(config.cpu_affinity, config.process_number, config.process_count)
    redis = connect_for(settings, url, pool_for=config)
    set_default_client(Client(redis, middleware=default_client_chain(sections)))
    context = ProcessContext(redis, sections or {}, config, default_server_chain(redis))
    start_process_services(context)
    try:
        capsule = Capsule(config, redis=redis, middleware=context.chain)
        return Launcher(capsule, titles=True, ready=ready).run()
    finally:
        stop_process_services(context)


def connect_for(
    settings: RedisSettings, url: str, pool_for: CapsuleConfig | None = None
) -> redis_py.Redis:
    """A client with the configured timeouts. A capsule's pool needs a connection per
    thread plus the heartbeat, poller and wake-up listener: a smaller ``pool_size`` is
    raised to that, with a warning, rather than failing under load."""
    size = settings.pool_size
    if pool_for is not None:
        needed = pool_for.concurrency + POOL_EXTRA
        if size is not None and size < needed:
            log.warning(
                "redis.pool_size %d is below the %d connections capsule %s needs; using %d",
                size,
                needed,
                pool_for.name,
                needed,
            )
        size = max(size or 0, needed)
    return connect(
        url,
        max_connections=size,
        socket_timeout=settings.socket_timeout,
        connect_timeout=settings.connect_timeout,
        wait=settings.replica_wait,
    )


def configure_logging(config: Config, *, verbose: bool = False) -> None:
    """The ``logging`` section, set up once here before the supervisor forks: its children
    inherit the handler, its format and the job filter (see ``limitd.logs``). ``limitd
    -v start`` lowers the root level to DEBUG, as a flag overrides the files."""
    settings = config.logging
    if verbose:
        settings = dataclasses.replace(settings, level="DEBUG")
    logs.configure(settings)
