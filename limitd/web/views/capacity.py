"""Limited capacity: per ``LimitedCapacityJob`` class, the copies running and queued
against ``max_running_jobs``, and the work left as the last refill or copy read it.

Read-only, as ``limitd capacity`` is: the rows are ``capacity`` (what ``limitd capacity
--json`` prints, two round trips whatever the number of classes).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import capacity
from limitd.web.rendering import render

ORDER = 110
NAV = ("/capacity", "Capacity")


def index(request: Request) -> Response:
    return render(request, "capacity.html", {"rows": capacity(request.app.state.redis)})


ROUTES = [Route("/capacity", index, name="capacity")]
