"""``limitd start conf/base.yml conf/prod.yml``: YAML files to one checked ``Config``.

The supervisor calls ``load_config`` before it starts anything, so every mistake in the
files stops the start with one line naming the file, the key path and what was
expected (a ``ConfigError``). ``files`` reads, merges and interpolates the files;
``values`` reads typed values; this module knows the schema.

The top level holds settings for everything (``redis``, ``logging``, ``fair_tenant``,
``require``, ``tag``), the settings of the *default capsule* (``queues``,
``concurrency``, ``limits``, ...), and ``capsules``: named capsules, each with settings
of its own.

- The default capsule exists when the top level lists ``queues``, or when there are no
  named capsules at all (it then fetches the queue ``default``). Its settings are the
  top-level ones, ``processes`` and ``max_memory_mb`` included. When it does not exist,
  a top-level setting that only it could use is an error, not silently ignored.
- A named capsule must list its own ``queues``; ``concurrency``, ``limits``,
  ``process_limits``, ``rate_limits``, ``blocking``, ``dynamic``, ``processes`` and
  ``max_memory_mb`` are its own too (defaults otherwise, never the top-level values).
  It inherits ``timeout``, ``heartbeat_period``, ``poll_range``, ``fetch``,
  ``scheduled_poll``, ``ready_index``, ``index_sweep``, ``cpu_scheduling``,
  ``cpu_affinity``, ``tag`` and ``dead`` (key by key) from the top level unless it
  sets them. Its ``require`` *adds* modules to the top-level
  list: the supervisor imports those before forking, so they cannot be taken away.
- ``LIMITD_REDIS_URL`` in the environment overrides ``redis.url``, and
  ``LIMITD_FAIR_TENANT_<KEY>`` the key of ``fair_tenant`` (checked the same way; a
  variable with that prefix that names no key is an error, like an unknown key).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from limitd.config.files import KeyPath, interpolate, merge_files
from limitd.config.settings import (
    ASYNC_LOOPS,
    CPU_SCHEDULINGS,
    FETCHES,
    SCHEDULED_POLLS,
    CapsuleConfig,
    CapsuleSpec,
    Config,
    ConfigError,
    LoggingSettings,
    RedisSettings,
)
from limitd.config.values import Section, as_int, describe
from limitd.connection import cluster, replication, sentinel
from limitd.plugins import sections
from limitd.queues.order import QueueOrder, QueueSpec
from limitd.retry import DeadSetPolicy

DAY = 86_400
DEFAULT_CAPSULE = "default"
REDIS_URL_ENV = "LIMITD_REDIS_URL"

OWN_KEYS = (
    "queues",
    "concurrency",
    "async_concurrency",
    "async_block_warning",
    "async_loop",
    "limits",
    "process_limits",
    "rate_limits",
    "blocking",
    "dynamic",
    "processes",
    "max_memory_mb",
)
SHARED_KEYS = (
    "timeout",
    "heartbeat_period",
    "poll_range",
    "fetch",
    "tag",
    "dead",
    "require",
    "scheduled_poll",
    "ready_index",
    "index_sweep",
    "cpu_scheduling",
    "cpu_affinity",
    "max_recoveries",
)
CAPSULE_KEYS = frozenset(OWN_KEYS + SHARED_KEYS)
BUILT_IN_TOP_KEYS = CAPSULE_KEYS | {"redis", "logging", "capsules"}
REDIS_KEYS = frozenset(
    {
        "url",
        "sentinels",
        "service",
        "db",
        "pool_size",
        "socket_timeout",
        "connect_timeout",
        "wait_replicas",
        "wait_timeout",
        "cluster",
        "startup_nodes",
    }
)
LOGGING_KEYS = frozenset({"level", "levels", "format", "file"})
LOG_FORMATS = ("text", "json")
DEAD_KEYS = frozenset({"max_jobs", "timeout_days"})
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", sentinel.SCHEME, cluster.SCHEME)
_HOST_PORT = re.compile(r"[^\s:,/]+:\d+")

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_CAPSULE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_LOGGER_NAME = re.compile(r"[\w.-]+")
_DEFAULTS = CapsuleConfig()  # one source for default values: CapsuleConfig's own


@dataclass(frozen=True)
class Shared:
    """The settings a named capsule inherits from the top level unless it sets them."""

    timeout: float = _DEFAULTS.timeout
    heartbeat_period: float = _DEFAULTS.heartbeat_period
    poll_range: tuple[float, float] = _DEFAULTS.poll_range
    fetch: str = _DEFAULTS.fetch
    tag: str = _DEFAULTS.tag
    dead: DeadSetPolicy = _DEFAULTS.dead_set
    require: tuple[str, ...] = ()
    max_recoveries: int = _DEFAULTS.max_recoveries
    scheduled_poll: str = _DEFAULTS.scheduled_poll
    ready_index: bool = _DEFAULTS.ready_index
    index_sweep: float = _DEFAULTS.index_sweep
    cpu_scheduling: str = _DEFAULTS.cpu_scheduling
    cpu_affinity: int | str | None = _DEFAULTS.cpu_affinity


def load_config(paths: Sequence[str | Path], env: Mapping[str, str] | None = None) -> Config:
    """Read, merge (later files win), interpolate from ``env`` (default: ``os.environ``)
    and check the files. No files: every default, one capsule on the queue ``default``."""
    env = os.environ if env is None else env
    layers = merge_files(paths)
    interpolate(layers, env)
    top = Section(layers.data, (), layers)
    owned = sections()
    top.check_keys(BUILT_IN_TOP_KEYS | {section.key for section in owned})
    shared = read_shared(top, Shared())
    return Config(
        files=list(layers.files),
        redis=read_redis(top.section("redis"), env),
        require=list(shared.require),
        tag=shared.tag,
        logging=read_logging(top.section("logging")),
        capsules=read_capsules(top, shared),
        sections={
            section.key: section.read(top.section(section.key, allow_list=section.list_form), env)
            for section in owned
        },
        base_dir=str(Path(layers.files[0]).parent) if layers.files else ".",
    )


def accepted_keys() -> dict[str, frozenset[str]]:
    """Every key the core schema accepts, by the dotted path of the mapping that holds
    it: ``""`` the top level (feature sections included, by their key), ``capsules.*``
    any named capsule, ``dead`` the dead-set mapping (top level or a capsule's). The
    keys inside a feature's section are that section's own (its reader checks them).
    For the configuration reference page and its test, which keep the page complete:
    nothing reads the files through this."""
    return {
        "": frozenset(BUILT_IN_TOP_KEYS | {section.key for section in sections()}),
        "capsules.*": CAPSULE_KEYS,
        "redis": REDIS_KEYS,
        "logging": LOGGING_KEYS,
        "dead": DEAD_KEYS,
    }


def read_shared(section: Section, base: Shared) -> Shared:
    """The inheritable settings of ``section``, falling back to ``base``'s."""
    return Shared(
        timeout=section.number("timeout", base.timeout, 0),
        heartbeat_period=section.number("heartbeat_period", base.heartbeat_period, 0, above=True),
        poll_range=section.poll_range("poll_range", base.poll_range),
        fetch=section.choice("fetch", FETCHES, base.fetch),
        scheduled_poll=section.choice("scheduled_poll", SCHEDULED_POLLS, base.scheduled_poll),
        ready_index=section.boolean("ready_index", base.ready_index),
        index_sweep=section.number("index_sweep", base.index_sweep, 0),
        cpu_scheduling=section.choice("cpu_scheduling", CPU_SCHEDULINGS, base.cpu_scheduling),
        cpu_affinity=read_cpu_affinity(section, base.cpu_affinity),
        tag=section.string("tag", base.tag),
        dead=read_dead(section.section("dead"), base.dead),
        max_recoveries=section.integer("max_recoveries", base.max_recoveries, 1),
        require=tuple(
            dict.fromkeys([*base.require, *section.names("require", "module name", _MODULE)])
        ),
    )


def read_cpu_affinity(section: Section, base: int | str | None) -> int | str | None:
    """``cpu_affinity``: CPUs per capsule process (an integer >= 1), ``auto`` (one CPU
    while it is the process's own), or ``none`` (the kernel places the threads; it undoes
    an inherited setting); absent: ``base``."""
    raw = section.data.get("cpu_affinity")
    if raw is None:
        return base
    if raw == "none":
        return None
    if raw == "auto":
        return "auto"
    found = as_int(raw)
    if found is None or found < 1:
        raise section.error(
            "cpu_affinity",
            f"expected auto, none or an integer >= 1 (CPUs per capsule process), "
            f"got {describe(raw)}",
        )
    return found


def _sentinel_url(section: Section) -> str | None:
    """``sentinels: [host:port, ...]`` with ``service`` (and ``db``) as a
    ``redis+sentinel://`` URL; None when no sentinels are named."""
    sentinels = section.names("sentinels", "sentinel address (host:port)", _HOST_PORT)
    service = section.optional_string("service")
    if not sentinels:
        for key in ("service", "db"):
            if section.data.get(key) is not None:
                raise section.error("sentinels", f"{key} is set: name the sentinels (host:port)")
        return None
    if section.optional_string("url") is not None:
        raise section.error("sentinels", "give url or sentinels, not both")
    if service is None:
        raise section.error("service", "expected the name Sentinel monitors the primary as")
    return sentinel.url_of(sentinels, service, section.integer("db", 0, 0))


def _cluster_url(section: Section) -> str | None:
    """``cluster: true`` with ``startup_nodes: [host:port, ...]`` as a
    ``redis+cluster://`` URL; None when ``cluster`` is not set."""
    nodes = section.names("startup_nodes", "cluster node address (host:port)", _HOST_PORT)
    if not section.boolean("cluster", False):
        if nodes:
            raise section.error("startup_nodes", "is set: set cluster: true too")
        return None
    if section.optional_string("url") is not None or section.given("sentinels"):
        raise section.error("cluster", "give url, sentinels or cluster, not two of them")
    if not nodes:
        raise section.error("startup_nodes", "expected the cluster's nodes as host:port")
    return cluster.url_of(nodes)


def read_dead(section: Section, base: DeadSetPolicy) -> DeadSetPolicy:
    section.check_keys(DEAD_KEYS)
    days = section.number("timeout_days", base.timeout_seconds / DAY, 0, above=True, unit="days")
    max_jobs = section.integer("max_jobs", base.max_jobs, 0)
    return DeadSetPolicy(timeout_seconds=days * DAY, max_jobs=max_jobs)


def read_redis(section: Section, env: Mapping[str, str]) -> RedisSettings:
    section.check_keys(REDIS_KEYS)
    url = section.optional_string("url")
    if url is not None and not url.startswith(REDIS_SCHEMES):
        raise section.error(
            "url", f"expected a URL starting with {' or '.join(REDIS_SCHEMES)}, got {url!r}"
        )
    if url is not None:
        try:
            bare = replication.split_url(url)[0]
            if bare.startswith(sentinel.SCHEME):
                sentinel.parse(bare)
            if bare.startswith(cluster.SCHEME):
                cluster.parse(bare)
        except ValueError as exc:
            raise section.error("url", str(exc)) from None
    url = _sentinel_url(section) or _cluster_url(section) or url
    if section.given("wait_replicas") and url is not None and url.startswith(cluster.SCHEME):
        raise section.error("wait_replicas", "is not available in cluster mode")
    if section.given("wait_timeout") and not section.given("wait_replicas"):
        raise section.error("wait_timeout", "is set: set wait_replicas too (at least 1)")
    defaults = RedisSettings()
    return RedisSettings(
        url=env.get(REDIS_URL_ENV) or url,
        pool_size=section.optional_integer("pool_size", 1),
        socket_timeout=section.number("socket_timeout", defaults.socket_timeout, 0, above=True),
        connect_timeout=section.number("connect_timeout", defaults.connect_timeout, 0, above=True),
        wait_replicas=section.optional_integer("wait_replicas", 1),
        wait_timeout=section.number("wait_timeout", defaults.wait_timeout, 0, above=True),
    )


def read_logging(section: Section) -> LoggingSettings:
    """``level`` for every logger, ``levels`` ({logger name: level}) for single ones,
    ``format`` (text or json) and ``file``. Levels are case-insensitive."""
    section.check_keys(LOGGING_KEYS)
    return LoggingSettings(
        level=_level(section, "level", LoggingSettings().level),
        file=section.optional_string("file"),
        format=section.choice("format", LOG_FORMATS, LoggingSettings().format),
        levels=_logger_levels(section.section("levels")),
    )


def _level(section: Section, key: str, default: str) -> str:
    level = section.string(key, default)
    if level.upper() not in LEVELS:
        raise section.error(key, f"expected one of {list(LEVELS)}, got {level!r}")
    return level.upper()


def _logger_levels(section: Section) -> dict[str, str]:
    """{logger name: level}; a logger whose level is null is left as it is."""
    for name in section.data:
        if not isinstance(name, str) or not _LOGGER_NAME.fullmatch(name):
            raise section.error(str(name), f"expected a logger name, got {describe(name)}")
    return {name: _level(section, name, "") for name in section.data if section.given(name)}


def read_capsules(top: Section, shared: Shared) -> list[CapsuleSpec]:
    """The default capsule (when it exists) first, then the named ones in file order."""
    named = top.section("capsules")
    specs = []
    if top.given("queues") or not named.data:
        if DEFAULT_CAPSULE in named.data:
            raise named.error(
                DEFAULT_CAPSULE,
                "the top-level queues already define the capsule 'default'; rename this "
                "capsule or move the top-level capsule settings into it",
            )
        specs.append(read_capsule(DEFAULT_CAPSULE, top, shared))
    else:
        for key in OWN_KEYS:
            if top.given(key):
                raise top.error(
                    key,
                    "is a setting of the default capsule, which exists only when the top "
                    "level lists queues (or there is no capsules section); set it in a capsule",
                )
    specs += [read_named_capsule(name, named, shared) for name in named.data]
    return specs


def read_named_capsule(name: str, capsules: Section, shared: Shared) -> CapsuleSpec:
    if not _CAPSULE_NAME.fullmatch(name):
        raise capsules.error(name, "expected a capsule name of letters, digits, '_', '-', '.'")
    if not isinstance(capsules.data[name], dict):
        raise capsules.error(
            name, f"expected a mapping of capsule settings, got {describe(capsules.data[name])}"
        )
    section = capsules.section(name)
    section.check_keys(CAPSULE_KEYS)
    if not section.given("queues"):
        raise section.error(
            "queues",
            "required: a named capsule lists its own queues (top-level ones are not inherited)",
        )
    return read_capsule(name, section, read_shared(section, shared))


def async_loop(section: Section) -> str:
    """``async_loop``: "asyncio", or "uvloop" when it is installed (the config names a
    loop this machine cannot make: said now, not when the first async job comes)."""
    chosen = section.choice("async_loop", ASYNC_LOOPS, "asyncio")
    if chosen == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise section.error(
            "async_loop", "uvloop is not installed here (pip install 'limitd[uvloop]')"
        )
    return chosen


def read_capsule(name: str, section: Section, shared: Shared) -> CapsuleSpec:
    """One capsule: its own settings from ``section``, the inherited ones from ``shared``."""
    queues = section.queues("queues") or list(_DEFAULTS.queues)
    limits = section.limits("limits")
    process_limits = section.limits("process_limits")
    rate_limits = section.rate_limits("rate_limits")
    blocking = section.names("blocking", "queue name")
    dynamic = section.boolean("dynamic", _DEFAULTS.dynamic)
    if not dynamic:
        check_listed(section, queues, limits, process_limits, blocking, rate_limits=rate_limits)
    concurrency = section.integer("concurrency", _DEFAULTS.concurrency, 1)
    with _translated(section):
        config = CapsuleConfig(
            name=name,
            queues=queues,
            concurrency=concurrency,
            async_concurrency=section.optional_integer("async_concurrency", 1),
            async_block_warning=section.number("async_block_warning", 1.0, 0, above=True),
            async_loop=async_loop(section),
            timeout=shared.timeout,
            require=list(shared.require),
            tag=shared.tag,
            limits=limits,
            process_limits=process_limits,
            rate_limits=rate_limits,
            blocking=blocking,
            dynamic=dynamic,
            fetch=shared.fetch,
            scheduled_poll=shared.scheduled_poll,
            ready_index=shared.ready_index,
            index_sweep=shared.index_sweep,
            cpu_scheduling=shared.cpu_scheduling,
            cpu_affinity=shared.cpu_affinity,
            heartbeat_period=shared.heartbeat_period,
            poll_range=shared.poll_range,
            dead_set=shared.dead,
            max_recoveries=shared.max_recoveries,
        )
    return CapsuleSpec(
        config,
        processes=section.integer("processes", 1, 1),
        max_memory_mb=section.optional_integer("max_memory_mb", 1),
    )


def check_listed(
    section: Section,
    queues: Sequence[QueueSpec],
    limits: Mapping[str, int],
    process_limits: Mapping[str, int],
    blocking: Sequence[str],
    *,
    rate_limits: Collection[str] = (),
) -> None:
    """A limit or a blocking flag on a queue the capsule does not fetch is a mistake (a
    typo, most likely), unless the capsule is dynamic and fetches what it finds."""
    names = QueueOrder(queues).names
    listed = set(names)  # looked up once per limit: 10,000 queues and their limits, say
    unlisted: list[tuple[KeyPath, str]] = [
        *((("limits", queue), queue) for queue in limits if queue not in listed),
        *((("process_limits", queue), queue) for queue in process_limits if queue not in listed),
        *((("rate_limits", queue), queue) for queue in rate_limits if queue not in listed),
        *(
            (("blocking", index), queue)
            for index, queue in enumerate(blocking)
            if queue not in listed
        ),
    ]
    if not unlisted:
        return
    where, queue = unlisted[0]
    source = _queues_source(section, where)
    raise section.error(
        where,
        f"queue {queue!r} is not in this capsule's queues {names}{source} "
        "(list it there, or set dynamic: true)",
    )


def _queues_source(section: Section, where: KeyPath) -> str:
    """Where the queues came from, when that is not the file blamed for the error: a
    later file that replaced the queues is the likely culprit."""
    layers = section.layers
    queues_file = layers.origins.get((*section.path, "queues"))
    if queues_file is None:
        return " (the default)"
    return "" if queues_file == layers.origin((*section.path, *where)) else f" from {queues_file}"


@contextmanager
def _translated(section: Section) -> Iterator[None]:
    """CapsuleConfig checks its own rules; any that this loader does not check first
    still comes out as a ConfigError naming the file and the capsule."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        raise section.error((), str(exc)) from None


def _replica_wait_as_dict(settings: RedisSettings) -> dict[str, Any]:
    if settings.wait_replicas is None:
        return {}
    return {"wait_replicas": settings.wait_replicas, "wait_timeout": settings.wait_timeout}


def config_as_dict(config: Config) -> dict[str, Any]:
    """The effective configuration as plain data in the files' own schema (every capsule
    spelt out under ``capsules``), for ``limitd check``: loading it back gives the same."""
    return {
        "redis": {
            "url": config.redis.url,
            "pool_size": config.redis.pool_size,
            "socket_timeout": config.redis.socket_timeout,
            "connect_timeout": config.redis.connect_timeout,
            **_replica_wait_as_dict(config.redis),
        },
        "logging": {
            "level": config.logging.level,
            "levels": dict(config.logging.levels),
            "format": config.logging.format,
            "file": config.logging.file,
        },
        **{key: _section_as_dict(key, value) for key, value in config.sections.items()},
        "require": list(config.require),
        "tag": config.tag,
        "capsules": {spec.config.name: capsule_as_dict(spec) for spec in config.capsules},
    }


def _section_as_dict(key: str, settings: Any) -> dict[str, Any]:
    """A feature's section as its feature prints it."""
    owner = next(section for section in sections() if section.key == key)
    return owner.as_dict(settings)


def capsule_as_dict(spec: CapsuleSpec) -> dict[str, Any]:
    capsule = spec.config
    weights = QueueOrder(capsule.queues).weights
    return {
        "queues": [name if weight == 0 else [name, weight] for name, weight in weights.items()],
        "concurrency": capsule.concurrency,
        "async_concurrency": capsule.async_concurrency,
        "async_block_warning": capsule.async_block_warning,
        "async_loop": capsule.async_loop,
        "limits": dict(capsule.limits),
        "process_limits": dict(capsule.process_limits),
        "rate_limits": {
            queue: str(rate) for queue, rate in capsule.limit_settings.rate_limits.items()
        },
        "blocking": list(capsule.blocking),
        "dynamic": capsule.dynamic,
        "processes": spec.processes,
        "max_memory_mb": spec.max_memory_mb,
        "timeout": capsule.timeout,
        "heartbeat_period": capsule.heartbeat_period,
        "poll_range": list(capsule.poll_range),
        "fetch": capsule.fetch,
        "scheduled_poll": capsule.scheduled_poll,
        "ready_index": capsule.ready_index,
        "index_sweep": capsule.index_sweep,
        "cpu_scheduling": capsule.cpu_scheduling,
        "cpu_affinity": "none" if capsule.cpu_affinity is None else capsule.cpu_affinity,
        "tag": capsule.tag,
        "dead": {
            "max_jobs": capsule.dead_set.max_jobs,
            "timeout_days": capsule.dead_set.timeout_seconds / DAY,
        },
        "max_recoveries": capsule.max_recoveries,
        "require": list(capsule.require),
    }
