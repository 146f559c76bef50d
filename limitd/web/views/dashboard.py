"""The home page: the cluster at a glance (Sidekiq's dashboard). Counters, set sizes and
busy threads as cards, the Redis server's version, memory and clients, and processed /
failed jobs over the last hour (per minute) and the last 30 days (per day) as charts
drawn on the server (``limitd.web.charts``), so each live refresh redraws them.

Every figure is read through ``limitd.api``: the same numbers the CLI's ``--json`` and
``limitd metrics`` show.
"""

from __future__ import annotations

import datetime as dt

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import Processes, Stats
from limitd.api.stats import daily_history, minute_history, redis_info
from limitd.web.charts import history_chart
from limitd.web.rendering import render

ORDER = 10
NAV = ("/", "Dashboard")
HOUR_MINUTES = 60
MONTH_DAYS = 30


def index(request: Request) -> Response:
    redis = request.app.state.redis
    processes = Processes(redis)
    return render(
        request,
        "dashboard.html",
        {
            "stats": Stats(redis),
            "busy": processes.busy,
            "threads": processes.concurrency,
            "processes": len(processes),
            "server": redis_info(redis),
            "hour_chart": history_chart(
                [
                    (_minute_label(start), done, bad)
                    for start, done, bad in minute_history(redis, HOUR_MINUTES)
                ],
                title="Jobs processed and failed per minute, last hour (UTC)",
                chart_id="chart-hour",
                label_every=10,
            ),
            "month_chart": history_chart(
                [(day[5:], done, bad) for day, done, bad in daily_history(redis, MONTH_DAYS)],
                title="Jobs processed and failed per day, last 30 days (UTC)",
                chart_id="chart-month",
                label_every=5,
            ),
        },
    )


def _minute_label(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%H:%M")


ROUTES = [Route("/", index, name="dashboard")]
