"""Metrics (Sidekiq 7's page): per job class, the jobs processed and failed over the
last hour or hours, their total and average time, and per class a chart of processed
and failed per minute and a heat map of their durations.

Read-only, from the job history the capsules write when ``job_history.enabled`` is set
(``limitd.api.job_history``, one round trip per page). ``?minutes=`` picks the span.
"""

from __future__ import annotations

import datetime as dt

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import ClassHistory, job_history
from limitd.job_history.admin import bucket_labels
from limitd.web.charts import history_chart
from limitd.web.heatmap import Column, heat_map
from limitd.web.rendering import render

ORDER = 105
NAV = ("/job-metrics", "Metrics")
SPANS = (60, 180, 480)  # minutes the page offers


def index(request: Request) -> Response:
    minutes = _span(request)
    rows = job_history(request.app.state.redis, minutes)
    return render(request, "job_history.html", {"rows": rows, "minutes": minutes, "spans": SPANS})


def detail(request: Request) -> Response:
    minutes = _span(request)
    name = request.path_params["job_class"]
    found = [row for row in job_history(request.app.state.redis, minutes) if row.job_class == name]
    row = found[0] if found else ClassHistory(name, [])
    every = max(1, minutes // 6)
    labels = [_minute_label(minute.start) for minute in row.minutes]
    chart = history_chart(
        [(label, m.processed, m.failed) for label, m in zip(labels, row.minutes, strict=True)],
        title=f"{name}: jobs processed and failed per minute (UTC)",
        chart_id="chart-class",
        label_every=every,
    )
    heat = heat_map(
        [Column(label, m.buckets) for label, m in zip(labels, row.minutes, strict=True)],
        bucket_labels(),
        title=f"{name}: job durations per minute (UTC)",
        chart_id="heat-class",
        label_every=every,
    )
    histogram = [(label, count) for label, count in zip(bucket_labels(), row.buckets, strict=True)]
    context = {
        "row": row,
        "name": name,
        "minutes": minutes,
        "spans": SPANS,
        "chart": chart,
        "heat": heat,
        "histogram": [(label, count) for label, count in histogram if count],
    }
    return render(request, "job_history_class.html", context)


def _span(request: Request) -> int:
    """``?minutes=`` when it is one of :data:`SPANS`; the first otherwise."""
    asked = request.query_params.get("minutes", "")
    return int(asked) if asked.isdigit() and int(asked) in SPANS else SPANS[0]


def _minute_label(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%H:%M")


ROUTES = [
    Route("/job-metrics", index, name="job_history"),
    Route("/job-metrics/{job_class:path}", detail, name="job_history_class"),
]
