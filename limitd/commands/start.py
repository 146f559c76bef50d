"""``limitd start [CONFIG...]`` and ``limitd check CONFIG...``.

``start`` loads and checks the configuration (files merged, then command-line flags on
top: queue flags shape the default capsule, timing flags every capsule), imports the
app once and checks it against the configuration (``limitd.config.app_checks``), starts an embedded
Redis beside the config when none is configured, and runs the supervisor until it is
stopped. Any configuration mistake exits 78 before anything starts, with one line naming
the file (or flag), the key and what was expected. ``check`` does the same checks, then
prints the effective configuration instead of starting.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis as redis_py
import yaml

from limitd import cluster, logs
from limitd.client import Client, set_default_client
from limitd.commands.common import EX_UNAVAILABLE, EX_USAGE, Subparsers
from limitd.config import (
    CapsuleConfig,
    CapsuleSpec,
    Config,
    ConfigError,
    RedisSettings,
    app_modules,
    check_app,
    config_as_dict,
    load_config,
)
from limitd.embedded import RedisServer, start_embedded, stop_embedded
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
from limitd.redis import URL_ENV_VARS, connect, masked, unreachable
from limitd.supervisor.capsule import Capsule, import_app
from limitd.supervisor.launcher import Launcher
from limitd.supervisor.supervisor import Supervisor

EX_CONFIG = 78
POOL_EXTRA = 6  # heartbeat, poller, wake-up listener, feature services, spares
COMMAND_LINE = "command line"

log = logging.getLogger("limitd.cli")

START_DESCRIPTION = (
    "Run jobs: read the config files (later files win, flags on top), import the app's "
    "job modules, check both, then run one worker process per capsule copy and restart "
    "any that dies. TERM or INT stops gracefully, TSTP stops fetching, TTIN dumps "
    "threads, HUP reopens the log file. A config mistake exits with status 78 and one "
    "line naming the file, the key and what was expected."
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
    _add_override_flags(start)
    _add_timing_flags(start)
    start.set_defaults(command=cmd_start)
    check = subparsers.add_parser(
        "check",
        help="validate config files and the app's jobs, print the result",
        description=CHECK_DESCRIPTION,
    )
    check.add_argument("files", nargs="*", metavar="CONFIG", help=FILES_HELP)
    check.set_defaults(command=cmd_check)


def _add_override_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape the default capsule."""
    add = parser.add_argument
    add(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining jobs (repeatable; added to the config's require)",
    )
    add(
        "-q",
        "--queue",
        action="append",
        metavar="NAME[,WEIGHT]",
        help="queue of the default capsule, in order, optionally weighted (repeatable)",
    )
    add("-c", "--concurrency", type=int, help="threads per process of the default capsule")
    add("-p", "--processes", type=int, help="processes of the default capsule")
    add(
        "--limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in all processes (repeatable)",
    )
    add(
        "--process-limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in each process (repeatable)",
    )
    add(
        "--blocking",
        action="append",
        default=[],
        metavar="QUEUE",
        help="QUEUE at its limit with jobs waiting holds back later queues",
    )
    add(
        "--dynamic",
        action="store_true",
        default=None,
        help="also fetch queues that exist in Redis but are not listed",
    )


def _add_timing_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that apply to every capsule."""
    add = parser.add_argument
    add("-t", "--timeout", type=float, help="seconds to finish jobs on TERM (every capsule)")
    add(
        "--heartbeat-period",
        type=float,
        metavar="SECONDS",
        help="liveness beat; a silent capsule is reaped after 4 periods (every capsule)",
    )
    add("--fetch", choices=("limit", "basic"), help="fetch strategy (every capsule)")
    add("--tag", help="label shown in process lists and titles")


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
    sys.path.insert(0, os.getcwd())
    try:
        config = apply_flags(load_config(given_files(args)), args)
        import_app(app_modules(config))
        check_app(config)
    except (ConfigError, ImportError) as exc:
        print(f"limitd start: {exc}", file=sys.stderr)
        return EX_CONFIG
    configure_logging(config, verbose=args.verbose)
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
        )
        return supervisor.run()
    finally:
        if server is not None:
            stop_embedded(server, config.base_dir)


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
) -> int:
    """A supervisor's child: its own connections (never the parent's), one capsule, and
    the features' services for this process (``limitd.plugins.ProcessContext``). Jobs
    that enqueue jobs use the same Redis and the config's feature settings
    (``sections``, e.g. ``fair_tenant``)."""
    redis = connect_for(settings, url, pool_for=config)
    set_default_client(Client(redis, middleware=default_client_chain(sections)))
    context = ProcessContext(redis, sections or {}, config, default_server_chain(redis))
    start_process_services(context)
    try:
        return Launcher(Capsule(config, redis=redis, middleware=context.chain), titles=True).run()
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


def apply_flags(config: Config, args: argparse.Namespace) -> Config:
    """Command-line flags on top of the files."""
    config.require = [*config.require, *args.require]
    if args.tag is not None:
        config.tag = args.tag
    specs = _default_capsule_first(config, args)
    queue_changes = _queue_flags(args)
    has_default = bool(specs) and specs[0].config.name == "default"
    if (queue_changes or args.processes is not None) and not has_default:
        raise ConfigError(
            COMMAND_LINE,
            "",
            "queue flags (-c, -p, --limit, ...) shape the "
            "default capsule, and this config has none: add -q QUEUE",
        )
    for index, spec in enumerate(specs):
        changes = _timing_flags(args, tag=config.tag)
        if index == 0 and has_default:
            changes.update(queue_changes)
            if args.processes is not None:
                spec.processes = _positive(args.processes, "--processes")
        spec.config = _replace(spec.config, changes)
    config.capsules = specs
    return config


def _default_capsule_first(config: Config, args: argparse.Namespace) -> list[CapsuleSpec]:
    specs = list(config.capsules)
    if args.queue and not any(spec.config.name == "default" for spec in specs):
        specs.insert(0, CapsuleSpec(CapsuleConfig(queues=args.queue)))
    specs.sort(key=lambda spec: spec.config.name != "default")
    return specs


def _timing_flags(args: argparse.Namespace, *, tag: str) -> dict[str, object]:
    changes: dict[str, object] = {"tag": tag}
    for flag in ("timeout", "heartbeat_period", "fetch"):
        if getattr(args, flag) is not None:
            changes[flag] = getattr(args, flag)
    return changes


def _queue_flags(args: argparse.Namespace) -> dict[str, object]:
    changes: dict[str, object] = {}
    if args.queue:
        changes["queues"] = args.queue
    if args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    if args.dynamic:
        changes["dynamic"] = True
    if args.blocking:
        changes["blocking"] = args.blocking
    if args.limit:
        changes["limits"] = parse_limits(args.limit, "--limit")
    if args.process_limit:
        changes["process_limits"] = parse_limits(args.process_limit, "--process-limit")
    return changes


def _replace(config: CapsuleConfig, changes: dict[str, object]) -> CapsuleConfig:
    try:
        return dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(COMMAND_LINE, "", str(exc)) from exc


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(COMMAND_LINE, flag, f"expected an integer >= 1, got {value}")
    return value


def parse_limits(values: list[str], flag: str) -> dict[str, int]:
    limits: dict[str, int] = {}
    for value in values:
        queue, sep, number = value.partition("=")
        if not sep or not queue or not number.strip().isdigit():
            raise ConfigError(
                COMMAND_LINE, flag, f"{value!r}: expected QUEUE=N with N an integer >= 0"
            )
        limits[queue] = int(number)
    return limits


def configure_logging(config: Config, *, verbose: bool = False) -> None:
    """The ``logging`` section, set up once here before the supervisor forks: its children
    inherit the handler, its format and the job filter (see ``limitd.logs``). ``limitd
    -v start`` lowers the root level to DEBUG, as a flag overrides the files."""
    settings = config.logging
    if verbose:
        settings = dataclasses.replace(settings, level="DEBUG")
    logs.configure(settings)
