"""Time limits as a feature: the ``time_limit`` job option, the ``time_limits:`` config
section, and a per-process service that puts the enforcing middleware in the capsule's
chain.

``import limitd`` loads this module and the package only: the error must be importable
and the option declared before any ``@limitd.job``; the section reader, the watchdog
and the middleware are imported when a config is read or a capsule process starts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from limitd import options
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service
from limitd.spec import JobSpec
from limitd.time_limits import TIME_LIMITS_KEYS  # the section's keys, named where it is read

KEY = "time_limits"
__all__ = ["KEY", "TIME_LIMITS", "TIME_LIMITS_KEYS", "metrics", "services"]


options.declare("time_limit", options.seconds, owner="limitd.time_limits")


def _read(section: Any, env: Mapping[str, str]) -> Any:
    from limitd.time_limits.section import read_time_limits

    return read_time_limits(section, env)


def _as_dict(settings: Any) -> dict[str, Any]:
    from limitd.time_limits.section import as_dict

    return as_dict(settings)


def _check_app(config: Any, jobs: Sequence[JobSpec]) -> None:
    from limitd.time_limits.checks import check_time_limit_capsules

    check_time_limit_capsules(config, jobs)


def metrics(redis: Any) -> Iterable[Any]:
    """The time-limit counters' part of ``limitd metrics``."""
    from limitd.time_limits.metrics import time_limit_metrics

    return time_limit_metrics(redis)


def services(context: ProcessContext) -> Sequence[Service]:
    """The watchdog service of a capsule process: it adds the time-limit middleware to
    the chain (a job with no limit is not concerned with it)."""
    from limitd.time_limits.process import TimeLimitService

    return [TimeLimitService(context)]


TIME_LIMITS = Feature(
    name="time_limits",
    section=ConfigSection(KEY, _read, _as_dict),
    check_app=_check_app,
    metrics=metrics,
    process_services=services,
)
