"""Periodic: each cron entry with its zone and job, its last run (jid, time) and its
next run, in the entry's time zone.

Read-only, as ``limitd periodic`` is. The dashboard is given no config, so the entries
are those the running schedulers recorded in Redis when they started: what ``limitd
periodic --json`` prints without ``-C`` (``periodic_status``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd import clock
from limitd.api import periodic_status
from limitd.periodic.commands import local_time
from limitd.web.rendering import render

ORDER = 100
NAV = ("/periodic", "Periodic")


def index(request: Request) -> Response:
    now = clock.now()
    statuses = periodic_status(request.app.state.redis, now=now)
    return render(
        request, "periodic.html", {"entries": statuses, "now": now, "local_time": local_time}
    )


ROUTES = [Route("/periodic", index, name="periodic")]
