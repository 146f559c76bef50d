"""Limiters: every limiter used within its ttl, with its kind and limit, how full it
is now, and its counters (calls, at once, after waiting, over the limit).

Read-only, as ``limitd limiters`` is. The rows are ``limiters`` (what ``limitd
limiters --json`` prints); "in use" is ``limiter_usage``, one more round trip.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import limiter_usage, limiters
from limitd.fair_tenant.admin import window_label
from limitd.web.rendering import render

ORDER = 90
NAV = ("/limiters", "Limiters")

USAGE_WORDS = {
    "concurrent": "holding a slot",
    "bucket": "calls this interval",
    "window": "calls in the window",
    "leaky": "level",
}


def usage_text(value: float) -> str:
    """Whole counts as they are; a leaky bucket's draining level to one decimal."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def index(request: Request) -> Response:
    redis = request.app.state.redis
    statuses = limiters(redis)
    used = limiter_usage(redis, statuses)
    rows = [(status, usage_text(used[status.name])) for status in statuses]
    return render(
        request,
        "limiters.html",
        {"rows": rows, "words": USAGE_WORDS, "interval": window_label},
    )


ROUTES = [Route("/limiters", index, name="limiters")]
