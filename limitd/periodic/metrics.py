"""The periodic entries' part of ``limitd metrics`` (``Feature.metrics``): when each
entry last ran and when it runs next, by entry name.

The hook is given only Redis, so the entries are those the schedulers recorded when they
started (``limitd:periodic:names`` and each entry's hash). Two round trips whatever the
number of entries: the names, then every record in one pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from limitd.periodic.admin import periodic_status


def periodic_metrics(redis: Any) -> Iterator[GaugeMetricFamily]:
    """``limitd_periodic_last_run_timestamp_seconds{name}`` (entries that ran) and
    ``limitd_periodic_next_run_timestamp_seconds{name}``."""
    last = GaugeMetricFamily(
        "limitd_periodic_last_run_timestamp_seconds",
        "When the periodic entry's job was last enqueued (epoch seconds).",
        labels=["name"],
    )
    upcoming = GaugeMetricFamily(
        "limitd_periodic_next_run_timestamp_seconds",
        "The periodic entry's next tick (epoch seconds).",
        labels=["name"],
    )
    for status in periodic_status(redis):
        if status.last_run_at is not None:
            last.add_metric([status.name], status.last_run_at)
        upcoming.add_metric([status.name], status.next_run)
    yield last
    yield upcoming
