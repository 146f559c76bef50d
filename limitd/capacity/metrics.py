"""The limited-capacity gauges of ``limitd metrics``, labelled by job class.

The names are the ones GitLab's LimitedCapacity::Worker made familiar, with limitd's
prefix: ``limitd_limited_capacity_running_jobs``, ``..._max_running_jobs`` and
``..._remaining_work_count``. Running copies are counted in Redis at each scrape; the
maximum and the work left are what the last refill or copy read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from limitd.capacity.store import read_states

PREFIX = "limitd_limited_capacity_"
LABELS = ["job_class"]


def capacity_metrics(redis: Any) -> Iterator[GaugeMetricFamily]:
    """Three gauge families, in two Redis round trips whatever the number of classes."""
    running = GaugeMetricFamily(
        PREFIX + "running_jobs", "Copies of the job running now.", labels=LABELS
    )
    maximum = GaugeMetricFamily(
        PREFIX + "max_running_jobs", "max_running_jobs() as last read.", labels=LABELS
    )
    remaining = GaugeMetricFamily(
        PREFIX + "remaining_work_count", "remaining_work_count() as last read.", labels=LABELS
    )
    for state in read_states(redis):
        running.add_metric([state.name], state.running)
        if state.max_running_jobs is not None:
            maximum.add_metric([state.name], state.max_running_jobs)
        if state.remaining_work_count is not None:
            remaining.add_metric([state.name], state.remaining_work_count)
    yield from (running, maximum, remaining)
