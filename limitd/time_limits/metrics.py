"""Time limits in ``limitd metrics``: how many jobs were stopped at their limit.

``limitd_time_limit_exceeded_total{job_class,how}``: ``how`` is ``interrupted`` (a sync
job's thread got ``TimeLimitExceeded``), ``cancelled`` (an async job) or ``recycled`` (a
sync job still running ``grace`` seconds past its limit: its process was recycled).
Read from one hash in one round trip; never reset."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from limitd.time_limits.middleware import counts_key


def time_limit_metrics(redis: Any) -> list[Metric]:
    family = CounterMetricFamily(
        "limitd_time_limit_exceeded",
        "Jobs stopped at their time limit, by how: interrupted (sync), cancelled (async), "
        "recycled (sync, stuck past the grace: its process was recycled).",
        labels=["job_class", "how"],
    )
    for field, count in sorted(redis.hgetall(counts_key(redis)).items()):
        job_class, _, how = (field.decode() if isinstance(field, bytes) else field).rpartition("|")
        family.add_metric([job_class, how], int(count))
    return [family]
