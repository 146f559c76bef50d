"""Validated, typed settings: what the rest of limitd reads (``schema`` fills them from
the files; code may build them directly, e.g. ``CapsuleConfig`` for a capsule run from
Python)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from limitd.connection.replication import DEFAULT_TIMEOUT as DEFAULT_WAIT_TIMEOUT
from limitd.connection.replication import ReplicaWait
from limitd.queues.limits import LimitSettings, check_limit
from limitd.queues.order import QueueOrder, QueueSpec
from limitd.queues.rates import Rate, parse_rate
from limitd.retry import DeadSetPolicy, DeathHandler

FETCHES = ("limit", "basic")
SCHEDULED_POLLS = ("due", "interval")  # see supervisor/poller.py
CPU_SCHEDULINGS = ("batch", "normal")  # see supervisor/cpu_scheduling.py
ASYNC_LOOPS = ("asyncio", "uvloop")  # see supervisor/async_lane.py


@dataclass
class CapsuleConfig:
    """Settings of one capsule: its queues and threads, limits, and timings.

    ``fetch="limit"`` (the default) is the limit-aware, reliable fetch; ``"basic"`` is
    Sidekiq's plain BRPOP (no limits, jobs lost on SIGKILL), kept for comparison.
    ``capsule_id`` is set by a supervisor that vouches for the capsule; otherwise each
    capsule gets a random one. ``record_period`` is how often the Sidekiq process record
    (``busy``, running jobs) is rewritten, 5 s as in Sidekiq, however long
    ``heartbeat_period`` (liveness and reaping) is; tests shorten it."""

    name: str = "default"
    queues: Sequence[QueueSpec] = ("default",)
    concurrency: int = 10
    # Async jobs in flight at once on the capsule's event loop; None: 100 when the app
    # defines async jobs, else no loop at all (see ``limitd.supervisor.async_lane``).
    async_concurrency: int | None = None
    async_block_warning: float = 1.0  # warn when an async job holds the loop this long
    async_loop: str = "asyncio"  # the event loop's implementation (ASYNC_LOOPS)
    timeout: float = 25.0
    require: Sequence[str] = ()
    tag: str = ""
    limits: Mapping[str, int] = field(default_factory=dict)
    process_limits: Mapping[str, int] = field(default_factory=dict)
    rate_limits: Mapping[str, Rate | str] = field(default_factory=dict)  # "100/minute"
    blocking: Sequence[str] = ()
    dynamic: bool = False
    fetch: str = "limit"
    heartbeat_period: float = 15.0
    record_period: float = 5.0
    poll_range: tuple[float, float] = (0.4, 0.5)
    dead_set: DeadSetPolicy = field(default_factory=DeadSetPolicy)
    death_handlers: Sequence[DeathHandler] = ()
    max_recoveries: int = 3  # crashes charged to a job before it is dead (fetch/recoveries.py)
    poll_interval_average: float | None = None
    average_scheduled_poll_interval: float = 5.0
    scheduled_poll: str = "due"  # "interval": Sidekiq's blind polling, for comparison
    # The limit fetch looks only at queues that may have work (limitd.fetch.ready_index),
    # and re-checks index_sweep listed queues a second for pushes that do not publish.
    ready_index: bool = True
    index_sweep: float = 50.0
    # The kernel policy of a capsule process's threads (limitd.supervisor.cpu_scheduling).
    cpu_scheduling: str = "batch"
    # CPUs each capsule process keeps its threads on: a number, "auto" (one CPU while it
    # is the process's own), or None: where the kernel puts them
    # (limitd.supervisor.cpu_affinity).
    cpu_affinity: int | str | None = "auto"
    capsule_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Which of the supervisor's children runs this (0, 1, ...), kept across restarts: a
    # per-process port is the configured one plus this number.
    process_number: int = 0
    # How many children the supervisor runs, every capsule's (cpu_affinity: auto).
    process_count: int = 1

    def __post_init__(self) -> None:
        where = f"capsule {self.name}"
        if not _is_count(self.concurrency):
            raise ValueError(
                f"{where}: concurrency must be an integer >= 1, got {self.concurrency!r}"
            )
        self._check_async(where)
        if self.timeout < 0:
            raise ValueError(f"{where}: timeout must be >= 0 seconds")
        self._check_choices(where)
        if self.cpu_affinity not in (None, "auto") and not _is_count(self.cpu_affinity):
            raise ValueError(
                f"{where}: cpu_affinity must be an integer >= 1 (CPUs per capsule process), "
                f"'auto' or None, got {self.cpu_affinity!r}"
            )
        if self.heartbeat_period <= 0:
            raise ValueError(f"{where}: heartbeat_period must be > 0 seconds")
        if isinstance(self.max_recoveries, bool) or not isinstance(self.max_recoveries, int):
            raise ValueError(f"{where}: max_recoveries must be an integer >= 1")
        if self.max_recoveries < 1:
            raise ValueError(f"{where}: max_recoveries must be an integer >= 1")
        if self.record_period <= 0:
            raise ValueError(f"{where}: record_period must be > 0 seconds")
        low, high = self.poll_range
        if not 0 < low <= high:
            raise ValueError(f"{where}: poll_range must be two seconds values, 0 < low <= high")
        self._check_limits(where)

    def _check_choices(self, where: str) -> None:
        for key, choices in (
            ("fetch", FETCHES),
            ("scheduled_poll", SCHEDULED_POLLS),
            ("cpu_scheduling", CPU_SCHEDULINGS),
            ("async_loop", ASYNC_LOOPS),
        ):
            if getattr(self, key) not in choices:
                raise ValueError(
                    f"{where}: {key} must be one of {choices}, got {getattr(self, key)!r}"
                )

    def _check_async(self, where: str) -> None:
        if self.async_concurrency is not None and not _is_count(self.async_concurrency):
            raise ValueError(
                f"{where}: async_concurrency must be an integer >= 1, "
                f"got {self.async_concurrency!r}"
            )
        if self.async_block_warning <= 0:
            raise ValueError(f"{where}: async_block_warning must be > 0 seconds")

    def _check_limits(self, where: str) -> None:
        listed = set(QueueOrder(self.queues).names)
        for kind, values in (("limits", self.limits), ("process_limits", self.process_limits)):
            for queue, value in values.items():
                check_limit(value, f"{where}: {kind}.{queue}")
                self._check_listed(where, f"{kind}.{queue}", queue, listed)
        for queue, rate in self.rate_limits.items():
            try:
                parse_rate(rate)
            except ValueError as exc:
                raise ValueError(f"{where}: rate_limits.{queue}: {exc}") from None
            self._check_listed(where, f"rate_limits.{queue}", queue, listed)
        unknown = set(self.blocking) - listed
        if unknown and not self.dynamic:  # a dynamic capsule may block on a found queue
            raise ValueError(
                f"{where}: blocking queues {sorted(unknown)} are not in this "
                f"capsule's queues {sorted(listed)}"
            )

    def _check_listed(self, where: str, key: str, queue: str, listed: set[str]) -> None:
        if queue not in listed and not self.dynamic:
            raise ValueError(
                f"{where}: {key}: queue {queue!r} is not in this capsule's queues {sorted(listed)}"
            )

    @property
    def limit_settings(self) -> LimitSettings:
        rates = {queue: parse_rate(rate) for queue, rate in self.rate_limits.items()}
        return LimitSettings(dict(self.limits), dict(self.process_limits), rates)


@dataclass(frozen=True)
class RedisSettings:
    """Where Redis is. ``url`` None means: ``LIMITD_REDIS_URL`` / ``REDIS_URL`` if set,
    else the embedded redis-server that ``limitd start`` runs beside the config."""

    url: str | None = None
    pool_size: int | None = None
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    wait_replicas: int | None = None  # see limitd.replication
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT

    @property
    def replica_wait(self) -> ReplicaWait | None:
        if self.wait_replicas is None:
            return None
        return ReplicaWait(self.wait_replicas, self.wait_timeout)


@dataclass(frozen=True)
class LoggingSettings:
    """``level`` is the root logger's; ``levels`` sets single loggers (``limitd.fetch``,
    ``app.noisy``) above or below it. ``format`` is ``text`` or ``json`` (one object per
    line, see ``limitd.logs``)."""

    level: str = "INFO"
    file: str | None = None  # None: standard error; reopened on SIGHUP
    format: str = "text"
    levels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class CapsuleSpec:
    """A capsule as the supervisor runs it: its settings, how many processes run it,
    and the memory above which a process is recycled."""

    config: CapsuleConfig
    processes: int = 1
    max_memory_mb: int | None = None


@dataclass
class Config:
    """The effective configuration of ``limitd start``: every file merged, the
    environment interpolated, everything checked."""

    files: list[str] = field(default_factory=list)
    redis: RedisSettings = field(default_factory=RedisSettings)
    require: list[str] = field(default_factory=list)
    tag: str = ""
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    capsules: list[CapsuleSpec] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)  # features' own, by key
    base_dir: str = "."  # directory of the first file: the embedded Redis lives here

    def section(self, key: str) -> Any:
        """The settings of a feature's section (``fair_tenant``), as its feature read
        them; None when this config was not loaded from files (built in code)."""
        return self.sections.get(key)


class ConfigError(ValueError):
    """A configuration mistake, said in one line: file, key path, what was expected."""

    def __init__(self, file: str, key: str, message: str) -> None:
        super().__init__(f"{file}: {key}: {message}" if key else f"{file}: {message}")
        self.file = file
        self.key = key
        self.message = message


def _is_count(value: object) -> bool:
    """An int >= 1 (a bool is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
