"""Tenant fairness as a feature: its config section, the client middleware given the
section's settings, ``limitd tenants``, and the check that every rule's queue is
fetched. The admin calls are in ``fair_tenant.admin``."""

from limitd.fair_tenant import section
from limitd.fair_tenant.checks import check_fair_tenant_queues
from limitd.fair_tenant.commands import add_tenants_command
from limitd.fair_tenant.metrics import fair_tenant_metrics
from limitd.fair_tenant.middleware import FairTenant
from limitd.plugins import ConfigSection, Feature

FAIR_TENANT = Feature(
    name="fair_tenant",
    section=ConfigSection(section.KEY, section.read_fair_tenant, section.as_dict),
    client_middleware=FairTenant,
    add_commands=add_tenants_command,
    check_app=check_fair_tenant_queues,
    metrics=fair_tenant_metrics,
)
