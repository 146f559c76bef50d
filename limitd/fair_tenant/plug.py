"""Tenant fairness as a feature: its config section, the client middleware given the
section's settings, ``limitd tenants``, and the check that every rule's queue is
fetched. The admin calls are in ``fair_tenant.admin``.

The section, the middleware and the check are imported with ``import limitd``; the
command and the metrics when they are used."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from limitd.fair_tenant import section
from limitd.fair_tenant.checks import check_fair_tenant_queues
from limitd.fair_tenant.middleware import FairTenant
from limitd.plugins import ConfigSection, Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd tenants``."""
    from limitd.fair_tenant.commands import add_tenants_command

    add_tenants_command(subparsers, resolve_redis)


def metrics(redis: Any) -> Iterable[Any]:
    """The rule windows' part of ``limitd metrics``."""
    from limitd.fair_tenant.metrics import fair_tenant_metrics

    return fair_tenant_metrics(redis)


FAIR_TENANT = Feature(
    name="fair_tenant",
    section=ConfigSection(section.KEY, section.read_fair_tenant, section.as_dict),
    client_middleware=FairTenant,
    add_commands=add_commands,
    check_app=check_fair_tenant_queues,
    metrics=metrics,
)
