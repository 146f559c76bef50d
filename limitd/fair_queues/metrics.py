"""Fair queues in ``limitd metrics``, per fair queue (no tenant label: tenant ids are
unbounded; ``limitd fair status`` names the largest):

- ``limitd_fair_queue_jobs_waiting{queue}``: jobs in its tenants' lines;
- ``limitd_fair_queue_tenants_waiting{queue}``: tenants with jobs waiting;
- ``limitd_fair_queue_largest_tenant_jobs{queue}``: the largest tenant's backlog, so a
  dashboard sees one tenant crowding the others without naming it.

One round trip per fair queue after one to list them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from limitd.fair_queues.store import fair_queues, status


def fair_queue_metrics(redis: Any) -> list[Metric]:
    jobs = GaugeMetricFamily(
        "limitd_fair_queue_jobs_waiting",
        "Jobs waiting in a fair queue's tenant lines.",
        labels=["queue"],
    )
    tenants = GaugeMetricFamily(
        "limitd_fair_queue_tenants_waiting",
        "Tenants with jobs waiting in a fair queue.",
        labels=["queue"],
    )
    largest = GaugeMetricFamily(
        "limitd_fair_queue_largest_tenant_jobs",
        "Jobs waiting for the tenant with the most of them, in a fair queue.",
        labels=["queue"],
    )
    for queue in sorted(fair_queues(redis)):
        found = status(redis, queue, top=1)
        if found is None:
            continue
        jobs.add_metric([queue], found.jobs_waiting)
        tenants.add_metric([queue], found.tenants_waiting)
        largest.add_metric([queue], found.largest[0].waiting if found.largest else 0)
    return [jobs, tenants, largest]
