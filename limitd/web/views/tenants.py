"""Tenants: the busiest tenants of tenant fairness, their enqueues in each rule's
window, the queue their next job would go to, and the jobs rerouted so far.

Read-only, as ``limitd tenants`` is. The rows are ``top_tenants`` (what ``limitd
tenants --json`` prints, three round trips whatever the number of tenants) and the
counters ``reroutes``, with the enqueues sets named as the config's ``fair_tenant``
settings name them (the default client's when the dashboard has no config).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import reroutes, top_tenants
from limitd.fair_tenant.admin import window_label
from limitd.fair_tenant.section import KEY
from limitd.web.rendering import render

ORDER = 80
NAV = ("/tenants", "Tenants")
LISTED = 50  # tenants shown, busiest first
REROUTES_LISTED = 50  # reroute counters shown, largest first


def index(request: Request) -> Response:
    redis = request.app.state.redis
    config = request.app.state.config
    settings = config.section(KEY) if config is not None else None
    tenants = top_tenants(redis, LISTED, settings=settings)
    counters = sorted(reroutes(redis).items(), key=lambda item: (-item[1], item[0]))
    return render(
        request,
        "tenants.html",
        {
            "tenants": tenants,
            "reroutes": counters[:REROUTES_LISTED],
            "reroute_count": len(counters),
            "listed": LISTED,
            "window_label": window_label,
        },
    )


ROUTES = [Route("/tenants", index, name="tenants")]
