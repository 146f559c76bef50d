"""Tenant fairness in ``limitd metrics``: how many jobs its rules rerouted.

``limitd_fair_tenant_reroutes_total{job_class,queue,rule}``: jobs of ``job_class`` that rule number
``rule`` (1-based, in the job's ``fair_tenant_queues`` order) rerouted to ``queue``,
since the counters were created (they are never reset). Read from the reroute counters
(``limitd.fair_tenant.admin.reroutes``) in one round trip, summed over tenants: tenant
ids are unbounded, and one series per tenant would swamp Prometheus; ``limitd tenants``
names the tenants.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from limitd.fair_tenant.admin import reroutes


def fair_tenant_metrics(redis: Any) -> list[Metric]:
    """The reroute counters, summed per job, queue and rule."""
    totals: dict[tuple[str, str, str], int] = {}
    for (job, _tenant, queue, rule), count in reroutes(redis).items():
        key = (job, queue, str(rule))
        totals[key] = totals.get(key, 0) + count
    family = CounterMetricFamily(
        "limitd_fair_tenant_reroutes",
        "Jobs rerouted by a tenant fairness rule (rule: its 1-based place in the job's "
        "fair_tenant_queues), all tenants together.",
        labels=["job_class", "queue", "rule"],
    )
    for (job, queue, number), count in sorted(totals.items()):
        family.add_metric([job, queue, number], count)
    return [family]
