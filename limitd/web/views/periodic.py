"""Periodic: each cron entry with its zone and job, its last run (jid, time) and its
next run, in the entry's time zone.

Read-only, as ``limitd periodic`` is, and with the same entries: the config's, when the
dashboard was given one (``limitd web conf/app.yml``), else those the running schedulers
recorded in Redis when they started (``periodic_status``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd import clock
from limitd.api import periodic_status
from limitd.periodic.admin import local_time
from limitd.periodic.section import KEY
from limitd.web.rendering import render

ORDER = 100
NAV = ("/periodic", "Periodic")


def index(request: Request) -> Response:
    now = clock.now()
    config = request.app.state.config
    settings = config.section(KEY) if config is not None else None
    entries = list(settings.entries) if settings is not None else None
    statuses = periodic_status(request.app.state.redis, entries, now=now)
    return render(
        request, "periodic.html", {"entries": statuses, "now": now, "local_time": local_time}
    )


ROUTES = [Route("/periodic", index, name="periodic")]
