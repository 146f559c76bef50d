"""The limited-capacity gauges of ``limitd metrics``.

Each figure is served under two names with the same value. limitd's own,
``limitd_limited_capacity_running_jobs``, ``..._max_running_jobs`` and
``..._remaining_work_count`` labelled ``job_class``; and the names GitLab's
LimitedCapacity::Worker gave them, ``limited_capacity_worker_running_jobs``,
``..._max_running_jobs`` and ``..._remaining_work_count`` labelled ``worker``, so that
dashboards and alerts written for that worker keep working unchanged. Running copies
are counted in Redis at each scrape; the maximum and the work left are what the last
refill or copy read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from limitd.capacity.store import read_states


@dataclass(frozen=True)
class Naming:
    """One spelling of the three gauges: a name prefix and the job's label."""

    prefix: str
    label: str


LIMITD = Naming("limitd_limited_capacity_", "job_class")
GITLAB = Naming("limited_capacity_worker_", "worker")
NAMINGS = (LIMITD, GITLAB)

HELP = {
    "running_jobs": "Copies of the job running now.",
    "max_running_jobs": "max_running_jobs() as last read.",
    "remaining_work_count": "remaining_work_count() as last read.",
}


def capacity_metrics(redis: Any) -> Iterator[GaugeMetricFamily]:
    """Three gauge families per naming, in two Redis round trips whatever the number of
    classes."""
    states = read_states(redis)
    for naming in NAMINGS:
        families = {
            figure: GaugeMetricFamily(naming.prefix + figure, text, labels=[naming.label])
            for figure, text in HELP.items()
        }
        for state in states:
            figures = {
                "running_jobs": state.running,
                "max_running_jobs": state.max_running_jobs,
                "remaining_work_count": state.remaining_work_count,
            }
            for figure, value in figures.items():
                if value is not None:
                    families[figure].add_metric([state.name], value)
        yield from families.values()
