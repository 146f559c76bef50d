"""Fair queues as a feature: the ``fair_queues:`` config section, the client middleware
that stamps each job's tenant, the ``limitd fair`` command, metrics and the housekeeping
that keeps the configured settings in Redis. The fetch's part is in
``limitd/fetch/limit_fetch.lua`` and ``fair_lib.lua``; the admin calls are in
``fair_queues.admin``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from limitd.fair_queues import section
from limitd.plugins import ConfigSection, Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers
    from limitd.plugins import ProcessContext, Service


def client_middleware(_settings: Any) -> Any:
    from limitd.fair_queues.middleware import FairTenantField

    return FairTenantField()


def services(context: ProcessContext) -> list[Service]:
    from limitd.fair_queues.process import ConfiguredFairQueues

    settings = context.section(section.KEY) or {}
    return [ConfiguredFairQueues(context.redis, settings)] if settings else []


def housekeeping(redis: Any) -> None:
    from limitd.fair_queues.process import apply_configured, configured

    if configured:
        apply_configured(redis, configured)


def check_app(config: Any, jobs: Any) -> None:
    from limitd.fair_queues.checks import check_fair_queue_fetch

    check_fair_queue_fetch(config, jobs)


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    from limitd.fair_queues.commands import add_fair_command

    add_fair_command(subparsers, resolve_redis)


def metrics(redis: Any) -> Any:
    from limitd.fair_queues.metrics import fair_queue_metrics

    return fair_queue_metrics(redis)


FAIR_QUEUES = Feature(
    name="fair_queues",
    section=ConfigSection(
        section.KEY, section.read_fair_queues, section.as_dict, list_form=True
    ),
    client_middleware=client_middleware,
    add_commands=add_commands,
    check_app=check_app,
    process_services=services,
    metrics=metrics,
    housekeeping=housekeeping,
)
