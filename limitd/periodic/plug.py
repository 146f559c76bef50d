"""Periodic (cron) jobs as a feature: the ``periodic`` config section, the check that
each entry names a registered job (a limited-capacity one with ``capacity: true``), a
scheduler thread in every capsule process, ``limitd periodic`` and the metrics. The
admin call is ``periodic.admin.periodic_status``.

The section and the check are imported with ``import limitd``; the scheduler, the
command and the metrics when ``limitd start``, the command line or ``limitd metrics``
use them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from limitd.capacity.job import capacity_job
from limitd.config.settings import Config
from limitd.periodic import section
from limitd.periodic.checks import check_periodic_jobs
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service
from limitd.spec import JobSpec

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def periodic_services(context: ProcessContext) -> list[Service]:
    """A scheduler for this process when the config has periodic entries."""
    from limitd.periodic.scheduler import PeriodicScheduler

    settings: section.PeriodicSettings | None = context.section(section.KEY)
    if settings is None or not settings.entries:
        return []
    return [PeriodicScheduler(context.redis, settings.entries)]


def check_periodic(config: Config, jobs: Iterable[JobSpec]) -> None:
    check_periodic_jobs(config, jobs, lambda spec: capacity_job(spec.name) is not None)


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd periodic``."""
    from limitd.periodic.commands import add_periodic_command

    add_periodic_command(subparsers, resolve_redis)


def metrics(redis: Any) -> Iterable[Any]:
    """The entries' last and next runs for ``limitd metrics``."""
    from limitd.periodic.metrics import periodic_metrics

    return periodic_metrics(redis)


PERIODIC = Feature(
    name="periodic",
    section=ConfigSection(section.KEY, section.read_periodic, section.as_dict, list_form=True),
    add_commands=add_commands,
    check_app=check_periodic,
    process_services=periodic_services,
    metrics=metrics,
)
