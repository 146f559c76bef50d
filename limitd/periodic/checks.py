"""Checks of the ``periodic`` entries against the app's jobs, run by ``limitd check`` and
``limitd start`` once the app is imported (see ``Feature.check_app``): an entry naming
no registered job would fail at every tick, long after the deploy."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from limitd.config.app_checks import NO_FILE
from limitd.config.settings import Config, ConfigError
from limitd.periodic.section import KEY, PeriodicEntry, PeriodicSettings
from limitd.spec import JobSpec

IsCapacityJob = Callable[[JobSpec], bool]


def resolve_job(name: str, jobs: Iterable[JobSpec]) -> JobSpec | None:
    """The job an entry names: by wire name first, else by dotted path (``origin``)."""
    known = list(jobs)
    by_name = next((spec for spec in known if spec.name == name), None)
    return by_name or next((spec for spec in known if spec.origin == name), None)


def check_periodic_jobs(
    config: Config, jobs: Iterable[JobSpec], is_capacity_job: IsCapacityJob
) -> None:
    """Every entry names a registered job, and one with ``capacity: true`` a limited-
    capacity job (``is_capacity_job`` tells, from a layer that may know the class)."""
    settings: PeriodicSettings | None = config.section(KEY)
    if settings is None:
        return
    known = list(jobs)
    for entry in settings.entries:
        spec = resolve_job(entry.job, known)
        if spec is None:
            raise _error(config, entry, "job", _unknown(entry, known))
        if entry.capacity and not is_capacity_job(spec):
            raise _error(
                config,
                entry,
                "capacity",
                f"capacity: true needs a LimitedCapacityJob, but {spec.name} is not one "
                "(or set capacity: false to call perform_async)",
            )


def _unknown(entry: PeriodicEntry, known: list[JobSpec]) -> str:
    names = ", ".join(spec.name for spec in known[:10]) or "none"
    return (
        f"job {entry.job!r} is not a registered job (by wire name or dotted path); "
        f"registered: {names}{' ...' if len(known) > 10 else ''}"
    )


def _error(config: Config, entry: PeriodicEntry, key: str, message: str) -> ConfigError:
    """Named by the file and key path the entry was read from."""
    source = entry.source or ", ".join(config.files) or NO_FILE
    return ConfigError(source, f"{entry.path}.{key}", message)
